"""A site's training split held where the network runs, batched and augmented there.

MONAI's fast-training pattern (``CacheDataset`` + ``ToDeviced`` + ``ThreadDataLoader``) taken one step further: the
output of the deterministic transforms, which ``CacheDataset`` already holds once per image, is moved to the device
once (stacked when every image has one shape), and each batch is gathered, cut into patches and augmented there by
the batch form of the bundle's random transforms (``fedseg.data.batch_transforms``). No batch is augmented sample
by sample on the CPU, collated or copied, and no step waits for the host.

Where the data live: on the engine's device when the stored tensors fit ``train_config["device_cache_mb"]`` (per
site process), else in pinned host memory, each batch then copied without blocking. On the CPU the device is host
memory. ``train_config["resident_data"] = False`` keeps the per-sample ``DataLoader`` path, as does any training
split that is not wholly cached, a random transform without a batch form, DP-SGD (Poisson batches) and a site
training as several ranks.

Per-sample randomness is MONAI's (same probabilities, ranges and choices per sample; ``tests/test_batch_transforms``),
drawn from generators seeded once per epoch from the engine's shuffle generator, so a restarted site that restores
that generator (``fedseg.engine.site_state``) replays the same epochs. The order of an epoch is
``torch.randperm(n, generator=shuffle_generator)``, as a shuffling ``DataLoader`` draws it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from fedseg.config import BASE_TRAIN_CONFIG, TrainConfig, as_train_config
from fedseg.data.batch_transforms import Batch, BatchOp, apply_pipeline, batch_pipeline

logger = logging.getLogger(__name__)

#: stored tensor keys of a cached training item (the rest, e.g. a ``rescale`` factor, has done its work)
TENSOR_KEYS = ("image", "label", "image_mean", "image_std")


def _plain(x: Any) -> torch.Tensor:
    """A cached value as a plain tensor (MONAI's ``MetaTensor`` metadata is not needed past the cache)."""
    t = torch.as_tensor(x)
    return t.as_tensor() if hasattr(t, "as_tensor") else t


class PatchSampler:
    """The batch form of ``RandCropByPosNegLabeld`` / ``RandCropByLabelClassesd`` (``allow_smaller=False``).

    Centre candidates are MONAI's own (``map_binary_to_indices`` / ``map_classes_to_indices`` of each cached label,
    computed once); each patch picks foreground with probability ``pos_ratio`` (else background; one that is empty
    gives way to the other) or a class with probability proportional to ``ratios`` over the classes present, then a
    candidate uniformly, and the centre is moved inside the image as ``correct_crop_centers`` does. Drawn on the host
    (slicing takes host integers), from a CPU generator.
    """

    def __init__(self, cropper: Any, labels: Sequence[torch.Tensor], num_classes: int):
        import monai.transforms as mt
        from monai.transforms.utils import map_binary_to_indices, map_classes_to_indices

        inner = cropper.cropper
        self.size = tuple(int(s) for s in inner.spatial_size)
        self.num_samples = int(inner.num_samples)
        self.shapes = [tuple(int(s) for s in lab.shape[1:]) for lab in labels]
        for shape in self.shapes:
            if any(s < p for s, p in zip(shape, self.size)):
                raise ValueError(f"a cached image {shape} is smaller than the patch {self.size}")
        self.pos_neg = isinstance(cropper, mt.RandCropByPosNegLabeld)
        sets: List[List[torch.Tensor]] = []
        for lab in labels:
            lab = lab.cpu()
            if self.pos_neg:
                fg, bg = map_binary_to_indices(lab)
                sets.append([torch.as_tensor(bg).long(), torch.as_tensor(fg).long()])  # class 0 = background
            else:
                sets.append([torch.as_tensor(ix).long() for ix in map_classes_to_indices(lab, num_classes)])
        n_sets = len(sets[0])
        if self.pos_neg:
            ratio = float(inner.pos_ratio)
            weights = torch.tensor([1.0 - ratio, ratio], dtype=torch.float64)
        else:
            ratios = inner.ratios
            weights = torch.tensor([1.0] * n_sets if ratios is None else [float(r) for r in ratios], dtype=torch.float64)
        self._counts = torch.tensor([[len(s) for s in image_sets] for image_sets in sets], dtype=torch.long)  # (N, K)
        if (self._counts.sum(1) == 0).any():
            raise ValueError("a cached label has no sampling location")
        # per image: the set probabilities over the sets present (MONAI: an empty set's ratio becomes 0; pos/neg: the
        # other set takes every patch)
        present = (self._counts > 0).double()
        w = weights[None, :] * present
        fallback = present / present.sum(1, keepdim=True)
        self._probs = torch.where(w.sum(1, keepdim=True) > 0, w / w.sum(1, keepdim=True).clamp_min(1e-300), fallback)
        # every image's candidate indices in one tensor: set k of image i starts at _offsets[i, k]
        flat = [ix for image_sets in sets for ix in image_sets]
        self._indices = torch.cat(flat) if flat else torch.zeros(0, dtype=torch.long)
        starts = torch.cumsum(torch.tensor([0] + [len(ix) for ix in flat[:-1]]), 0)
        self._offsets = starts.view(len(sets), n_sets)

    def centres(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``(len(images) * num_samples, d)`` int64 patch centres (host), images' patches in a row."""
        per = images.repeat_interleave(self.num_samples)
        which = torch.multinomial(self._probs[per], 1, generator=generator)[:, 0]
        count = self._counts[per, which]
        pick = (torch.rand(len(per), generator=generator, dtype=torch.float64) * count).long().clamp_max(count - 1)
        flat = self._indices[self._offsets[per, which] + pick]
        centres = []
        for j, (i, f) in enumerate(zip(per.tolist(), flat.tolist())):
            centres.append(self._corrected(list(_unravel(f, self.shapes[i])), self.shapes[i]))
        return torch.tensor(centres, dtype=torch.long)

    def _corrected(self, centre: List[int], shape: Tuple[int, ...]) -> List[int]:
        """``monai.transforms.utils.correct_crop_centers`` (``allow_smaller=False``) for one centre."""
        out = []
        for c, s, p in zip(centre, shape, self.size):
            start, end = p // 2, int(s + 1 - p / 2)  # MONAI casts the end to uint16 (a floor for these sizes)
            if start == end:
                end += 1
            out.append(min(max(c, start), end - 1))
        return out

    def starts(self, centres: torch.Tensor) -> List[List[int]]:
        """Patch corners of ``centres`` (``SpatialCrop``: ``max(centre - size // 2, 0)``)."""
        size = torch.tensor(self.size)
        return (centres - size // 2).clamp_min(0).tolist()


def _unravel(index: int, shape: Sequence[int]) -> Tuple[int, ...]:
    out = []
    for s in reversed(shape):
        out.append(index % s)
        index //= s
    return tuple(reversed(out))


class ResidentTrainingData:
    """A site's training split stored once for batching on ``device``; one epoch at a time via :meth:`epoch`.

    Args:
        items: the cached training items (``CacheDataset``'s cache: dictionaries after the deterministic transforms).
        tail: the training ``Compose``'s random transforms, from the first random one on (what MONAI applies per
            sample on every access).
        device: where batches are built and trained on.
        batch_size / drop_last: the training batches (images per batch; patches per image come from the cropper).
        num_classes: the job's classes (the class-balanced patch sampler needs it).
        device_cache_mb: what the stored tensors may take on a CUDA device; beyond it they stay in pinned host memory.

    Raises:
        ValueError: the tail has a transform without a batch form, or the items cannot be stacked — the engine
            then keeps the ``DataLoader`` path (:func:`resident_training_data` returns None instead of raising).
    """

    def __init__(self, items: Sequence[Mapping[str, Any]], tail: Sequence[Any], device: torch.device, batch_size: int,
                 drop_last: bool, num_classes: int, device_cache_mb: Optional[float] = BASE_TRAIN_CONFIG["device_cache_mb"]):
        import monai.transforms as mt

        if not items:
            raise ValueError("no training items")
        tail = list(tail)
        self.sampler: Optional[PatchSampler] = None
        croppers = (mt.RandCropByPosNegLabeld, mt.RandCropByLabelClassesd)
        if tail and isinstance(tail[0], croppers):
            cropper, tail = tail[0], tail[1:]
        else:
            cropper = None
        ops = batch_pipeline(tail)
        if ops is None:
            raise ValueError(f"no batch form for the random transforms {[type(t).__name__ for t in tail]}")
        self.ops: List[BatchOp] = ops
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.drop_last = bool(drop_last)
        self.n = len(items)
        keys = [k for k in TENSOR_KEYS if all(k in it for it in items)]
        if "image" not in keys or "label" not in keys:
            raise ValueError("cached items lack image or label")
        tensors = {k: [_plain(it[k]).float() for it in items] for k in keys}
        if cropper is not None:
            self.sampler = PatchSampler(cropper, tensors["label"], num_classes)
            stackable = ("image_mean", "image_std")
        else:
            shapes = {tuple(t.shape) for t in tensors["image"]}
            if len(shapes) != 1:
                raise ValueError(f"whole-image batches need one image shape, got {sorted(shapes)[:3]}")
            stackable = keys
        nbytes = sum(t.numel() * t.element_size() for ts in tensors.values() for t in ts)
        on_device = self.device.type != "cuda" or device_cache_mb is None or nbytes <= float(device_cache_mb) * 2**20
        self.store_device = self.device if on_device else torch.device("cpu")
        self.pinned = self.device.type == "cuda" and not on_device
        if self.pinned:
            logger.info("training split %.0f MB over device_cache_mb %s: kept in pinned host memory", nbytes / 2**20, device_cache_mb)

        def place(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory() if self.pinned else t.to(self.store_device)

        self.stacked = {k: place(torch.stack(tensors[k])) for k in keys if k in stackable}
        self.images = None if cropper is None else [place(t) for t in tensors["image"]]
        self.labels = None if cropper is None else [place(t) for t in tensors["label"]]
        self.nbytes = nbytes

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor to the device without making the host wait: copies from pageable memory would wait for the
        work already queued on the device, so they go through pinned memory."""
        if t.device.type != "cpu":  # already on a GPU ("cuda:0" is not equal to "cuda", so no device comparison)
            return t.to(self.device, non_blocking=True)
        if self.device.type == "cuda" and not t.is_pinned():
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def _gather(self, idx: torch.Tensor, host_generator: torch.Generator, idx_stored: Optional[torch.Tensor] = None) -> Batch:
        """The batch of images ``idx`` (host int64; ``idx_stored``: the same indices where the stacked tensors are):
        whole images, or ``num_samples`` patches of each."""
        if self.sampler is None:
            where = idx if idx_stored is None else idx_stored
            return {k: self._to_device(v.index_select(0, where)) for k, v in self.stacked.items()}
        centres = self.sampler.centres(idx, host_generator)
        starts = self.sampler.starts(centres)
        per = idx.repeat_interleave(self.sampler.num_samples).tolist()
        size = self.sampler.size
        batch: Batch = {}
        for key, store in (("image", self.images), ("label", self.labels)):
            patches = [store[i][(slice(None),) + tuple(slice(s, s + p) for s, p in zip(st, size))] for i, st in zip(per, starts)]
            batch[key] = self._to_device(torch.stack(patches))
        per_t = torch.tensor(per)
        for key, v in self.stacked.items():
            batch[key] = self._to_device(v.index_select(0, self._to_store(per_t)))
        return batch

    def _to_store(self, idx: torch.Tensor) -> torch.Tensor:
        """Host indices where the stacked tensors are (on the GPU: through pinned memory, without waiting)."""
        if self.store_device.type != "cuda":
            return idx
        return idx.pin_memory().to(self.store_device, non_blocking=True)

    def epoch(self, order: torch.Tensor, seed: int) -> Iterator[Batch]:
        """The batches of one epoch over ``order`` (host int64 permutation), augmented with generators seeded by
        ``seed``: ``{"image": (B*k, C, *P), "label": (B*k, 1, *P)[, "image_mean"/"image_std": (B*k, C)]}`` on the
        device (k patches per image in patch mode, else 1)."""
        device_generator = torch.Generator(device=self.device).manual_seed(int(seed))
        host_generator = torch.Generator().manual_seed(int(seed) + 1)
        stored = self._to_store(order) if self.sampler is None else None  # one transfer per epoch
        for b in range(len(self)):
            part = slice(b * self.batch_size, (b + 1) * self.batch_size)
            batch = self._gather(order[part], host_generator, None if stored is None else stored[part])
            yield apply_pipeline(self.ops, batch, device_generator)


class ResidentLoader:
    """What the trainer iterates: each pass is one epoch of :class:`ResidentTrainingData` in a new order.

    The order is ``torch.randperm(n, generator=shuffle_generator)`` and the epoch's augmentation seed the next draw
    of the same generator, so one generator (the engine's, persisted with the site state) fixes everything random.
    """

    def __init__(self, data: ResidentTrainingData, shuffle_generator: torch.Generator, shuffle: bool = True):
        self.data, self.generator, self.shuffle = data, shuffle_generator, bool(shuffle)

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[Batch]:
        order = torch.randperm(self.data.n, generator=self.generator) if self.shuffle else torch.arange(self.data.n)
        seed = int(torch.randint(0, 2**62, (1,), generator=self.generator))
        return self.data.epoch(order, seed)


def resident_training_data(dataset: Any, device: torch.device, train_config: "Mapping[str, Any] | TrainConfig",
                           num_classes: int) -> Optional[ResidentTrainingData]:
    """:class:`ResidentTrainingData` of a fully cached training ``SiteDataset``, or None (with the reason logged) when
    the site must keep the per-sample loader: ``resident_data`` off, items not all cached, or no batch form.
    ``train_config``: the engine's typed config or a train_config dict."""
    config = as_train_config(train_config)
    if not config.runtime.resident_data:
        return None
    if dataset.cache_num < len(dataset.data) or getattr(dataset, "_cache", None) is None:
        logger.info("training split not wholly cached (%d of %d): per-sample loader", dataset.cache_num, len(dataset.data))
        return None
    compose = dataset.transform
    from monai.transforms import RandomizableTrait, Transform

    first = compose.get_index_of_first(lambda t: isinstance(t, RandomizableTrait) or not isinstance(t, Transform))
    tail = [] if first is None else compose.transforms[first:]
    items = list(dataset._cache)
    if any(not isinstance(it, Mapping) for it in items):
        return None
    try:
        return ResidentTrainingData(
            items, tail, device, config.training.batch_size, bool(config.training.drop_last), num_classes,
            config.runtime.device_cache_mb,
        )
    except ValueError as e:
        logger.info("per-sample loader for the training split: %s", e)
        return None
