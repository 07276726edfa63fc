"""Ditto recipe (Li et al., ICML 2021): FedAvg's global model plus a personal model per site, regularised
toward the global one (NVFlare's ``PTDittoHelper``). ``paper`` profile: FedAvg's (the GraphFedSeg comparison,
whose table reports Ditto)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES


class DittoRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): ditto_lambda (0.1), personal_epochs (None: local_epochs)."""

    def __init__(self, *, name: str = "ditto", profile: str = "default", num_rounds: Optional[int] = None,
                 ditto_lambda: float = 0.1, personal_epochs: Optional[int] = None, **options: Any):
        if options.get("dp_target_epsilon") is not None:
            raise ValueError("Ditto does not support differential privacy (dp_target_epsilon)")
        super().__init__(
            name=name, method="ditto", strategy_args={"weighting": "samples"},
            objective_args={"ditto_lambda": ditto_lambda, "personal_epochs": personal_epochs},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
