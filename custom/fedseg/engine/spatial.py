"""Spatial mode of a site: how images reach the network and how predictions come back to the image's size.

Modes (``train_config["spatial_mode"]``, or the datalist's top-level ``"spatial_mode"`` when the
config leaves it ``None``); for 2-D images:

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

For volumes (``spatial_dims`` 3; :mod:`fedseg.data.volumes`), after reorientation and resampling to the job's
``target_spacing``:

* ``patch`` — a 3-D network on 3-D patches (``patch_size`` three numbers, or one for a cube), a 3-D sliding window
  over the whole volume;
* ``slices`` — a 2-D network on the volume's slices along ``slice_axis`` (2 = axial after RAS reorientation):
  training patches of ``patch_size`` x ``patch_size`` x 1 (only slices with foreground when
  ``slice_foreground_only``, FedEvi's prostate setting), evaluation slides a ``patch_size`` x ``patch_size`` x 1
  window over every slice and so predicts the volume slice by slice (:class:`SliceNetwork`).

In both, the class scores are inverted (MONAI ``Invertd``) back to each scan's own orientation, spacing and shape
before any metric; distances in mm come from its header.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence

import torch
from monai.inferers import SlidingWindowInferer
from torch import nn

from fedseg.config import TrainConfig, as_train_config

logger = logging.getLogger(__name__)

SPATIAL_MODES = ("resize", "patch", "slices")


def resolve_spatial_settings(train_config: Mapping[str, Any], datalist: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
    """``{"spatial_mode", "rescale"}`` for one site: the config's value where set, else the datalist's
    top-level field, else ``resize`` / ``1.0``.

    Raises:
        ValueError: unknown mode, or a rescale factor that is not a positive number.
    """
    from fedseg.data.volumes import is_volume_job

    volume = is_volume_job(train_config, datalist)
    mode = train_config.get("spatial_mode") or datalist.get("spatial_mode") or ("patch" if volume else "resize")
    if mode not in SPATIAL_MODES:
        raise ValueError(f"spatial_mode {mode!r} {where}: expected one of {SPATIAL_MODES}")
    if volume and mode == "resize":
        raise ValueError(f"spatial_mode 'resize' {where}: volumes train on 3-D patches ('patch') or on slices ('slices')")
    if mode == "slices" and not volume:
        raise ValueError(f"spatial_mode 'slices' {where} needs volumes (spatial_dims 3)")
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
    out = {"spatial_mode": mode, "rescale": rescale, "spatial_dims": 3 if volume else 2}
    if volume:
        from fedseg.data.volumes import resolve_volume_settings

        out.update(resolve_volume_settings(train_config, datalist, where))
        if rescale != 1.0:
            raise ValueError(f"rescale {rescale} {where}: volumes are resampled to target_spacing instead")
    return out


def check_patch_size(train_config: "Mapping[str, Any] | TrainConfig", levels: int) -> None:
    """The patch (or resized image) must pass through every pooling level of the U-Net, and keep more
    than one pixel at the bottleneck (instance norm needs two). Volumes: every side of the 3-D patch, or the in-plane
    sides in slice mode. ``train_config``: a typed config or a train_config dict."""
    config = as_train_config(train_config)
    factor = 2 ** (levels - 1)
    mode = config.spatial.spatial_mode
    key = "patch_size" if mode in ("patch", "slices") else "image_size"
    value = config.spatial.patch_size if key == "patch_size" else config.network.image_size
    if config.volume.spatial_dims == 3:
        from fedseg.data.volumes import crop_shape

        axis = config.volume.slice_axis
        sides = [s for i, s in enumerate(crop_shape(value, mode, axis)) if not (mode == "slices" and i == axis)]
    else:
        if not isinstance(value, (int, float)):
            raise ValueError(f"{key} {value!r}: a 2-D job takes one number")
        sides = [int(value)]
    for size in sides:
        if size % factor or size < 2 * factor:
            raise ValueError(f"{key} {value!r} must be a multiple of {factor} and at least {2 * factor} "
                             f"(on every side) for a {levels}-level U-Net")


class WholeImagePredictor:
    """Class scores of whole images: ``(B, C_in, h, w) -> (B, num_classes, h, w)``.

    Patch mode slides a ``patch_size`` window (``sw_overlap``, ``sw_blend_mode`` Gaussian or constant
    blending, ``sw_batch_size`` windows per forward pass); images smaller than the window are padded and
    the result is cropped back by MONAI. Resize mode is one forward pass.
    """

    def __init__(self, train_config: "Mapping[str, Any] | TrainConfig"):
        config = as_train_config(train_config)
        self.mode = config.spatial.spatial_mode or "resize"
        self.inferer: Optional[SlidingWindowInferer] = None
        self.slice_axis: Optional[int] = None
        if config.volume.spatial_dims == 3:
            from fedseg.data.volumes import crop_shape

            roi = tuple(crop_shape(config.spatial.patch_size, self.mode, config.volume.slice_axis))
            self.slice_axis = config.volume.slice_axis if self.mode == "slices" else None
        elif self.mode == "patch":
            roi = (int(config.spatial.patch_size),) * 2
        if self.mode in ("patch", "slices"):
            window = config.sliding_window
            self.inferer = SlidingWindowInferer(
                roi_size=roi,
                sw_batch_size=window.sw_batch_size,
                overlap=window.sw_overlap,
                mode=str(window.sw_blend_mode),
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
        network = SliceNetwork(model, self.slice_axis) if self.slice_axis is not None else model
        return self.inferer(inputs, network)


class SliceNetwork(nn.Module):
    """A 2-D network applied to one-slice windows of a volume: ``(B, C, X, Y, Z)`` with size 1 on ``slice_axis``
    (0, 1 or 2 of the spatial axes) -> the 2-D network's ``(B, K, ...)`` on the slice -> ``(B, K, X, Y, Z)`` with
    the slice axis restored. Sliding a window that is one slice thick predicts a volume slice by slice."""

    def __init__(self, network: nn.Module, slice_axis: int = 2):
        super().__init__()
        self.network = network
        self.slice_axis = int(slice_axis)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = 2 + self.slice_axis
        if x.shape[dim] != 1:
            raise ValueError(f"SliceNetwork takes windows one slice thick on axis {self.slice_axis}, got {tuple(x.shape)}")
        return self.network(x.squeeze(dim)).unsqueeze(dim)


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
