"""SCAFFOLD recipe (Karimireddy et al., ICML 2020): NVFlare's ``PTScaffoldHelper`` at the sites, the global
control at the server. ``paper`` profile: FedAvg's (none of our papers reports SCAFFOLD)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES


class ScaffoldRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): weighting of models and controls ("samples" or "uniform")."""

    def __init__(self, *, name: str = "scaffold", profile: str = "default", num_rounds: Optional[int] = None,
                 weighting: str = "samples", **options: Any):
        super().__init__(
            name=name, method="scaffold", strategy_args={"weighting": weighting}, objective_args={},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
