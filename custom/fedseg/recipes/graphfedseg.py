"""GraphFedSeg recipe (Du et al., Acta Electronica Sinica 2026): uncertainty-aware collaboration
graph (one QP per client, cvxpy) and dual-layer aggregation. The project's headline job.

Profiles: ``default`` (and ``tiny``) run the paper's equations; ``paper`` runs the authors' public code
(``graph+double.py``): its local protocol (``PAPER_PROFILES``: their three-convolution U-Net, Adam 5e-4 with
betas (0.9, 0.99) and weight decay 1e-5, batch 4 with the last incomplete batch dropped, 2 local epochs, one
random-axis flip, each image / its maximum, Dice on the raw logits, local-model and largest-component scoring) and
its method (``PAPER_METHOD_ARGS``: last round's graph in the aggregation, cosines against the new global model,
alpha 1/0.7, p proportional to n / U with no U penalty, the top-3 similarity term, U over the training batches).
docs/methods.md, GraphFedSeg, lists each difference; a keyword given to the recipe overrides the profile's value.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

from fedseg.uncertainty.window_sample import check_window_count
from fedseg.objectives.graphfedseg import DEFAULT_UNCERTAINTY_WINDOWS
from fedseg.recipes.base import FedSegRecipe

# the authors' code's local protocol: 4 polyp sites, their U-Net, 250 rounds, 384 x 384 (their prepared data)
PAPER_PROFILES = {
    "paper": {
        "num_rounds": 250,
        "train_config": {
            "data_family": "polyp",
            "data_profile": "paper",
            "image_size": 384,
            "network_variant": "three_conv_nearest",
            "optimizer_name": "Adam",
            "learning_rate": 5e-4,
            "adam_betas": [0.9, 0.99],
            "weight_decay": 1e-5,
            # their ExponentialLR is built but never stepped
            "lr_decay_per_round": 1.0,
            "optimizer_state": "keep",
            "batch_size": 4,
            "drop_last": True,
            "local_epochs": 2,
            "augment_level": "flip",
            "intensity": "image_max",
            "seg_loss": "logit_dice",
            "lambda_dice": 1.0,
            "lambda_ce": 0.0,
            # they score each site's locally trained model, after largest-component post-processing, and keep each
            # site's best round on its test split; the test split never chooses a model here (docs/methods.md)
            "eval_local_models": True,
            "eval_largest_component": True,
            "eval_best_val_round": False,
        },
    }
}

#: the method as the suite implements the paper (every profile but ``paper``)
METHOD_ARGS = {
    "alpha": None,
    "gamma": 0.4,
    "lam": 0.2,
    "lambda1": 0.01,
    "similarity": "update",
    "similarity_snap": None,
    "prior": "samples",
    "graph_in_aggregation": "current",
    "initial_graph": "uniform",
    "regulariser": "paper",
    "top_k": 3,
    "uncertainty_pass": "after_training",
    "uncertainty_loss_weight": 0.0,
}
#: the method as the authors' code runs it (``paper`` profile); their QP is 0.7 ||w||^2 - 2 * 0.7 p.w - cos.w
PAPER_METHOD_ARGS = {
    "paper": {
        "alpha": 1.0 / 0.7,
        "gamma": 0.0,
        "similarity": "update_global",
        "similarity_snap": 0.9,
        "prior": "samples_over_uncertainty",
        "graph_in_aggregation": "previous",
        "initial_graph": "uniform_others",
        "regulariser": "top_k",
        "uncertainty_pass": "training_batches",
        "uncertainty_loss_weight": 0.4,
    }
}

#: dropout used for MC-dropout uncertainty when the job does not set one (with 0 every sample agrees)
MC_DROPOUT_DEFAULT_RATE = 0.2


def method_args(profile: str, **given: Any) -> Dict[str, Any]:
    """The method's options under ``profile``: :data:`METHOD_ARGS`, the profile's (:data:`PAPER_METHOD_ARGS`),
    then every keyword in ``given`` that is not None (``alpha=None`` keeps the profile's alpha, 0.08 K by default)."""
    args = {**METHOD_ARGS, **PAPER_METHOD_ARGS.get(profile, {})}
    unknown = set(given) - set(args)
    if unknown:
        raise ValueError(f"unknown GraphFedSeg options {sorted(unknown)}; known: {sorted(args)}")
    args.update({k: v for k, v in given.items() if v is not None})
    return args


class GraphFedSegRecipe(FedSegRecipe):
    """Args (besides the shared job/train options); None = the profile's value (module docstring):
        alpha: similarity weight in the QP; None = 0.08 * K (the value used is written to report.json).
        gamma: uncertainty penalty in the QP.
        lam: weight of the sample-weighted base model in theta_global (dual-layer aggregation).
        lambda1: weight of the client similarity regulariser (0 disables it).
        similarity: "update" (theta - theta_round0), "weights" (raw parameters) or "update_global"
            (theta - this round's new theta_global; needs graph_in_aggregation="previous").
        similarity_snap: cosines above it count as 1 (the authors' code: 0.9).
        prior: the QP's target, "samples" (n / sum n) or "samples_over_uncertainty" (n / U, renormalised).
        graph_in_aggregation: "current" (this round's W) or "previous" (last round's W).
        initial_graph: "uniform" (1/K) or "uniform_others" (1/(K-1) off the diagonal).
        regulariser: "paper" (Eq. 5) or "top_k" (the authors' code's term over the ``top_k`` largest entries).
        solver: "cvxpy" (default; cross-checked against the closed form every round) or "closed_form".
        uncertainty: "evidential" (C / S) or "mc_dropout" (``mc_samples`` stochastic passes).
        uncertainty_pass: "after_training" (an extra forward pass over the training images with the trained
            model), "last_epoch" (evidential only: the last local epoch's training logits, no extra pass) or
            "training_batches" (evidential only: the mean over every training batch; see docs/methods.md).
        uncertainty_loss_weight: weight of the authors' constant ``log(1 + u^2)`` in the loss (no gradient).
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
        gamma: Optional[float] = None,
        lam: Optional[float] = None,
        lambda1: Optional[float] = None,
        similarity: Optional[str] = None,
        similarity_snap: Optional[float] = None,
        prior: Optional[str] = None,
        graph_in_aggregation: Optional[str] = None,
        initial_graph: Optional[str] = None,
        regulariser: Optional[str] = None,
        top_k: Optional[int] = None,
        solver: str = "cvxpy",
        uncertainty: str = "evidential",
        mc_samples: int = 5,
        uncertainty_pass: Optional[str] = None,
        uncertainty_loss_weight: Optional[float] = None,
        uncertainty_windows: Union[int, str, None] = DEFAULT_UNCERTAINTY_WINDOWS,
        **options: Any,
    ):
        if uncertainty == "mc_dropout" and not options.get("dropout"):
            options["dropout"] = MC_DROPOUT_DEFAULT_RATE
        args = method_args(profile, alpha=alpha, gamma=gamma, lam=lam, lambda1=lambda1, similarity=similarity,
                           similarity_snap=similarity_snap, prior=prior, graph_in_aggregation=graph_in_aggregation,
                           initial_graph=initial_graph, regulariser=regulariser, top_k=top_k,
                           uncertainty_pass=uncertainty_pass, uncertainty_loss_weight=uncertainty_loss_weight)
        if uncertainty == "mc_dropout" and uncertainty_pass is None:
            args["uncertainty_pass"] = "after_training"  # MC-dropout has no pass to read off training
        objective_keys = ("uncertainty_pass", "uncertainty_loss_weight")
        super().__init__(
            name=name,
            method="graphfedseg",
            strategy_args={
                **{k: v for k, v in args.items() if k != "uncertainty_loss_weight"},
                "solver": solver,
                "uncertainty": uncertainty,
                "mc_samples": mc_samples,
            },
            objective_args={
                "uncertainty": uncertainty,
                "mc_samples": mc_samples,
                **{k: args[k] for k in objective_keys},
                "uncertainty_windows": check_window_count(uncertainty_windows, "uncertainty_windows"),
            },
            profile=profile,
            profiles=PAPER_PROFILES,
            num_rounds=num_rounds,
            **options,
        )
