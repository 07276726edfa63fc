"""PathFL recipe (Medical Image Analysis 2025): CSE + AFA on the client, SSA on the server, each switchable
(the paper's 8-way ablation is ``use_cse`` x ``use_afa`` x ``use_ssa``). Built-in data: the nuclei family."""

from __future__ import annotations

from typing import Any, Dict, Optional

from fedseg.method_options import JobOptions
from fedseg.objectives.pathfl import PathFLSiteOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.strategies.pathfl import PathFLOptions

PAPER_PROFILES = {
    "paper": {
        # U-Net (~1.9 M parameters), plain cross-entropy, Adam 1e-4 (0.9, 0.95), batch 4, E = 5, 60 rounds
        "num_rounds": 60,
        "train_config": {
            "data_family": "nuclei",
            "data_profile": "paper",
            "lambda_dice": 0.0,
            "lambda_ce": 1.0,
            "optimizer_name": "Adam",
            "learning_rate": 1e-4,
            "adam_betas": [0.9, 0.95],
            "batch_size": 4,
            "local_epochs": 5,
            "patch_size": 256,
        },
    }
}


def check_two_dimensional(train_config: Dict[str, Any]) -> None:
    """PathFL is 2-D: its style statistics restyle 2-D images, its SSA noise batches are 2-D images the server runs
    through every site's model. Volumes train in slice mode (a 2-D network on the slices) or not at all.

    Raises:
        ValueError: a 3-D network (``spatial_dims`` 3 without ``spatial_mode`` "slices").
    """
    from fedseg.bundle import is_bundle_path

    if is_bundle_path(train_config.get("bundle")):
        return  # a user's network is read through hooks in 2-D and 3-D alike (style mixing: half-space masks)
    if int(train_config.get("spatial_dims") or 2) == 3 and train_config.get("spatial_mode") != "slices":
        raise ValueError("PathFL is 2-D only (style mixing, feature alignment and SSA's noise batches are defined on 2-D "
                         "images): run volumes with spatial_mode='slices'")


class PathFLRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's (:class:`PathFLOptions`: ``use_cse``, ``use_afa``,
    ``use_ssa``, ``weighting``, ``afa_at_inference``) and the objective's (:class:`PathFLSiteOptions`) but
    ``keep_examples``: ``ssa_noise_batch``, ``ssa_noise_size``, ``cse_statistics`` (docs/methods.md, PathFL).
    The segmentation loss is the bundle's (Dice + CE) in the ``default`` profile, so that a comparison
    with FedAvg at the same settings isolates the method; the ``paper`` profile uses plain CE.
    """

    strategy_options = JobOptions(PathFLOptions)
    objective_options = JobOptions(PathFLSiteOptions, names=("use_cse", "use_afa", "use_ssa", "ssa_noise_batch",
                                                             "ssa_noise_size", "cse_statistics"))

    def __init__(self, *, name: str = "pathfl", profile: str = "default", num_rounds: Optional[int] = None,
                 **options: Any):
        options.setdefault("data_family", "nuclei")
        args = self.method_args(options)
        # the alignment layer exists only when AFA is on, so AFA-off runs train FedAvg's exact network
        options["feature_alignment"] = args["strategy_args"]["use_afa"]
        super().__init__(name=name, method="pathfl", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)

    def check_train_config(self, train_config: Dict[str, Any]) -> None:
        check_two_dimensional(train_config)
