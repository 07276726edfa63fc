"""FedCE recipe (Jiang et al., CVPR 2023): contribution-estimated aggregation by NVFlare's
``FedCEModelAggregator`` / ``PTFedCEHelper``. ``paper`` profile: FedEvi's (the FedEvi table reports FedCE)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedevi import PAPER_PROFILES


class FedCERecipe(FedSegRecipe):
    """Args (besides the shared job/train options): mode ("plus" or "times"), epsilon (1e-6)."""

    def __init__(self, *, name: str = "fedce", profile: str = "default", num_rounds: Optional[int] = None,
                 mode: str = "plus", epsilon: float = 1e-6, **options: Any):
        super().__init__(
            name=name, method="fedce", strategy_args={"mode": mode, "epsilon": epsilon}, objective_args={},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
