"""FedDyn recipe (Acar et al., ICLR 2021): dynamic regulariser at the sites, corrected average at the server
(one ``alpha`` for both). ``paper`` profile: FVAC's (the FVAC table reports FedDyn on vessels)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fvac import PAPER_PROFILES


class FedDynRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): alpha (0.01)."""

    def __init__(self, *, name: str = "feddyn", profile: str = "default", num_rounds: Optional[int] = None,
                 alpha: float = 0.01, **options: Any):
        super().__init__(
            name=name, method="feddyn", strategy_args={"alpha": alpha}, objective_args={"alpha": alpha},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
