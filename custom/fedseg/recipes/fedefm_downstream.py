"""FedEFM phase 2: federated fine-tuning of a MONAI UNETR (``bundles/unetr_seg``) whose ViT encoder starts
from a foundation checkpoint, with FedAvg across the downstream sites (the same engine and strategy as
every segmentation job). The issue's comparison is three runs of this job:

==================  ==========================================================
scratch             ``foundation_ckpt=None`` (UNETR initialised at random)
FedAvg-init         ``foundation_ckpt=<FL_global_model.pt of fedefm overseas=false>``
FedEFM-init         ``foundation_ckpt=<FL_global_model.pt of fedefm>``
==================  ==========================================================

e.g. ``fedseg bench --methods scratch=fedefm_downstream fedefm_init=fedefm_downstream:foundation_ckpt=/abs/FL_global_model.pt``.
The server loads the checkpoint into the initial global model (the encoder tensors, checked against the
foundation ViT by ``tests/test_bundle_unetr.py``); sites receive the weights and never need the file.
The ViT size of the UNETR must be the foundation's (``vit_profile``, ``image_size`` = the ViT's input size).
Built-in data: catheter/guidewire segmentation on synthetic X-ray sites (family ``xray``) phase 1 never saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from fedseg.bundle import refuse_user_bundle
from fedseg.method_options import JobOptions
from fedseg.recipes.base import FedSegRecipe
from fedseg.strategies.fedavg import FedAvgOptions

DOWNSTREAM_DEFAULTS = {
    "task": "segmentation",
    "bundle": "unetr_seg",
    "data_family": "xray",
    # the foundation was trained on 3-channel images (grey frames are repeated to 3 channels)
    "in_channels": 3,
    # the tiny foundation ViT's input size: the UNETR's patch grid and position embeddings must match it
    "image_size": 96,
    "patch_size": 96,
    "learning_rate": 1e-4,
    "eval_metrics": ["dice", "iou", "miou", "hd95", "assd"],
}

PAPER_PROFILES = {
    # ViT-B/16 at 224 px, like the paper's foundation; schedule ours (the paper states none)
    "paper": {
        "num_rounds": 50,
        "train_config": {"data_profile": "paper", "vit_profile": "paper", "image_size": 224, "patch_size": 224,
                         "batch_size": 8, "local_epochs": 1},
    }
}


class FedEFMDownstreamRecipe(FedSegRecipe):
    """Keywords besides the shared job/train options: the strategy's ``weighting`` (:class:`FedAvgOptions`), and

        foundation_ckpt: absolute path of a phase-1 ``FL_global_model.pt`` (None: from scratch).
        partial_depth: accept a foundation with fewer than UNETR's 12 blocks (the ``tiny`` ViT has 4): its
            blocks fill the first ones, the rest start at random (``bundles/unetr_seg`` docs).
    """

    strategy_options = JobOptions(FedAvgOptions, names=("weighting",))

    def __init__(self, *, name: str = "fedefm_downstream", profile: str = "default", num_rounds: Optional[int] = None,
                 foundation_ckpt: Optional[str] = None, partial_depth: bool = True, **options: Any):
        for key, value in DOWNSTREAM_DEFAULTS.items():
            options.setdefault(key, value)
        if foundation_ckpt:
            path = Path(foundation_ckpt)
            if not path.is_absolute() or not path.is_file():
                raise FileNotFoundError(f"foundation_ckpt must be an existing absolute path, got {foundation_ckpt!r}")
            options["foundation_ckpt"] = str(path)
        options["partial_depth"] = bool(partial_depth)
        refuse_user_bundle(options, "FedEFM's downstream fine-tunes the UNETR of bundles/unetr_seg from the foundation's ViT encoder; another bundle's network has no such encoder")
        args = self.method_args(options)
        super().__init__(name=name, method="fedefm_downstream", **args, profile=profile, profiles=PAPER_PROFILES,
                         num_rounds=num_rounds, **options)

    def check_train_config(self, train_config: Dict[str, Any]) -> None:
        if int(train_config.get("spatial_dims") or 2) == 3:
            # the foundation is a 2-D ViT over 2-D patches; a 3-D UNETR (or slices through this 2-D one) is not offered
            raise ValueError("FedEFM's downstream UNETR is 2-D only: it fine-tunes a 2-D foundation ViT; volumes are refused")
