"""MONAI transforms used by the bundle's pre-processing (and so by every site).

The bundle's JSON configs compose these with stock MONAI transforms; anything stock MONAI already
does (loading, resizing, intensity scaling, flips, rotations) is not re-implemented here.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Hashable, Mapping, Optional, Sequence, Union

import numpy as np
import torch
from monai.config import KeysCollection
from monai.data import ImageReader, NibabelReader, PILReader
from monai.transforms import MapTransform

_NIFTI_SUFFIXES = (".nii", ".nii.gz")
_RASTER_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif", ".ppm")


class SegImageReader(ImageReader):
    """One reader for the formats sites hand us: raster images through PIL, NIfTI through nibabel.

    MONAI's default reader search has no reader for ``.tif``/``.gif`` without ITK installed; this
    dispatches by suffix so DRIVE's TIFFs and GIF masks load with the same ``LoadImaged`` as PNGs.

    Args:
        image_modes: pass raster images through ``fedseg.data.image_modes.to_pipeline_mode`` (16-bit scaled by
            dtype to 0..255, RGBA / palette -> RGB). For images only: a mask's palette indices are its labels.
    """

    def __init__(self, image_modes: bool = False, **kwargs: Any):
        super().__init__()
        if image_modes:
            from fedseg.data.image_modes import to_pipeline_mode

            kwargs.setdefault("converter", to_pipeline_mode)
        self._pil = PILReader(**kwargs)
        self._nifti = NibabelReader()

    @staticmethod
    def _is_nifti(path: Union[str, os.PathLike]) -> bool:
        return str(path).lower().endswith(_NIFTI_SUFFIXES)

    def verify_suffix(self, filename: Union[Sequence, str, os.PathLike]) -> bool:
        names = [filename] if isinstance(filename, (str, os.PathLike)) else list(filename)
        return all(str(n).lower().endswith(_NIFTI_SUFFIXES + _RASTER_SUFFIXES) for n in names)

    def read(self, data: Union[Sequence, str, os.PathLike], **kwargs: Any):
        first = data[0] if isinstance(data, (list, tuple)) else data
        reader = self._nifti if self._is_nifti(first) else self._pil
        return reader, reader.read(data, **kwargs)

    def get_data(self, img: Any):
        reader, obj = img
        return reader.get_data(obj)


class VolumeReader(ImageReader):
    """One reader for volumes: NIfTI through nibabel (always), NRRD / MHA / MetaImage through MONAI's ``ITKReader`` when
    the optional ``itk`` package is installed (else an error with that hint). Dispatching by suffix keeps every NIfTI on
    one reader whatever else is installed: MONAI's default search would hand NIfTI to ITK when it is present."""

    def __init__(self, **kwargs: Any):
        super().__init__()
        self._nifti = NibabelReader(**kwargs)
        self._itk: Any = None

    def verify_suffix(self, filename: Union[Sequence, str, os.PathLike]) -> bool:
        from fedseg.data.volumes import ITK_SUFFIXES, VOLUME_SUFFIXES

        names = [filename] if isinstance(filename, (str, os.PathLike)) else list(filename)
        return all(str(n).lower().endswith(VOLUME_SUFFIXES + ITK_SUFFIXES) for n in names)

    def read(self, data: Union[Sequence, str, os.PathLike], **kwargs: Any):
        first = str(data[0] if isinstance(data, (list, tuple)) else data)
        if first.lower().endswith(_NIFTI_SUFFIXES):
            return self._nifti, self._nifti.read(data, **kwargs)
        if self._itk is None:
            try:
                import itk  # noqa: F401  (optional)
            except ImportError:
                raise ValueError(f"{first}: NRRD / MHA volumes need the optional package itk (pip install itk), or "
                                 "convert the volume to NIfTI") from None
            from monai.data import ITKReader

            self._itk = ITKReader()
        return self._itk, self._itk.read(data, **kwargs)

    def get_data(self, img: Any):
        reader, obj = img
        return reader.get_data(obj)


class ItemTransformd(MapTransform):
    """A dictionary transform that replaces the value of each of its keys by :meth:`transform_item` of it."""

    def transform_item(self, value: Any, key: Hashable) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        d = dict(data)
        for key in self.key_iterator(d):
            d[key] = self.transform_item(d[key], key)
        return d


