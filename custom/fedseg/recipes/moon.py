"""MOON recipe (Li, He and Song, CVPR 2021): model-contrastive loss on the pooled U-Net bottleneck, FedAvg
aggregation. ``paper`` profile: FVAC's (the FVAC table reports MOON on vessels)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fvac import PAPER_PROFILES


class MOONRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): mu (1.0), temperature (0.5), representation ("bottleneck")."""

    def __init__(self, *, name: str = "moon", profile: str = "default", num_rounds: Optional[int] = None,
                 mu: float = 1.0, temperature: float = 0.5, representation: str = "bottleneck", **options: Any):
        super().__init__(
            name=name, method="moon", strategy_args={"weighting": "samples"},
            objective_args={"mu": mu, "temperature": temperature, "representation": representation},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
