"""FedRep recipe (Collins et al., ICML 2021): shared body, local head (``head``: FeatureUNet's 1x1
classifier by default, or its last decoder block plus the classifier). ``paper`` profile: FedAvg's (the
GraphFedSeg comparison, whose table reports FedRep)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.fedrep import FedRepSiteOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES
from fedseg.strategies.local_layers import FedRepOptions


class FedRepRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: ``head`` (both halves: :class:`FedRepOptions`) and
    ``head_epochs`` (:class:`FedRepSiteOptions`)."""

    strategy_options = JobOptions(FedRepOptions, names=("head",))
    objective_options = JobOptions(FedRepSiteOptions)
    supports_dp = False

    def __init__(self, *, name: str = "fedrep", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="fedrep", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
