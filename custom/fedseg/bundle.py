"""Locate and parse the MONAI bundle that defines the network, transforms, loss and optimiser.

The bundle (``bundles/unet2d_seg``) is the single source of these components: the federated engine,
the bundle's own ``train.json`` / ``evaluate.json`` / ``inference.json`` and the CLI all parse it.
Classification jobs (``train_config["task"] == "classification"``, FedEFM phase 1) use
``bundles/vit_foundation`` instead (:func:`bundle_for_task`); the downstream UNETR is ``bundles/unetr_seg``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional

from monai.bundle import ConfigParser

DEFAULT_BUNDLE = "unet2d_seg"
#: the bundle of each task when none is named
TASK_BUNDLES = {"segmentation": DEFAULT_BUNDLE, "classification": "vit_foundation"}
#: the segmentation bundle of volume jobs (spatial_dims 3: 3-D patches or slices)
VOLUME_BUNDLE = "volume_seg"
BUNDLE_ENV = "FEDSEG_BUNDLE_DIR"


def default_bundle_dir(name: str = DEFAULT_BUNDLE) -> Path:
    """``$FEDSEG_BUNDLE_DIR`` if set (it names the segmentation bundle, ``unet2d_seg``'s replacement), else
    ``bundles/<name>`` of the source checkout this package runs from."""
    if name == DEFAULT_BUNDLE and os.environ.get(BUNDLE_ENV):
        return Path(os.environ[BUNDLE_ENV])
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "bundles" / name
        if (candidate / "configs" / "train.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"MONAI bundle {name!r} not found next to {here}; set {BUNDLE_ENV} to the bundle folder"
    )


# train_config keys that map onto bundle variables (job config -> bundle)
BUNDLE_KEYS = (
    "image_size",
    "in_channels",
    "num_classes",
    "labels",
    "regions",
    "label_values",
    "channels",
    "network_variant",
    "network_init",
    "dropout",
    "norm",
    "feature_alignment",
    "seg_loss",
    "lambda_dice",
    "lambda_ce",
    "optimizer_name",
    "learning_rate",
    "weight_decay",
    "adam_betas",
    "batch_size",
    "augment",
    "augment_level",
    "intensity",
    "seed",
    # native resolution (patch mode) and sliding-window inference
    "spatial_mode",
    "patch_size",
    "patch_samples",
    "patch_pos",
    "patch_neg",
    "patch_sampler",
    "patch_ratios",
    "rescale",
    "sw_batch_size",
    "sw_overlap",
    "sw_blend_mode",
    # volumes (bundles/volume_seg)
    "spatial_dims",
    "slice_axis",
    "target_spacing",
    "orientation",
    "modality",
    "intensity_window",
    "image_channels",
    "volume_network",
    # classification ViT (bundles/vit_foundation)
    "vit_profile",
    "vit_image_size",
    # downstream UNETR (bundles/unetr_seg)
    "foundation_ckpt",
    "partial_depth",
)


def bundle_for_task(train_config: Optional[Dict[str, Any]] = None) -> Path:
    """``train_config["bundle"]`` if named, else the default bundle folder of ``train_config["task"]``
    (segmentation when unset): ``unet2d_seg`` for images, ``volume_seg`` for volumes (``spatial_dims`` 3)."""
    if (train_config or {}).get("bundle"):
        return default_bundle_dir(train_config["bundle"])
    task = (train_config or {}).get("task") or "segmentation"
    if task not in TASK_BUNDLES:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASK_BUNDLES)}")
    if task == "segmentation" and int((train_config or {}).get("spatial_dims") or 2) == 3:
        return default_bundle_dir(VOLUME_BUNDLE)
    return default_bundle_dir(TASK_BUNDLES[task])


def build_network(train_config: Optional[Dict[str, Any]] = None, bundle_dir: Optional[os.PathLike] = None):
    """A fresh instance of the bundle's ``network_def`` with the job's overrides (on the CPU). Without
    ``bundle_dir`` the task's bundle (:func:`bundle_for_task`): the ViT classifier for classification."""
    return load_bundle(bundle_dir or bundle_for_task(train_config), train_config).get_parsed_content("network_def", instantiate=True, lazy=False)


def load_bundle(
    bundle_dir: Optional[os.PathLike] = None, overrides: Optional[Dict[str, Any]] = None, config: str = "train.json"
) -> ConfigParser:
    """Parse ``<bundle>/configs/<config>`` with ``overrides`` applied to top-level bundle variables."""
    root = Path(bundle_dir) if bundle_dir else default_bundle_dir()
    parser = ConfigParser()
    parser.read_config(str(root / "configs" / config))
    parser["bundle_root"] = str(root)
    for key, value in (overrides or {}).items():
        if key in BUNDLE_KEYS and value is not None:
            parser[key] = list(value) if isinstance(value, tuple) else value
    return parser