class EnsureChannelsd(ItemTransformd):
    """Make a channel-first image have exactly ``channels`` channels.

    Grey-scale scans are repeated to 3 channels (the network is built for RGB), RGBA drops alpha,
    and a 3-channel image asked to become 1 channel is averaged. Shapes: ``(c, H, W) -> (channels, H, W)``.
    """

    def __init__(self, keys: KeysCollection, channels: int = 3, allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        self.channels = int(channels)

    def transform_item(self, img: Any, key: Hashable) -> Any:
        c = img.shape[0]
        if c == self.channels:
            return img
        if c == 4 and self.channels == 3:
            return img[:3]
        if c == 1:
            return img.repeat(self.channels, *([1] * (img.ndim - 1)))
        if self.channels == 1:
            return img.mean(dim=0, keepdim=True) if isinstance(img, torch.Tensor) else img.mean(0, keepdims=True)
        raise ValueError(f"cannot convert a {c}-channel image to {self.channels} channels ({key})")


class BinarizeMaskd(ItemTransformd):
    """Map a 0/1 or 0/255 mask to float {0, 1}, keeping only the first channel: ``(c, H, W) -> (1, H, W)``.

    A mask with any other values is rejected with the file name, because silently thresholding a
    multi-class or soft mask would train on the wrong target.
    """

    def transform_item(self, value: Any, key: Hashable) -> Any:
        mask = value[:1]
        values = torch.unique(torch.as_tensor(mask))
        allowed = {0.0, 1.0} if float(values.max()) <= 1 else {0.0, 255.0}
        if not set(values.tolist()) <= allowed:
            src = _source_name(mask)
            found = values.tolist()[:8]
            raise ValueError(f"non-binary mask {src}: values {found} (expected 0/1 or 0/255)")
        return (mask > 0).to(torch.float32) if isinstance(mask, torch.Tensor) else (mask > 0).astype(np.float32)


class LabelsToClassesd(MapTransform):
    """Decode a stored mask into class indices: ``(c, *spatial)`` stored values -> ``(1, *spatial)`` float32 in ``0..C-1``.

    The stored encoding is the item's ``values_key`` entry (``{"255": 0, "128": 1, "0": 2}``: the datalist's
    ``label_values``, which :class:`fedseg.engine.SegEngine` copies into each item, per entry where a pooled
    datalist mixes encodings) and is removed from the item. Without one, masks store class indices, and a binary
    space (``num_classes`` 2) keeps the historic {0,1} / {0,255} rule — exactly :class:`BinarizeMaskd`.
    ``c > 1`` (an RGB mask) is accepted only with a declared encoding and identical colour channels
    (:mod:`fedseg.data.labels`). Any undeclared value is an error naming the file and the values: a mask is never
    thresholded or guessed at.
    """

    def __init__(self, keys: KeysCollection = "label", num_classes: int = 2, values_key: str = "label_values",
                 allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        self.num_classes = int(num_classes)
        self.values_key = values_key

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        from dataclasses import replace

        from fedseg.data.labels import BINARY, LabelSpace, parse_label_values

        d = dict(data)
        values = d.pop(self.values_key, None)
        names = BINARY.names if self.num_classes == 2 else ("background",) + tuple(f"class{i}" for i in range(1, self.num_classes))
        space = LabelSpace(names=names)
        if values is not None:
            space = replace(space, values=parse_label_values(values, self.values_key))
        for key in self.key_iterator(d):
            mask = d[key]
            source = _source_name(mask)
            if values is None and mask.shape[0] > 1:
                mask = mask[:1]  # the historic behaviour: the first channel (RGB masks are refused by the datalist check)
            array = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
            classes = space.decode_channel_first(array, source).astype(np.float32)
            if isinstance(mask, torch.Tensor):
                # float32 like BinarizeMaskd; .to keeps MONAI's metadata (file name, affine) on the decoded mask
                d[key] = mask[:1].to(torch.float32).copy_(torch.as_tensor(classes))
            else:
                d[key] = classes
        return d


class ClassesToLabelValuesd(ItemTransformd):
    """Class indices -> stored mask values, for writing predictions in a site's own encoding:
    ``(1, *spatial)`` indices ``0..C-1`` -> ``(1, *spatial)`` float32 values.

    ``label_values``: the datalist's ``{"stored value": class}`` (the first value listed for a class is written);
    ``None`` = class indices, and 0 / 255 for two classes (the historic binary masks). ``indices=True`` writes the
    class indices whatever the encoding (``fedseg infer --class-indices``).
    """

    def __init__(self, keys: KeysCollection = "pred", num_classes: int = 2, label_values: Optional[Mapping[str, int]] = None,
                 indices: bool = False, allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        from dataclasses import replace

        from fedseg.data.labels import BINARY, LabelSpace, parse_label_values

        names = BINARY.names if int(num_classes) == 2 else ("background",) + tuple(f"class{i}" for i in range(1, int(num_classes)))
        space = LabelSpace(names=names)
        if label_values is not None and not indices:
            space = replace(space, values=parse_label_values(label_values, "label_values"))
        self.table = torch.as_tensor(space.output_values() if not indices else np.arange(len(names)), dtype=torch.float32)

    def transform_item(self, pred: Any, key: Hashable) -> Any:
        index = torch.as_tensor(pred).round().long().clamp(0, len(self.table) - 1).as_subclass(torch.Tensor)
        values = self.table.to(index.device)[index]
        # .to keeps MONAI's metadata (the input's file name and affine, for SaveImaged)
        return pred.to(torch.float32).copy_(values) if isinstance(pred, torch.Tensor) else values.numpy()


class CheckSameSized(MapTransform):
    """Fail with both file names when an image and its mask (or field-of-view mask) differ in spatial
    size. A missing second key (an entry without ``fov``) is skipped."""

    def __init__(self, keys: KeysCollection = ("image", "label")):
        super().__init__(keys)

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        image_key, label_key = self.keys[0], self.keys[1]
        if label_key not in data:
            return dict(data)
        img, lab = data[image_key], data[label_key]
        if tuple(img.shape[1:]) != tuple(lab.shape[1:]):
            raise ValueError(
                f"image/mask size mismatch: {_source_name(img)} is {tuple(img.shape[1:])}, "
                f"{_source_name(lab)} is {tuple(lab.shape[1:])}"
            )
        return dict(data)


class Rescaled(MapTransform):
    """Zoom ``keys`` by one fixed factor: the item's ``factor_key`` entry where it has one (a pooled datalist
    mixes data sets, each with its own factor), else ``factor``. ``(C, H, W) -> (C, round(rH), round(rW))``;
    a factor of 1 leaves the item as it is. ``mode``: one interpolation mode per key (``area`` for images,
    ``nearest`` for masks). The factor is never guessed from the image: it is stated in the datalist or config.
    """

    def __init__(self, keys: KeysCollection, factor: float = 1.0, mode: Union[str, Sequence[str]] = "area",
                 factor_key: str = "rescale", allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        self.factor = float(factor)
        self.factor_key = factor_key
        self.modes = [mode] * len(self.keys) if isinstance(mode, str) else list(mode)

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        from monai.transforms import Zoom

        d = dict(data)
        factor = float(d.get(self.factor_key, self.factor))
        if factor == 1.0:
            return d
        for key, mode in zip(self.keys, self.modes):
            if key in d:
                d[key] = Zoom(zoom=factor, mode=mode, keep_size=False)(d[key])
        return d


class ChannelStatisticsd(MapTransform):
    """Per-channel mean and population std of the whole image, stored next to it before patches are cut.

    ``data[key]`` ``(C, *spatial)`` -> adds ``data[f"{key}_mean"]`` and ``data[f"{key}_std"]``, float32 ``(C,)``
    each (std at least ``eps``). Patch croppers copy such extra keys into every patch, so a training patch
    carries the statistics of the image it came from (PathFL's CSE restyles a patch with them,
    ``cse_statistics="image"``). They stay at the site like the image itself.
    """

    def __init__(self, keys: KeysCollection = "image", eps: float = 1e-6, allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        self.eps = float(eps)

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        from fedseg.alignment.style import channel_statistics  # the same statistics CSE computes per patch

        d = dict(data)
        for key in self.key_iterator(d):
            mean, std = channel_statistics(torch.as_tensor(d[key]).float()[None], self.eps)
            d[f"{key}_mean"], d[f"{key}_std"] = mean[0], std[0]
        return d


class DivideByMaxd(ItemTransformd):
    """Divide each image by its own maximum (over every channel and pixel): ``(C, *spatial)`` -> same shape, values
    in [0, 1] for non-negative images. ``train_config["intensity"] = "image_max"``: the bundles apply it on the
    network's grid, after resizing or rescaling, so the network sees the same range whatever an image's exposure.

    An image whose maximum is not positive (all black) is left unchanged: there is nothing to scale, and dividing
    would give NaN or flip the sign.
    """

    def transform_item(self, img: Any, key: Hashable) -> Any:
        peak = float(img.max())
        return img / peak if peak > 0 else img


class KeepLargestComponentd(ItemTransformd):
    """Keep each foreground class's largest connected component of a class-index map: ``(1, *spatial)`` ->
    the same shape (:func:`fedseg.metrics.segmentation.keep_largest_component`, the rule the final evaluation's
    ``*_lcc`` metrics use); ``fedseg infer --largest-component`` applies it to every mask before writing."""

    def __init__(self, keys: KeysCollection, num_classes: int = 2, allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        self.num_classes = int(num_classes)

    def transform_item(self, pred: Any, key: Hashable) -> Any:
        from fedseg.metrics.segmentation import keep_largest_component

        kept = keep_largest_component(torch.as_tensor(pred)[None], self.num_classes)[0]
        # copy_ keeps MONAI's metadata (file name, affine) for SaveImaged
        return pred.clone().copy_(kept) if isinstance(pred, torch.Tensor) else kept.numpy()


class ResizeToReferenced(MapTransform):
    """Resize ``keys`` (channel-first logits or probabilities) to the spatial size of ``ref_key``.

    Evaluation predicts on the network's grid (a resized or rescaled image) and scores against the
    mask at the image's own size: this brings the prediction back, interpolating the class scores
    (``mode="bilinear"``) *before* the argmax so that thin structures are not aliased by a
    nearest-neighbour resize of labels. Shapes: ``(C, h, w) -> (C, H, W)`` with ``(H, W)`` from ``ref_key``.
    """

    def __init__(self, keys: KeysCollection, ref_key: str = "label", mode: str = "bilinear", allow_missing_keys: bool = False):
        super().__init__(keys, allow_missing_keys)
        self.ref_key = ref_key
        self.mode = mode

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        d = dict(data)
        size = tuple(d[self.ref_key].shape[1:])
        for key in self.key_iterator(d):
            d[key] = resize_scores(torch.as_tensor(d[key])[None], size, self.mode)[0]
        return d


def resize_scores(scores: torch.Tensor, size: Sequence[int], mode: str = "bilinear") -> torch.Tensor:
    """``(B, C, h, w) -> (B, C, H, W)``: class scores interpolated to ``size``; unchanged when it already fits."""
    if tuple(scores.shape[2:]) == tuple(size):
        return scores
    import torch.nn.functional as F

    return F.interpolate(scores.float(), size=tuple(int(s) for s in size), mode=mode, align_corners=False)


def _source_name(x: Any) -> str:
    meta = getattr(x, "meta", None) or {}
    return str(meta.get("filename_or_obj", "<unknown file>"))


def _register_volume_checks() -> None:
    """The volume checks of :mod:`fedseg.data.volumes` are plain classes (that module imports no MONAI); declared
    deterministic MONAI transforms here, as MONAI's caching datasets only cache past ``Transform`` instances: otherwise
    ``CacheDataset`` would stop at the first check and keep each volume as loaded, unresampled (larger than the budget
    reckons, and resampled again on every access)."""
    from monai.transforms import Transform

    from .volumes import CheckChannelsd, CheckVolumeGeometryd

    for cls in (CheckVolumeGeometryd, CheckChannelsd):
        Transform.register(cls)


_register_volume_checks()
