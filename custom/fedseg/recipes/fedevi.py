"""FedEvi recipe (Chen et al., MICCAI 2024): evidential training + evidential weight aggregation.

Two tasks per round: ``train`` and ``evaluate_surrogate`` (each site returns two or three scalars).
"""

from __future__ import annotations

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.fedevi import FedEviSiteOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.strategies.fedevi import FedEviOptions

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
    """Keywords besides the shared job/train options: every option of the strategy (:class:`FedEviOptions`: ``delta``,
    ``weight_form``, ``beta0``, ``clip``, ``use_gap``, ``use_reliability``, ``accumulate``) and the objective's
    (:class:`FedEviSiteOptions`) but ``eps``; docs/methods.md, FedEvi. ``surrogate_windows`` is site-side only (the
    server strategy does not read it); ``uncertainty_grid`` / ``clamp_epistemic`` None = the profile's (``paper``:
    "network", False, as the reference code; else the defaults "image", True).
    """

    strategy_options = JobOptions(FedEviOptions)
    objective_options = JobOptions(FedEviSiteOptions, names=("kl_weight", "anneal_rounds", "dice_form",
                                                              "surrogate_windows", "uncertainty_grid", "clamp_epistemic"))

    def __init__(self, *, name: str = "fedevi", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        args = self.method_args(options, PAPER_OBJECTIVE_ARGS.get(profile))
        super().__init__(name=name, method="fedevi", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
