"""SCAFFOLD recipe (Karimireddy et al., ICML 2020): NVFlare's ``PTScaffoldHelper`` at the sites, the global
control at the server. ``paper`` profile: FedAvg's (none of our papers reports SCAFFOLD)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES
from fedseg.strategies.scaffold import ScaffoldOptions


class ScaffoldRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's ``weighting`` of models and controls
    (:class:`ScaffoldOptions`)."""

    strategy_options = JobOptions(ScaffoldOptions)

    def __init__(self, *, name: str = "scaffold", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="scaffold", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
