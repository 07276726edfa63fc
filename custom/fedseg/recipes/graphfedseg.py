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

from typing import Any, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.graphfedseg import GraphFedSegSiteOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.strategies.graphfedseg import GraphFedSegOptions

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


class GraphFedSegRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: every option of the strategy (:class:`GraphFedSegOptions`: the
    graph's ``alpha`` (None: 0.08 K, the value used is written to report.json), ``gamma``, ``lam``, ``lambda1``,
    ``similarity``, ``similarity_snap``, ``prior``, ``graph_in_aggregation``, ``initial_graph``, ``regulariser``,
    ``top_k``, ``solver``; the estimator's ``uncertainty``, ``mc_samples``, ``uncertainty_pass``, which the sites take
    too) and of the objective (:class:`GraphFedSegSiteOptions`: ``uncertainty_loss_weight``, the authors' constant
    ``log(1 + u^2)`` in the loss; ``uncertainty_windows``, site-side only: in patch mode the after-training pass
    measures U_i on this many patch-size windows of the training images, ``"whole_image"`` slides the window over every
    whole training image, several times the cost of local training; docs/methods.md).

    The ``paper`` profile's values (:data:`PAPER_METHOD_ARGS`) replace the defaults; a keyword given overrides both,
    and a keyword given as None keeps the profile's value (module docstring). ``uncertainty="mc_dropout"`` measures U
    after training (it has no pass to read off training) and trains with dropout (:data:`MC_DROPOUT_DEFAULT_RATE`)
    unless the job sets one.
    """

    strategy_options = JobOptions(GraphFedSegOptions)
    objective_options = JobOptions(GraphFedSegSiteOptions)

    def __init__(self, *, name: str = "graphfedseg", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        profile_values = dict(PAPER_METHOD_ARGS.get(profile, {}))
        if options.get("uncertainty") == "mc_dropout":
            profile_values["uncertainty_pass"] = "after_training"  # MC-dropout has no pass to read off training
            if not options.get("dropout"):
                options["dropout"] = MC_DROPOUT_DEFAULT_RATE
        args = self.method_args(options, profile_values)
        super().__init__(name=name, method="graphfedseg", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)
