"""Spatial mode of a site: how images reach the network and how predictions come back to the image's size.

Two modes (``train_config["spatial_mode"]``, or the datalist's top-level ``"spatial_mode"`` when the
config leaves it ``None``):

* ``resize`` — every image is resized to ``image_size`` x ``image_size`` for training; fine for large
  blob-like structures (polyps) and quick tests.
* ``patch`` — native resolution: training on random ``patch_size`` patches (MONAI
  ``RandCropByPosNegLabeld``, ``patch_samples`` per image, positive/negative centre ratio
  ``patch_pos``:``patch_neg``), optionally after one fixed ``rescale`` factor per data set (stated in
  the datalist or the config, never guessed per image). Images smaller than a patch are zero-padded
  (label 0) to the patch size before cropping — never cropped to nothing.

In both modes validation, test and inference run on the whole image (MONAI ``SlidingWindowInferer``
in patch mode, one forward pass of the resized image in resize mode); the class scores are then
interpolated back to the image's own size and every metric is computed there, against the mask as
stored on disk (see :mod:`fedseg.metrics.segmentation`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence

import torch
from monai.inferers import SlidingWindowInferer
from torch import nn

logger = logging.getLogger(__name__)

SPATIAL_MODES = ("resize", "patch")


def resolve_spatial_settings(train_config: Mapping[str, Any], datalist: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
    """``{"spatial_mode", "rescale"}`` for one site: the config's value where set, else the datalist's
    top-level field, else ``resize`` / ``1.0``.

    Raises:
        ValueError: unknown mode, or a rescale factor that is not a positive number.
    """
    mode = train_config.get("spatial_mode") or datalist.get("spatial_mode") or "resize"
    if mode not in SPATIAL_MODES:
        raise ValueError(f"spatial_mode {mode!r} {where}: expected one of {SPATIAL_MODES}")
    rescale = train_config.get("rescale")
    if rescale is None:
        rescale = datalist.get("rescale", 1.0)
    try:
        rescale = float(rescale)
    except (TypeError, ValueError):
        raise ValueError(f"rescale {rescale!r} {where}: expected a positive number") from None
    if not rescale > 0:
        raise ValueError(f"rescale {rescale!r} {where}: expected a positive number")
    if mode == "resize" and rescale != 1.0:
        logger.warning("rescale %s %s is ignored in resize mode (images are resized to image_size)", rescale, where)
    return {"spatial_mode": mode, "rescale": rescale}


def check_patch_size(train_config: Mapping[str, Any], levels: int) -> None:
    """The patch (or resized image) must pass through every pooling level of the U-Net, and keep more
    than one pixel at the bottleneck (instance norm needs two)."""
    factor = 2 ** (levels - 1)
    key = "patch_size" if train_config.get("spatial_mode") == "patch" else "image_size"
    size = int(train_config[key])
    if size % factor or size < 2 * factor:
        raise ValueError(f"{key} {size} must be a multiple of {factor} and at least {2 * factor} for a {levels}-level U-Net")


class WholeImagePredictor:
    """Class scores of whole images: ``(B, C_in, h, w) -> (B, num_classes, h, w)``.

    Patch mode slides a ``patch_size`` window (``sw_overlap``, ``sw_blend_mode`` Gaussian or constant
    blending, ``sw_batch_size`` windows per forward pass); images smaller than the window are padded and
    the result is cropped back by MONAI. Resize mode is one forward pass.
    """

    def __init__(self, train_config: Mapping[str, Any]):
        self.mode = train_config.get("spatial_mode", "resize")
        self.inferer: Optional[SlidingWindowInferer] = None
        if self.mode == "patch":
            size = int(train_config["patch_size"])
            self.inferer = SlidingWindowInferer(
                roi_size=(size, size),
                sw_batch_size=int(train_config.get("sw_batch_size", 4)),
                overlap=float(train_config.get("sw_overlap", 0.25)),
                mode=str(train_config.get("sw_blend_mode", "gaussian")),
                progress=False,
            )

    def __call__(self, model: nn.Module, inputs: torch.Tensor, with_features: bool = False):
        """Logits, or ``(logits, features)`` with ``with_features`` (resize mode only: features of a whole
        image at native resolution would have to be stitched from windows at each feature's own scale,
        which MONAI's inferer does not do reliably; methods take features from training patches)."""
        if self.inferer is None:
            return model.forward_features(inputs) if with_features else model(inputs)
        if with_features:
            raise ValueError("whole-image features are not available in patch mode; use features of training patches")
        return self.inferer(inputs, model)


def pixel_spacing(entry: Mapping[str, Any], datalist: Mapping[str, Any]) -> Optional[Sequence[float]]:
    """Pixel spacing in mm ``(row, column)`` of a datalist entry (``"spacing"``) or of the whole data
    set (top-level ``"spacing"``); ``None`` when unknown. A scalar means square pixels."""
    value = entry.get("spacing", datalist.get("spacing"))
    if value is None:
        return None
    values = [float(value)] * 2 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 2 or not all(v > 0 for v in values):
        raise ValueError(f"spacing {value!r} of {entry.get('image')}: expected one or two positive numbers (mm per pixel)")
    return values


def tensor_spacing(spacing: Optional[Sequence[float]], image_path: str) -> Optional[Sequence[float]]:
    """``spacing`` (``(row, column)`` mm, :func:`pixel_spacing`) in the order of the axes of the tensors the
    bundle's loader gives for ``image_path``: MONAI's PIL reader indexes raster images ``(x, y)``, i.e.
    ``(W, H)`` = ``(column, row)``, so the pair is reversed for them. NIfTI arrays keep nibabel's axis order;
    a spacing stated for them applies to axes 0 and 1 (``pixdim[1]``, ``pixdim[2]``), unchanged."""
    if spacing is None:
        return None
    if str(image_path).lower().endswith((".nii", ".nii.gz")):
        return list(spacing)
    return list(spacing)[::-1]
