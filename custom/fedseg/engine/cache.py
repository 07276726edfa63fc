"""A site's memory budget for decoded images.

``CacheDataset`` keeps the output of the deterministic transforms (decoded, scaled, resized or
rescaled images) in memory so that only patches and augmentation are redone each epoch. At native
resolution a large site would not fit, so each dataset caches only as many images as the budget
``cache_max_mb`` (per site process, shared by its splits) still allows; the rest are decoded on each
access. Sizes are estimated from the image headers before anything is decoded (for volumes: after resampling to the
job's target spacing), so a volume far larger than the budget is simply decoded on access, never cached.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from monai.data import CacheDataset

from fedseg.config import TrainConfig, as_train_config

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


def volume_item_bytes(item: Mapping[str, Any], train_config: "Mapping[str, Any] | TrainConfig", train: bool, channels: int) -> int:
    """Bytes one cached volume takes: the image resampled to ``target_spacing`` (voxels scale with the spacing ratio
    per axis), plus its label on that grid for training, or at the scan's own size for evaluation; from the header."""
    from fedseg.data.volumes import read_geometry

    geo = read_geometry(item["image"])
    target = as_train_config(train_config).volume.target_spacing or geo.spacing
    grid = 1
    for n, own, new in zip(geo.spatial_shape, geo.spacing, target):
        # rounded first: a header's float32 spacing (0.800000012) must not add a voxel
        grid *= math.ceil(round(n * own / new, 4)) if float(new) > 0 else n
    if train:
        return (channels + 1) * grid * _BYTES
    return channels * grid * _BYTES + int(math.prod(geo.spatial_shape)) * _BYTES


def cached_item_bytes(item: Mapping[str, Any], train_config: "Mapping[str, Any] | TrainConfig", train: bool, channels: int) -> int:
    """Bytes one cached item takes: the image on the network's grid plus, for training, its label on the
    same grid, for evaluation the label (and FOV) at the image's own size. Volumes: :func:`volume_item_bytes`.
    ``train_config``: the engine's typed config or a train_config dict."""
    config = as_train_config(train_config)
    if config.volume.spatial_dims == 3:
        return volume_item_bytes(item, config, train, channels)
    height, width = image_shape(item["image"])
    if config.spatial.spatial_mode == "patch":
        r = float(item.get("rescale", config.spatial.rescale or 1.0))
        grid = math.ceil(height * r) * math.ceil(width * r)
    else:
        grid = int(config.network.image_size) ** 2
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

    def reserve(self, items: List[Mapping[str, Any]], train_config: "Mapping[str, Any] | TrainConfig", train: bool) -> int:
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


#: the train_config keys the deterministic transforms depend on (grid, orientation, intensity, labels, padding)
DISK_CACHE_SETTINGS = ("spatial_dims", "spatial_mode", "slice_axis", "target_spacing", "orientation", "modality",
                       "intensity_window", "image_channels", "in_channels", "num_classes", "labels", "label_values",
                       "patch_size", "rescale", "image_size", "intensity")


def _file_stamp_hash(item: Mapping[str, Any], settings: Optional[Mapping[str, Any]] = None) -> bytes:
    """The disk-cache key of an item: its values, each file's size and modification time (a file rewritten in place,
    a re-exported scan, is decoded again instead of served stale) and the job's :data:`DISK_CACHE_SETTINGS` (MONAI
    hashes the transforms by class name only, not their arguments)."""
    from monai.data.utils import pickle_hashing

    stamps = {}
    for key, value in item.items():
        if isinstance(value, str) and os.path.isfile(value):
            st = os.stat(value)
            stamps[key] = (st.st_size, st.st_mtime_ns)
    job = {k: (settings or {}).get(k) for k in DISK_CACHE_SETTINGS}
    return pickle_hashing({"item": dict(item), "files": stamps, "settings": repr(sorted(job.items()))})


class SiteDataset(CacheDataset):
    """``CacheDataset`` whose items beyond the memory budget (index >= ``cache_num``) may be kept on local disk.

    Items ``0 .. cache_num - 1`` are decoded once and held in memory, as ``CacheDataset`` does. Without ``cache_dir``
    the rest are decoded on every access; with it, the rest go through MONAI's ``PersistentDataset``: the output of
    the deterministic transforms (decoded, reoriented, resampled, windowed) is written once to ``cache_dir`` as a
    ``.pt`` file (float32, as in memory) and read back on later accesses, so memory stays bounded by the budget plus
    one item while the decoding is paid once. Keys hash the item, the file stamps and the job's settings the
    transforms depend on (``settings``: the train_config; :data:`DISK_CACHE_SETTINGS`), so a changed file or setting is
    decoded afresh. Random transforms (patches, augmentation) run on every access in both paths. Items are dictionaries
    such as ``{"image": path, "label": path}``; what comes out is what ``transform`` makes of them."""

    def __init__(self, data: Sequence[Mapping[str, Any]], transform: Any, cache_num: int,
                 cache_dir: Optional[os.PathLike] = None, settings: Optional[Mapping[str, Any]] = None):
        super().__init__(data, transform=transform, cache_num=cache_num, progress=False, num_workers=0)
        self._disk = None
        if cache_dir is not None and self.cache_num < len(self.data):
            from monai.data import PersistentDataset
            from monai.data.utils import json_hashing

            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            # the items keep their metadata (affine, applied transforms: later transforms read them); MetaTensors
            # load only as full pickles, so cache_dir must be a folder that only the site's account can write
            self._disk = PersistentDataset(self.data, transform=transform, cache_dir=cache_dir,
                                           hash_func=functools.partial(_file_stamp_hash, settings=dict(settings or {})),
                                           hash_transform=json_hashing, track_meta=True, weights_only=False)

    def _transform(self, index: int):
        if self._disk is not None and index % len(self) >= self.cache_num:
            return self._disk._transform(index % len(self))
        return super()._transform(index)
