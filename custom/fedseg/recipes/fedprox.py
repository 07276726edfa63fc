"""FedProx recipe (Li et al., MLSys 2020): FedAvg aggregation, proximal term at the sites.

``mu = 0`` is FedAvg (same code path), so ``fedseg bench --methods fedavg prox0=fedprox:mu=0`` is an ablation
row. The ``paper`` profile is FedAvg's (the GraphFedSeg comparison setting; FedProx is a row of four of our
five papers' tables, each in its own setting).
"""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.fedprox import FedProxOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES
from fedseg.strategies.fedavg import FedAvgOptions


class FedProxRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the objective's ``mu`` (:class:`FedProxOptions`); FedAvg's
    sample-weighted average at the server."""

    strategy_options = JobOptions(FedAvgOptions, names=(), fixed={"weighting": "samples"})
    objective_options = JobOptions(FedProxOptions)

    def __init__(self, *, name: str = "fedprox", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="fedprox", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
