"""FedDyn recipe (Acar et al., ICLR 2021): dynamic regulariser at the sites, corrected average at the server
(one ``alpha`` for both). ``paper`` profile: FVAC's (the FVAC table reports FedDyn on vessels)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.feddyn import FedDynOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fvac import PAPER_PROFILES


class FedDynRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: ``alpha`` (:class:`FedDynOptions`, both halves)."""

    strategy_options = JobOptions(FedDynOptions)
    objective_options = JobOptions(FedDynOptions)

    def __init__(self, *, name: str = "feddyn", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options)
        super().__init__(name=name, method="feddyn", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
