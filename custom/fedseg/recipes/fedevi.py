"""FedEvi recipe (Chen et al., MICCAI 2024): evidential training + evidential weight aggregation.

Two tasks per round: ``train`` and ``evaluate_surrogate`` (each site returns two or three scalars).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from fedseg.uncertainty.window_sample import check_window_count
from fedseg.objectives.fedevi import DEFAULT_SURROGATE_WINDOWS
from fedseg.recipes.base import FedSegRecipe

# the authors' local training protocol, read off their public code (spec: shared/methods/fedevi.md; the ablation
# of each difference from the suite's default: docs/results/fedevi-protocol.md). Their FedAvg trains with a
# Dice-only loss (lambda_ce 0); FedEvi replaces the bundle's loss with its evidential one, so the key matters only
# to the methods it is compared with (fedseg bench --profile paper gives every method this protocol).
PAPER_PROFILES = {
    "paper": {
        "num_rounds": 200,
        "train_config": {
            "data_profile": "paper",
            "image_size": 384,
            "network_variant": "three_conv_nearest",
            "optimizer_name": "Adam",
            "learning_rate": 1e-3,
            "adam_betas": [0.9, 0.99],
            "weight_decay": 1e-5,
            "lr_decay_per_round": 0.99,
            "batch_size": 8,
            "drop_last": True,
            "local_epochs": 2,
            "augment_level": "flip",
            "intensity": "image_max",
            "lambda_dice": 1.0,
            "lambda_ce": 0.0,
            "eval_largest_component": True,
            "eval_best_val_round": True,
        },
    }
}
#: the surrogate task as the reference code computes it (uncertainties on the network's grid, epistemic unclamped)
PAPER_OBJECTIVE_ARGS = {"paper": {"uncertainty_grid": "network", "clamp_epistemic": False}}


class FedEviRecipe(FedSegRecipe):
    """Args (besides the shared job/train options): the strategy's ``delta``, ``weight_form``, ``beta0``,
    ``clip``, ``use_gap``, ``use_reliability``, ``accumulate`` and the objective's ``kl_weight``, ``anneal_rounds``,
    ``dice_form`` (docs/methods.md, FedEvi), and

        surrogate_windows: at native resolution (patch mode), the surrogate task computes G, A and R_paper
            on this many patch-size windows of the validation images, drawn at each site per round
            (default ``DEFAULT_SURROGATE_WINDOWS``); ``"whole_image"`` (or None) evaluates both models on
            every whole validation image (docs/methods.md). Site-side only: the server strategy does not
            read it.
        uncertainty_grid / clamp_epistemic: where the surrogate task measures whole-image uncertainties
            ("image" or "network") and whether the pixel epistemic uncertainty is clamped at 0; None = the
            profile's (``paper``: "network", False, as the reference code; else "image", True).
    """

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
        accumulate: bool = True,
        kl_weight: float = 0.01,
        anneal_rounds: int = 10,
        dice_form: str = "dice",
        surrogate_windows: Union[int, str, None] = DEFAULT_SURROGATE_WINDOWS,
        uncertainty_grid: Optional[str] = None,
        clamp_epistemic: Optional[bool] = None,
        **options: Any,
    ):
        surrogate = {"uncertainty_grid": "image", "clamp_epistemic": True, **PAPER_OBJECTIVE_ARGS.get(profile, {})}
        if uncertainty_grid is not None:
            surrogate["uncertainty_grid"] = uncertainty_grid
        if clamp_epistemic is not None:
            surrogate["clamp_epistemic"] = bool(clamp_epistemic)
        super().__init__(
            name=name,
            method="fedevi",
            strategy_args={
                "delta": delta,
                "weight_form": weight_form,
                "beta0": beta0,
                "clip": clip,
                "use_gap": use_gap,
                "use_reliability": use_reliability,
                "accumulate": accumulate,
            },
            objective_args={
                "kl_weight": kl_weight,
                "anneal_rounds": anneal_rounds,
                "dice_form": dice_form,
                "surrogate_windows": check_window_count(surrogate_windows, "surrogate_windows"),
                **surrogate,
            },
            profile=profile,
            profiles=PAPER_PROFILES,
            num_rounds=num_rounds,
            **options,
        )
