"""GraphFedSeg recipe (Du et al., Acta Electronica Sinica 2026): uncertainty-aware collaboration
graph (one QP per client, cvxpy) and dual-layer aggregation. The project's headline job."""

from __future__ import annotations

from typing import Any, Optional, Union

from fedseg.config import resolve_profile
from fedseg.uncertainty.window_sample import check_window_count
from fedseg.objectives.graphfedseg import DEFAULT_UNCERTAINTY_WINDOWS
from fedseg.recipes.base import FedSegRecipe, split_options

# the paper's setting: 4 polyp sites, U-Net, Adam 5e-4, batch 4, E = 2, 250 rounds, 384 x 384
PAPER_PROFILES = {
    "paper": {
        "num_rounds": 250,
        "train_config": {
            "data_family": "polyp",
            "data_profile": "paper",
            "image_size": 384,
            "optimizer_name": "Adam",
            "learning_rate": 5e-4,
            "batch_size": 4,
            "local_epochs": 2,
        },
    }
}

#: dropout used for MC-dropout uncertainty when the job does not set one (with 0 every sample agrees)
MC_DROPOUT_DEFAULT_RATE = 0.2


class GraphFedSegRecipe(FedSegRecipe):
    """Args (besides the shared job/train options):
        alpha: similarity weight in the QP; None = 0.08 * K (the value used is written to report.json).
        gamma: uncertainty penalty in the QP.
        lam: weight of the sample-weighted base model in theta_global (dual-layer aggregation).
        lambda1: weight of the client similarity regulariser (0 disables it).
        similarity: "update" (theta - theta_round0, default) or "weights" (raw parameters).
        solver: "cvxpy" (default; cross-checked against the closed form every round) or "closed_form".
        uncertainty: "evidential" (C / S) or "mc_dropout" (``mc_samples`` stochastic passes).
        uncertainty_pass: "after_training" (default: an extra forward pass over the training images with
            the trained model) or "last_epoch" (evidential only: U from the last local epoch's training
            logits, no extra pass; see docs/methods.md).
        uncertainty_windows: at native resolution (patch mode), the after-training pass measures U_i on
            this many patch-size windows of the training images, drawn at each site per round (default
            ``DEFAULT_UNCERTAINTY_WINDOWS``); ``"whole_image"`` (or None) slides the window over every whole
            training image, several times the cost of local training (docs/methods.md). Site-side only:
            the server strategy does not read it.
    """

    def __init__(
        self,
        *,
        name: str = "graphfedseg",
        profile: str = "default",
        num_rounds: Optional[int] = None,
        alpha: Optional[float] = None,
        gamma: float = 0.4,
        lam: float = 0.2,
        lambda1: float = 0.01,
        similarity: str = "update",
        solver: str = "cvxpy",
        uncertainty: str = "evidential",
        mc_samples: int = 5,
        uncertainty_pass: str = "after_training",
        uncertainty_windows: Union[int, str, None] = DEFAULT_UNCERTAINTY_WINDOWS,
        **options: Any,
    ):
        job_options, train_overrides = split_options(options)
        if uncertainty == "mc_dropout" and not train_overrides.get("dropout"):
            train_overrides["dropout"] = MC_DROPOUT_DEFAULT_RATE
        resolved = resolve_profile(profile, PAPER_PROFILES, num_rounds, **train_overrides)
        super().__init__(
            name=name,
            method="graphfedseg",
            strategy="graphfedseg",
            strategy_args={
                "alpha": alpha,
                "gamma": gamma,
                "lam": lam,
                "lambda1": lambda1,
                "similarity": similarity,
                "solver": solver,
                "uncertainty": uncertainty,
                "mc_samples": mc_samples,
                "uncertainty_pass": uncertainty_pass,
            },
            objective="graphfedseg",
            objective_args={
                "uncertainty": uncertainty,
                "mc_samples": mc_samples,
                "uncertainty_pass": uncertainty_pass,
                "uncertainty_windows": check_window_count(uncertainty_windows, "uncertainty_windows"),
            },
            num_rounds=resolved["num_rounds"],
            train_config=resolved["train_config"],
            **job_options,
        )
