"""SCAFFOLD recipe (Karimireddy et al., ICML 2020): NVFlare's ``PTScaffoldHelper`` at the sites, the global
control at the server. ``paper`` profile: FedAvg's (none of our papers reports SCAFFOLD)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.config import resolve_profile
from fedseg.recipes.base import FedSegRecipe, split_options
from fedseg.recipes.fedavg import PAPER_PROFILES


class ScaffoldRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): weighting of models and controls ("samples" or "uniform")."""

    def __init__(self, *, name: str = "scaffold", profile: str = "default", num_rounds: Optional[int] = None,
                 weighting: str = "samples", **options: Any):
        job_options, train_overrides = split_options(options)
        resolved = resolve_profile(profile, PAPER_PROFILES, num_rounds, **train_overrides)
        super().__init__(
            name=name, method="scaffold", strategy="scaffold", strategy_args={"weighting": weighting},
            objective="scaffold", objective_args={},
            num_rounds=resolved["num_rounds"], train_config=resolved["train_config"], **job_options,
        )
