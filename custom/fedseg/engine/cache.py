"""A site's memory budget for decoded images.

``CacheDataset`` keeps the output of the deterministic transforms (decoded, scaled, resized or
rescaled images) in memory so that only patches and augmentation are redone each epoch. At native
resolution a large site would not fit, so each dataset caches only as many images as the budget
``cache_max_mb`` (per site process, shared by its splits) still allows; the rest are decoded on each
access. Sizes are estimated from the image headers before anything is decoded (for volumes: after resampling to the
job's target spacing), so a volume far larger than the budget is simply decoded on access, never cached.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

logger = logging.getLogger(__name__)

#: float32 bytes per pixel and channel, as the transforms leave them
_BYTES = 4


def image_shape(path: str) -> Tuple[int, int]:
    """``(height, width)`` of a 2-D image from its header (PIL for rasters, nibabel for NIfTI)."""
    if str(path).lower().endswith((".nii", ".nii.gz")):
        import nibabel as nib

        shape = nib.load(str(path)).shape
        return int(shape[0]), int(shape[1])
    from PIL import Image

    with Image.open(path) as img:
        width, height = img.size
    return int(height), int(width)


def volume_item_bytes(item: Mapping[str, Any], train_config: Mapping[str, Any], train: bool, channels: int) -> int:
    """Bytes one cached volume takes: the image resampled to ``target_spacing`` (voxels scale with the spacing ratio
    per axis), plus its label on that grid for training, or at the scan's own size for evaluation; from the header."""
    from fedseg.data.volumes import read_geometry

    geo = read_geometry(item["image"])
    target = train_config.get("target_spacing") or geo.spacing
    grid = 1
    for n, own, new in zip(geo.spatial_shape, geo.spacing, target):
        # rounded first: a header's float32 spacing (0.800000012) must not add a voxel
        grid *= math.ceil(round(n * own / new, 4)) if float(new) > 0 else n
    if train:
        return (channels + 1) * grid * _BYTES
    return channels * grid * _BYTES + int(math.prod(geo.spatial_shape)) * _BYTES


def cached_item_bytes(item: Mapping[str, Any], train_config: Mapping[str, Any], train: bool, channels: int) -> int:
    """Bytes one cached item takes: the image on the network's grid plus, for training, its label on the
    same grid, for evaluation the label (and FOV) at the image's own size. Volumes: :func:`volume_item_bytes`."""
    if int(train_config.get("spatial_dims") or 2) == 3:
        return volume_item_bytes(item, train_config, train, channels)
    height, width = image_shape(item["image"])
    if train_config.get("spatial_mode") == "patch":
        r = float(item.get("rescale", train_config.get("rescale") or 1.0))
        grid = math.ceil(height * r) * math.ceil(width * r)
    else:
        grid = int(train_config.get("image_size", 64)) ** 2
    if train:
        return (channels + 1) * grid * _BYTES
    masks = 1 + ("fov" in item)
    return channels * grid * _BYTES + masks * height * width * _BYTES


class CacheBudget:
    """Hands out ``cache_num`` per dataset until ``max_mb`` is spent (``None`` = unbounded)."""

    def __init__(self, max_mb: Optional[float], channels: int = 3):
        self.max_bytes = None if max_mb is None else float(max_mb) * 2**20
        self.channels = int(channels)
        self.used_bytes = 0.0

    def reserve(self, items: List[Mapping[str, Any]], train_config: Mapping[str, Any], train: bool) -> int:
        """How many of ``items`` (from the first) the next dataset may cache; books their bytes."""
        n = 0
        for item in items:
            size = cached_item_bytes(item, train_config, train, self.channels)
            if self.max_bytes is not None and self.used_bytes + size > self.max_bytes:
                break
            self.used_bytes += size
            n += 1
        if n < len(items):
            logger.info("cache budget %.0f MB reached: %d of %d images cached, the rest decoded on access",
                        (self.max_bytes or 0) / 2**20, n, len(items))
        return n

    @property
    def used_mb(self) -> float:
        return self.used_bytes / 2**20
