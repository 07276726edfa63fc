"""FedProx recipe (Li et al., MLSys 2020): FedAvg aggregation, proximal term at the sites.

``mu = 0`` is FedAvg (same code path), so ``fedseg bench --methods fedavg prox0=fedprox:mu=0`` is an ablation
row. The ``paper`` profile is FedAvg's (the GraphFedSeg comparison setting; FedProx is a row of four of our
five papers' tables, each in its own setting).
"""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES


class FedProxRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): mu, the proximal weight (default 0.01, NVFlare's)."""

    def __init__(self, *, name: str = "fedprox", profile: str = "default", num_rounds: Optional[int] = None,
                 mu: float = 0.01, **options: Any):
        super().__init__(
            name=name, method="fedprox", strategy_args={"weighting": "samples"}, objective_args={"mu": mu},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
