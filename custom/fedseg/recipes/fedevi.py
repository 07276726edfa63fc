"""FedEvi recipe (Chen et al., MICCAI 2024): evidential training + evidential weight aggregation.

Two tasks per round: ``train`` and ``evaluate_surrogate`` (each site returns two or three scalars).
"""

from __future__ import annotations

from typing import Any, Optional

from fedseg.config import resolve_profile
from fedseg.recipes.base import FedSegRecipe, split_options

# reference code defaults (spec: shared/methods/fedevi.md)
PAPER_PROFILES = {
    "paper": {
        "num_rounds": 200,
        "train_config": {
            "data_profile": "paper",
            "image_size": 384,
            "optimizer_name": "Adam",
            "learning_rate": 1e-3,
            "adam_betas": [0.9, 0.99],
            "weight_decay": 1e-5,
            "lr_decay_per_round": 0.99,
            "batch_size": 8,
            "local_epochs": 2,
        },
    }
}


class FedEviRecipe(FedSegRecipe):
    def __init__(
        self,
        *,
        name: str = "fedevi",
        profile: str = "default",
        num_rounds: Optional[int] = None,
        delta: float = 1.0,
        weight_form: str = "code",
        beta0: str = "samples",
        clip: float = 1e-3,
        use_gap: bool = True,
        use_reliability: bool = True,
        kl_weight: float = 0.01,
        anneal_rounds: int = 10,
        dice_form: str = "dice",
        **options: Any,
    ):
        job_options, train_overrides = split_options(options)
        resolved = resolve_profile(profile, PAPER_PROFILES, num_rounds, **train_overrides)
        super().__init__(
            name=name,
            method="fedevi",
            strategy="fedevi",
            strategy_args={
                "delta": delta,
                "weight_form": weight_form,
                "beta0": beta0,
                "clip": clip,
                "use_gap": use_gap,
                "use_reliability": use_reliability,
            },
            objective="fedevi",
            objective_args={"kl_weight": kl_weight, "anneal_rounds": anneal_rounds, "dice_form": dice_form},
            num_rounds=resolved["num_rounds"],
            train_config=resolved["train_config"],
            **job_options,
        )
