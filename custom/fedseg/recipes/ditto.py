"""Ditto recipe (Li et al., ICML 2021): FedAvg's global model plus a personal model per site, regularised
toward the global one (NVFlare's ``PTDittoHelper``). ``paper`` profile: FedAvg's (the GraphFedSeg comparison,
whose table reports Ditto)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.ditto import DittoOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES
from fedseg.strategies.fedavg import FedAvgOptions


class DittoRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the objective's (:class:`DittoOptions`: ``ditto_lambda``,
    ``personal_epochs``); FedAvg's sample-weighted average of the global models at the server."""

    strategy_options = JobOptions(FedAvgOptions, names=(), fixed={"weighting": "samples"})
    objective_options = JobOptions(DittoOptions)
    supports_dp = False

    def __init__(self, *, name: str = "ditto", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="ditto", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
