"""Locate and parse the MONAI bundle that defines the network, transforms, loss and optimiser.

The bundle (``bundles/unet2d_seg``) is the single source of these components: the federated engine,
the bundle's own ``train.json`` / ``evaluate.json`` / ``inference.json`` and the CLI all parse it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional

from monai.bundle import ConfigParser

DEFAULT_BUNDLE = "unet2d_seg"
BUNDLE_ENV = "FEDSEG_BUNDLE_DIR"


def default_bundle_dir(name: str = DEFAULT_BUNDLE) -> Path:
    """``$FEDSEG_BUNDLE_DIR`` if set, else ``bundles/<name>`` of the source checkout this package runs from."""
    if os.environ.get(BUNDLE_ENV):
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
    "channels",
    "dropout",
    "norm",
    "feature_alignment",
    "lambda_dice",
    "lambda_ce",
    "optimizer_name",
    "learning_rate",
    "weight_decay",
    "adam_betas",
    "batch_size",
    "augment",
    "augment_level",
    "seed",
    # native resolution (patch mode) and sliding-window inference
    "spatial_mode",
    "patch_size",
    "patch_samples",
    "patch_pos",
    "patch_neg",
    "rescale",
    "sw_batch_size",
    "sw_overlap",
    "sw_blend_mode",
)


def build_network(train_config: Optional[Dict[str, Any]] = None, bundle_dir: Optional[os.PathLike] = None):
    """A fresh instance of the bundle's ``network_def`` with the job's overrides (on the CPU)."""
    return load_bundle(bundle_dir, train_config).get_parsed_content("network_def", instantiate=True, lazy=False)


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
