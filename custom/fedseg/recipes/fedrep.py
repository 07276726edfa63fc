"""FedRep recipe (Collins et al., ICML 2021): shared body, local head (``head``: FeatureUNet's 1x1
classifier by default, or its last decoder block plus the classifier). ``paper`` profile: FedAvg's (the
GraphFedSeg comparison, whose table reports FedRep)."""

from __future__ import annotations

from typing import Any, Optional

from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.fedavg import PAPER_PROFILES


class FedRepRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): head ("conv1x1" or "last_block"), head_epochs (1)."""

    def __init__(self, *, name: str = "fedrep", profile: str = "default", num_rounds: Optional[int] = None,
                 head: str = "conv1x1", head_epochs: int = 1, **options: Any):
        if options.get("dp_target_epsilon") is not None:
            raise ValueError("FedRep does not support differential privacy (dp_target_epsilon)")
        super().__init__(
            name=name, method="fedrep", strategy_args={"head": head},
            objective_args={"head": head, "head_epochs": head_epochs},
            profile=profile, profiles=PAPER_PROFILES, num_rounds=num_rounds, **options,
        )
