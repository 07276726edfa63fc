"""The random part of a bundle's training pipeline, applied to whole batches on the device.

The bundle's ``train_preprocessing`` is one MONAI ``Compose``: deterministic transforms (decoding, resizing or
rescaling, intensity, padding) that ``CacheDataset`` runs once per image, then random ones (patches, flips,
rotations, intensity jitter) that run on every access, one sample at a time, on the CPU. :func:`batch_pipeline`
reads that random tail and returns the same transforms as batch operations: each sample of a batch draws its own
parameters from the same distributions as the MONAI transform it stands for (whose attributes give the
probabilities and ranges), and a sample with given parameters is transformed exactly as MONAI's deterministic
counterpart would (``Flip``, ``Rotate90``, ``Resize``, ``Rotate``, ...; ``tests/test_batch_transforms.py`` checks
both). Nothing is re-parameterised: a bundle that changes a probability or a range changes it here too.

Batches are dictionaries of tensors on one device: ``"image"`` ``(B, C, *S)``, ``"label"`` ``(B, 1, *S)`` class
indices as float, and optionally ``"image_mean"`` / ``"image_std"`` ``(B, C)`` (``ChannelStatisticsd``). Random
parameters are drawn on the batch's device from one ``torch.Generator`` there, so no step waits for the host.

A transform this module does not know makes :func:`batch_pipeline` return ``None``; the engine then keeps the
per-sample ``DataLoader`` path for that site (``fedseg.engine.resident``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

Batch = Dict[str, torch.Tensor]

__all__ = [
    "BatchOp", "RandomFlip", "RandomAxisFlip", "RandomRotate90", "RandomScaleCropResize", "RandomRotate",
    "RandomScaleIntensity", "RandomShiftIntensity", "RandomAdjustContrast", "ClipIntensityRange", "SqueezeSpatial",
    "CastFloat", "batch_pipeline", "apply_pipeline", "draw_uniform", "draw_bernoulli",
]


# ------------------------------------------------------------------------------------------------ draws
def draw_bernoulli(n: int, prob: float, generator: torch.Generator) -> torch.Tensor:
    """``(n,)`` bool: each sample's ``rand() < prob``, as MONAI's ``Randomizable.randomize`` decides ``_do_transform``."""
    return torch.rand(n, generator=generator, device=generator.device) < prob


def draw_uniform(shape: Sequence[int], low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """Uniform on ``[low, high)`` (MONAI's ``R.uniform``), float32 on the generator's device."""
    u = torch.rand(tuple(shape), generator=generator, device=generator.device)
    return low + (high - low) * u


def draw_integers(n: int, low: int, high: int, generator: torch.Generator) -> torch.Tensor:
    """``(n,)`` integers uniform on ``[low, high)`` (MONAI's ``R.randint(low, high)``), int64."""
    return torch.randint(int(low), int(high), (n,), generator=generator, device=generator.device)


def _per_sample(mask: torch.Tensor, ndim: int) -> torch.Tensor:
    """``(B,)`` -> ``(B, 1, ..., 1)`` broadcastable over a ``(B, C, *S)`` tensor of ``ndim`` dimensions."""
    return mask.view(-1, *([1] * (ndim - 1)))


def _keys_in(batch: Batch, keys: Sequence[str]) -> List[str]:
    return [k for k in keys if k in batch]


# ------------------------------------------------------------------------------------------------ operations
class BatchOp:
    """One random (or deterministic) step of the tail, on a whole batch: ``op(batch, generator) -> batch``."""

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:  # pragma: no cover - interface
        raise NotImplementedError


class RandomFlip(BatchOp):
    """``RandFlipd(keys, prob, spatial_axis)``: each sample flipped along ``spatial_axis`` with probability ``prob``."""

    def __init__(self, keys: Sequence[str], prob: float, spatial_axis: Sequence[int]):
        self.keys, self.prob, self.spatial_axis = tuple(keys), float(prob), tuple(int(a) for a in spatial_axis)

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        n = batch["image"].shape[0]
        flip = draw_bernoulli(n, self.prob, generator)
        out = dict(batch)
        for k in _keys_in(batch, self.keys):
            x = batch[k]
            dims = [a + 2 for a in self.spatial_axis]
            out[k] = torch.where(_per_sample(flip, x.ndim), x.flip(dims), x)
        return out


class RandomAxisFlip(BatchOp):
    """``RandAxisFlipd(keys, prob)``: with probability ``prob`` a sample is flipped along one spatial axis drawn
    uniformly (MONAI: ``R.randint(ndim)``)."""

    def __init__(self, keys: Sequence[str], prob: float):
        self.keys, self.prob = tuple(keys), float(prob)

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        x0 = batch["image"]
        n, spatial = x0.shape[0], x0.ndim - 2
        do = draw_bernoulli(n, self.prob, generator)
        axis = draw_integers(n, 0, spatial, generator)
        out = dict(batch)
        for k in _keys_in(batch, self.keys):
            x = out[k]
            for a in range(spatial):
                x = torch.where(_per_sample(do & (axis == a), x.ndim), x.flip(a + 2), x)
            out[k] = x
        return out


class RandomRotate90(BatchOp):
    """``RandRotate90d(keys, prob, max_k, spatial_axes)``: with probability ``prob`` a sample turns by ``k`` x 90
    degrees in the plane of ``spatial_axes``, ``k`` uniform on ``1..max_k`` (MONAI: ``R.randint(max_k) + 1``), as
    ``torch.rot90`` (MONAI's ``Rotate90``). The plane must be square (a batch cannot hold both orientations)."""

    def __init__(self, keys: Sequence[str], prob: float, max_k: int, spatial_axes: Tuple[int, int]):
        self.keys, self.prob, self.max_k = tuple(keys), float(prob), int(max_k)
        self.spatial_axes = (int(spatial_axes[0]), int(spatial_axes[1]))

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        x0 = batch["image"]
        n = x0.shape[0]
        do = draw_bernoulli(n, self.prob, generator)
        k = draw_integers(n, 0, self.max_k, generator) + 1
        k = torch.where(do, k, torch.zeros_like(k))
        dims = (self.spatial_axes[0] + 2, self.spatial_axes[1] + 2)
        if x0.shape[dims[0]] != x0.shape[dims[1]] and self.max_k > 0:
            raise ValueError(f"RandRotate90d on a batch needs a square plane, got {tuple(x0.shape[2:])}")
        out = dict(batch)
        for key in _keys_in(batch, self.keys):
            x = out[key]
            result = x
            for turns in range(1, self.max_k + 1):
                result = torch.where(_per_sample(k == turns, x.ndim), torch.rot90(x, turns, dims), result)
            out[key] = result
        return out


class RandomScaleCropResize(BatchOp):
    """``RandScaleCropd(roi_scale, max_roi_scale, random_size, random_center)`` followed by ``Resized`` back to a
    fixed size: each sample's crop size per axis is uniform on ``[ceil(roi_scale * S), ceil(max_roi_scale * S)]``
    (MONAI: ``R.randint(low, high + 1)``), its corner uniform over the positions that keep it inside
    (``get_random_patch``), and the crop is resized with the ``Resized`` modes per key (``F.interpolate``, as MONAI's
    ``Resize`` without anti-aliasing). Per sample, since crop sizes differ."""

    def __init__(self, crop_keys: Sequence[str], roi_scale: float, max_roi_scale: Optional[float], random_size: bool,
                 random_center: bool, resize_keys: Sequence[str], size: Sequence[int], modes: Sequence[str],
                 align_corners: Sequence[Optional[bool]]):
        self.crop_keys, self.resize_keys = tuple(crop_keys), tuple(resize_keys)
        self.roi_scale, self.max_roi_scale = float(roi_scale), (None if max_roi_scale is None else float(max_roi_scale))
        self.random_size, self.random_center = bool(random_size), bool(random_center)
        self.size = tuple(int(s) for s in size)
        self.modes = dict(zip(self.resize_keys, modes))
        self.align = dict(zip(self.resize_keys, align_corners))

    def draw(self, n: int, spatial: Sequence[int], generator: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(sizes (n, d), corners (n, d))`` int64 on the generator's device."""
        low = [math.ceil(self.roi_scale * s) for s in spatial]
        high = [s if self.max_roi_scale is None else math.ceil(self.max_roi_scale * s) for s in spatial]
        if self.random_size:
            sizes = torch.stack([draw_integers(n, lo, hi + 1, generator) for lo, hi in zip(low, high)], 1)
        else:
            sizes = torch.tensor(low, device=generator.device).expand(n, -1)
        spatial_t = torch.tensor(list(spatial), device=generator.device)
        room = spatial_t - sizes  # the corner is uniform on 0..room (0 when the crop fills the axis)
        if self.random_center:
            corners = (torch.rand(sizes.shape, generator=generator, device=generator.device) * (room + 1)).long()
            corners = torch.minimum(corners, room)
        else:
            corners = room // 2
        return sizes, corners

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        x0 = batch["image"]
        n, spatial = x0.shape[0], tuple(x0.shape[2:])
        sizes, corners = self.draw(n, spatial, generator)
        # crop boxes are host integers: one small transfer per batch (slicing needs them)
        boxes = torch.cat([corners, sizes], 1).cpu().tolist()
        out = dict(batch)
        for key in _keys_in(batch, self.crop_keys):
            crops = []
            for i, box in enumerate(boxes):
                d = len(spatial)
                slices = tuple(slice(c, c + s) for c, s in zip(box[:d], box[d:]))
                crop = batch[key][i][(slice(None),) + slices]
                if key in self.resize_keys:
                    crop = _resize(crop, self.size, self.modes[key], self.align[key])
                crops.append(crop)
            out[key] = torch.stack(crops)
        return out


def _resize(x: torch.Tensor, size: Sequence[int], mode: str, align_corners: Optional[bool]) -> torch.Tensor:
    """One channel-first sample ``(C, *S)`` resized as MONAI's ``Resize`` (no anti-aliasing) does."""
    if tuple(x.shape[1:]) == tuple(size):
        return x
    kwargs = {"align_corners": align_corners} if mode in ("linear", "bilinear", "bicubic", "trilinear") else {}
    return F.interpolate(x[None].float(), size=tuple(size), mode=mode, **kwargs)[0].to(x.dtype)


class RandomRotate(BatchOp):
    """``RandRotated(range_x, prob, mode, padding_mode, align_corners)`` in 2-D: with probability ``prob`` a sample
    rotates by an angle uniform on ``range_x``, through MONAI's own ``Rotate`` (keep_size) on the device tensor."""

    def __init__(self, keys: Sequence[str], prob: float, range_x: Tuple[float, float], modes: Sequence[str],
                 padding_modes: Sequence[str], align_corners: Sequence[bool]):
        self.keys, self.prob, self.range_x = tuple(keys), float(prob), (float(range_x[0]), float(range_x[1]))
        self.modes, self.padding, self.align = dict(zip(keys, modes)), dict(zip(keys, padding_modes)), dict(zip(keys, align_corners))

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        from monai.transforms import Rotate

        x0 = batch["image"]
        if x0.ndim != 4:
            raise ValueError("RandRotated on a batch is implemented for 2-D images")
        n = x0.shape[0]
        do = draw_bernoulli(n, self.prob, generator)
        angle = draw_uniform((n,), *self.range_x, generator)
        plan = [(i, a) for i, (d, a) in enumerate(zip(do.cpu().tolist(), angle.cpu().tolist())) if d]
        if not plan:
            return batch
        out = {k: v.clone() if k in self.keys else v for k, v in batch.items()}
        for key in _keys_in(batch, self.keys):
            for i, a in plan:
                rotate = Rotate(angle=a, keep_size=True, mode=self.modes[key], padding_mode=self.padding[key],
                                align_corners=self.align[key], dtype=torch.float32)
                out[key][i] = torch.as_tensor(rotate(batch[key][i])).to(out[key].dtype)
        return out


def _channel_draws(x: torch.Tensor, prob: float, bounds: Tuple[float, float], channel_wise: bool, neutral: float,
                   generator: torch.Generator) -> torch.Tensor:
    """Per sample ``(B, C or 1, 1, ...)``: a value uniform on ``bounds`` (one per channel with ``channel_wise``) where
    the sample is transformed (probability ``prob``), else ``neutral``; broadcastable over ``x``."""
    n, c = x.shape[:2]
    do = draw_bernoulli(n, prob, generator)
    value = draw_uniform((n, c if channel_wise else 1), *bounds, generator)
    value = torch.where(do[:, None], value, torch.full_like(value, neutral))
    return value.view(n, -1, *([1] * (x.ndim - 2)))


class RandomScaleIntensity(BatchOp):
    """``RandScaleIntensityd(factors, prob, channel_wise)``: with probability ``prob``, ``x * (1 + f)`` with ``f``
    uniform on ``factors``, one per channel (``channel_wise``) or per sample."""

    def __init__(self, keys: Sequence[str], prob: float, factors: Tuple[float, float], channel_wise: bool):
        self.keys, self.prob, self.factors, self.channel_wise = tuple(keys), float(prob), tuple(map(float, factors)), bool(channel_wise)

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        out = dict(batch)
        for key in _keys_in(batch, self.keys):
            out[key] = batch[key] * (1.0 + _channel_draws(batch[key], self.prob, self.factors, self.channel_wise, 0.0, generator))
        return out


class RandomShiftIntensity(BatchOp):
    """``RandShiftIntensityd(offsets, prob, channel_wise)``: with probability ``prob``, ``x + o`` with ``o`` uniform on
    ``offsets``, one per channel (``channel_wise``) or per sample."""

    def __init__(self, keys: Sequence[str], prob: float, offsets: Tuple[float, float], channel_wise: bool):
        self.keys, self.prob, self.offsets, self.channel_wise = tuple(keys), float(prob), tuple(map(float, offsets)), bool(channel_wise)

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        out = dict(batch)
        for key in _keys_in(batch, self.keys):
            out[key] = batch[key] + _channel_draws(batch[key], self.prob, self.offsets, self.channel_wise, 0.0, generator)
        return out


class RandomAdjustContrast(BatchOp):
    """``RandAdjustContrastd(gamma, prob)`` (no inversion, no retained statistics): with probability ``prob``,
    ``((x - min) / (range + 1e-7)) ** g * range + min`` over the whole sample, ``g`` uniform on ``gamma``."""

    EPSILON = 1e-7  # MONAI's AdjustContrast

    def __init__(self, keys: Sequence[str], prob: float, gamma: Tuple[float, float]):
        self.keys, self.prob, self.gamma = tuple(keys), float(prob), tuple(map(float, gamma))

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        out = dict(batch)
        for key in _keys_in(batch, self.keys):
            x = batch[key]
            n = x.shape[0]
            do = draw_bernoulli(n, self.prob, generator)
            g = draw_uniform((n,), *self.gamma, generator)
            flat = x.reshape(n, -1)
            low, high = flat.amin(1), flat.amax(1)
            span = high - low
            shape = (n,) + (1,) * (x.ndim - 1)
            adjusted = ((x - low.view(shape)) / (span + self.EPSILON).view(shape)) ** g.view(shape) * span.view(shape) + low.view(shape)
            out[key] = torch.where(_per_sample(do, x.ndim), adjusted, x)
        return out


class ClipIntensityRange(BatchOp):
    """``ScaleIntensityRanged(a_min, a_max, b_min, b_max, clip)``, deterministic: ``(x - a_min) / (a_max - a_min) *
    (b_max - b_min) + b_min``, clipped to ``[b_min, b_max]`` with ``clip``."""

    def __init__(self, keys: Sequence[str], a_min: float, a_max: float, b_min: float, b_max: float, clip: bool):
        self.keys, self.clip = tuple(keys), bool(clip)
        self.a_min, self.a_max, self.b_min, self.b_max = map(float, (a_min, a_max, b_min, b_max))

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        out = dict(batch)
        for key in _keys_in(batch, self.keys):
            x = batch[key]
            if self.a_max - self.a_min != 0.0:
                x = (x - self.a_min) / (self.a_max - self.a_min) * (self.b_max - self.b_min) + self.b_min
            else:
                x = x - self.a_min + self.b_min
            out[key] = x.clamp(self.b_min, self.b_max) if self.clip else x
        return out


class SqueezeSpatial(BatchOp):
    """``SqueezeDimd(dim)``: drop a size-1 axis of each sample (``dim`` counts the channel as 0)."""

    def __init__(self, keys: Sequence[str], dim: int):
        self.keys, self.dim = tuple(keys), int(dim)

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        out = dict(batch)
        for key in _keys_in(batch, self.keys):
            out[key] = batch[key].squeeze(self.dim + 1)
        return out


class CastFloat(BatchOp):
    """``EnsureTyped(dtype=float32, track_meta=False)``: the batch's tensors as plain float32."""

    def __init__(self, keys: Sequence[str]):
        self.keys = tuple(keys)

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        return {k: (v.float() if k in self.keys else v) for k, v in batch.items()}


# ------------------------------------------------------------------------------------------------ from MONAI
def _flip_axes(spatial_axis: Any) -> Tuple[int, ...]:
    if spatial_axis is None:
        raise ValueError("RandFlipd without spatial_axis flips every axis; give the axes explicitly")
    return tuple(spatial_axis) if isinstance(spatial_axis, (list, tuple)) else (int(spatial_axis),)


def _range(values: Any) -> Tuple[float, float]:
    low, high = (values[0], values[1]) if isinstance(values, (list, tuple)) else (min(-values, values), max(-values, values))
    return float(low), float(high)


def batch_pipeline(transforms: Sequence[Any]) -> Optional[List[BatchOp]]:
    """The batch operations standing for MONAI's dictionary ``transforms`` (the random tail of a training
    ``Compose``, patch croppers excluded: ``fedseg.engine.resident`` samples patches itself), in order; ``None`` when
    one of them has no batch form here (the caller then keeps MONAI's per-sample path)."""
    import monai.transforms as mt

    ops: List[BatchOp] = []
    items = list(transforms)
    i = 0
    while i < len(items):
        t = items[i]
        if isinstance(t, mt.RandFlipd):
            ops.append(RandomFlip(t.keys, t.prob, _flip_axes(t.flipper.spatial_axis)))
        elif isinstance(t, mt.RandAxisFlipd):
            ops.append(RandomAxisFlip(t.keys, t.prob))
        elif isinstance(t, mt.RandRotate90d):
            ops.append(RandomRotate90(t.keys, t.prob, t.max_k, t.spatial_axes))
        elif isinstance(t, mt.RandScaleCropd):
            nxt = items[i + 1] if i + 1 < len(items) else None
            cropper = t.cropper
            if not isinstance(nxt, mt.Resized) or not isinstance(cropper.roi_scale, (int, float)) or cropper.max_roi_size is not None:
                return None  # a ragged batch: only a crop resized back to one size can be batched
            resizer = nxt.resizer
            ops.append(RandomScaleCropResize(
                t.keys, cropper.roi_scale, cropper.max_roi_scale, cropper.random_size, cropper.random_center,
                nxt.keys, resizer.spatial_size, nxt.mode, nxt.align_corners))
            i += 1
        elif isinstance(t, mt.RandRotated):
            r = t.rand_rotate
            if any(abs(v) > 0 for v in tuple(r.range_y) + tuple(r.range_z)) or not r.keep_size:
                return None
            ops.append(RandomRotate(t.keys, t.prob, r.range_x, t.mode, t.padding_mode, t.align_corners))
        elif isinstance(t, mt.RandScaleIntensityd):
            ops.append(RandomScaleIntensity(t.keys, t.prob, t.scaler.factors, t.scaler.channel_wise))
        elif isinstance(t, mt.RandShiftIntensityd):
            ops.append(RandomShiftIntensity(t.keys, t.prob, t.shifter.offsets, t.shifter.channel_wise))
        elif isinstance(t, mt.RandAdjustContrastd):
            a = t.adjuster
            if a.invert_image or a.retain_stats:
                return None
            ops.append(RandomAdjustContrast(t.keys, t.prob, a.gamma))
        elif isinstance(t, mt.ScaleIntensityRanged):
            s = t.scaler
            ops.append(ClipIntensityRange(t.keys, s.a_min, s.a_max, s.b_min, s.b_max, s.clip))
        elif isinstance(t, mt.SqueezeDimd):
            ops.append(SqueezeSpatial(t.keys, t.converter.dim))
        elif isinstance(t, mt.EnsureTyped):
            conv = t.converter
            if conv.dtype not in (None, torch.float32) or conv.device is not None:
                return None
            ops.append(CastFloat(t.keys))
        else:
            return None
        i += 1
    return ops


def apply_pipeline(ops: Sequence[Callable[[Batch, torch.Generator], Batch]], batch: Batch, generator: torch.Generator) -> Batch:
    """Run ``ops`` in order on ``batch``."""
    for op in ops:
        batch = op(batch, generator)
    return batch
