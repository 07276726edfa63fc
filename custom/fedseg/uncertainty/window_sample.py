"""A seeded sample of patch-size windows over a split's whole images (patch mode).

Some methods average a per-pixel statistic over a site's whole images after training (GraphFedSeg's
U_i, FedEvi's G / A / R). At native resolution the whole-image pass is a sliding window over every
image, which costs several times the local training. These helpers let them average over a sample
instead, without changing what is averaged:

* Each image (on the network's grid, after the datalist's ``rescale``) is cut into a **non-overlapping
  tiling of cells** of ``cell`` px, the sliding window's stride (``patch_size * (1 - sw_overlap)``, as
  MONAI computes its scan interval; the patch itself with overlap 0); cells at the far border are
  smaller (the image's remainder). Every pixel lies in exactly one cell.
* A cell is scored by **one** ``patch`` window that holds it in its middle — the window reaches
  ``(patch - cell) // 2`` px past the cell on each side, as a sliding-window position holds the pixels
  its stride covers — moved inward where it would leave the image (context from inside the image, as
  MONAI places its last window). An axis shorter than the patch is zero-padded to it symmetrically,
  as ``SlidingWindowInferer`` pads (``floor`` of the difference before). Only the cell's own pixels
  count (``mask``). So a pixel's value is that of one sliding-window position that holds it away from
  the window's border; what is dropped is the blending of overlapping positions. With overlap 0 the
  cells are the sliding window's own windows and every cell sampled is the whole-image pass exactly.
* The sample draws ``num_windows`` cells per site and pass: as evenly over the images as possible
  (each image gets ``num_windows // N`` or one more, never more than it has cells; with fewer windows
  than images, that many images get one each), the images that get the extra window and each image's
  cells drawn without replacement from a generator seeded by ``(seed, site, round, purpose)``. It is
  deterministic, different per site and round, and drawn at the site. With ``num_windows`` at least the
  split's number of cells, the sample is every cell of every image: the tiling of the whole split.

The image value is then the mean over the sampled cells' pixels (an unbiased estimate of the image's
pixel mean within the tiling) and the site value the mean of the image values over the sampled images
— the same two-level mean as over whole images (e.g. GraphFedSeg's Eqs. 3-4).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "WHOLE_IMAGE",
    "SampledImage",
    "check_window_count",
    "allocate_windows",
    "cell_window_origin",
    "cells_in_split",
    "crop_windows",
    "pad_to_window",
    "sample_generator",
    "sample_windows",
    "tile_cells",
    "window_cell_size",
    "window_padding",
]

#: the option value (or ``None``) that keeps a method's pass over every whole image (sliding window)
WHOLE_IMAGE = "whole_image"

#: a cell: per spatial axis the half-open interval ``(start, stop)`` on the image's (unpadded) grid
Cell = Tuple[Tuple[int, int], ...]


@dataclass(frozen=True)
class SampledImage:
    """The sampled cells of one image of a split.

    Attributes:
        index: the image's position in the split (datalist order).
        shape: its spatial shape on the network's grid.
        cells: the sampled cells, in tiling order.
    """

    index: int
    shape: Tuple[int, ...]
    cells: Tuple[Cell, ...]


def check_window_count(value: Union[int, str, None], name: str) -> Optional[int]:
    """A method's window-sample option: a number of windows >= 1, or ``None`` / ``"whole_image"`` for the
    pass over every whole image (returned as ``None``).

    Raises:
        ValueError: anything else, naming the option.
    """
    if value is None or value == WHOLE_IMAGE:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a whole number of windows >= 1, or {WHOLE_IMAGE!r} / None, got {value!r}")
    return int(value)


def window_padding(shape: Sequence[int], patch: int) -> List[Tuple[int, int]]:
    """Per spatial axis ``(before, after)`` zero padding that makes the axis at least ``patch`` long:
    the difference split as MONAI's ``sliding_window_inference`` splits it (``floor`` half before)."""
    pads = []
    for size in shape:
        diff = max(int(patch) - int(size), 0)
        pads.append((diff // 2, diff - diff // 2))
    return pads


def window_cell_size(patch: int, overlap: float) -> int:
    """The cell of a patch window: the sliding window's stride ``int(patch * (1 - overlap))`` (MONAI's scan
    interval, at least 1 px); ``patch`` itself with overlap 0."""
    if not 0.0 <= float(overlap) < 1.0:
        raise ValueError(f"sw_overlap must be in [0, 1), got {overlap}")
    return max(int(int(patch) * (1.0 - float(overlap))), 1)


def tile_cells(shape: Sequence[int], cell: int) -> List[Cell]:
    """The non-overlapping tiling of an image of spatial ``shape`` into cells of ``cell`` px per axis, in
    row-major order; the last cell of an axis holds its remainder (an axis shorter than the cell is one
    cell). Every pixel lies in exactly one cell."""
    if cell < 1 or any(int(s) < 1 for s in shape):
        raise ValueError(f"cannot tile spatial shape {tuple(shape)} with cells of {cell} px")
    axes = [[(start, min(start + cell, int(size))) for start in range(0, int(size), cell)] for size in shape]
    return [tuple(c) for c in itertools.product(*axes)]


def cell_window_origin(cell: Cell, shape: Sequence[int], patch: int, cell_size: Optional[int] = None) -> Tuple[int, ...]:
    """Start of the ``patch`` window that scores ``cell``, in the coordinates of the image padded by
    :func:`window_padding`: ``(patch - cell_size) // 2`` px before the cell (default ``cell_size`` =
    ``patch``: the cell's start), moved inward where the window would leave the padded image."""
    margin = (int(patch) - int(cell_size or patch)) // 2
    if margin < 0:
        raise ValueError(f"cell size {cell_size} is larger than the window {patch}")
    origin = []
    for (start, _), size, (before, after) in zip(cell, shape, window_padding(shape, patch)):
        padded = int(size) + before + after
        origin.append(min(max(start + before - margin, 0), padded - patch))
    return tuple(origin)


def pad_to_window(image: torch.Tensor, patch: int) -> torch.Tensor:
    """``(C, *spatial)`` -> ``(C, *padded)``: zero padding by :func:`window_padding` (no-op when every axis
    is at least ``patch`` long)."""
    pads = window_padding(image.shape[1:], patch)
    if not any(b or a for b, a in pads):
        return image
    flat = [v for before_after in reversed(pads) for v in before_after]  # torch.nn.functional.pad order
    return torch.nn.functional.pad(image, flat, mode="constant", value=0.0)


def crop_windows(
    image: torch.Tensor, cells: Sequence[Cell], patch: int, cell_size: Optional[int] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The windows that score ``cells`` of ``image`` ``(C, *spatial)`` (:func:`cell_window_origin`) and which
    of their pixels are the cells'.

    Returns:
        ``windows (n, C, *[patch])`` and ``masks (n, 1, *[patch])`` bool, true on the cell's own pixels.
    """
    shape = tuple(image.shape[1:])
    padded = pad_to_window(image, patch)
    pads = window_padding(shape, patch)
    windows, masks = [], []
    for cell in cells:
        origin = cell_window_origin(cell, shape, patch, cell_size)
        windows.append(padded[(slice(None),) + tuple(slice(o, o + patch) for o in origin)])
        mask = torch.zeros((1,) + (patch,) * len(shape), dtype=torch.bool, device=image.device)
        mask[(slice(None),) + tuple(
            slice(start + before - o, stop + before - o) for (start, stop), (before, _), o in zip(cell, pads, origin)
        )] = True
        masks.append(mask)
    return torch.stack(windows), torch.stack(masks)


def sample_generator(seed: int, site: str, round_: int, purpose: str) -> torch.Generator:
    """A CPU generator seeded from ``(seed, site, round, purpose)`` by SHA-256 (Python's ``hash`` of a string
    changes between processes): the same draw after a site restart, a different one per site and round."""
    digest = hashlib.sha256(f"{int(seed)}|{site}|{int(round_)}|{purpose}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def allocate_windows(cells_per_image: Sequence[int], num_windows: int, generator: torch.Generator) -> List[int]:
    """How many windows each image gets: ``num_windows`` spread as evenly as possible, capped at each image's
    number of cells (what a full image cannot take goes to the others); ties broken by a random image order.
    Returns every image's cell count when ``num_windows`` is at least their sum."""
    counts = [int(c) for c in cells_per_image]
    if num_windows < 1:
        raise ValueError(f"num_windows must be >= 1, got {num_windows}")
    if any(c < 1 for c in counts):
        raise ValueError(f"every image needs at least one cell, got {counts}")
    if num_windows >= sum(counts):
        return counts
    order = torch.randperm(len(counts), generator=generator).tolist()
    taken = [0] * len(counts)
    left = int(num_windows)
    while left:  # one window per image with room, in the random order, until none is left
        for i in order:
            if left and taken[i] < counts[i]:
                taken[i] += 1
                left -= 1
    return taken


def sample_windows(
    shapes: Sequence[Sequence[int]], cell: int, num_windows: int, generator: torch.Generator
) -> List[SampledImage]:
    """The sample over a split whose images have spatial ``shapes`` (module docstring): images that got at
    least one window, in split order, each with its cells of ``cell`` px drawn without replacement (tiling
    order)."""
    tilings = [tile_cells(shape, cell) for shape in shapes]
    taken = allocate_windows([len(t) for t in tilings], num_windows, generator)
    sample = []
    for index, (tiling, k) in enumerate(zip(tilings, taken)):
        if k == 0:
            continue
        chosen = range(len(tiling)) if k == len(tiling) else sorted(torch.randperm(len(tiling), generator=generator)[:k].tolist())
        sample.append(SampledImage(index, tuple(int(s) for s in shapes[index]), tuple(tiling[j] for j in chosen)))
    return sample


def cells_in_split(shapes: Sequence[Sequence[int]], cell: int) -> int:
    """Number of cells of the split's tiling (the ``num_windows`` that covers every pixel)."""
    return sum(math.prod(math.ceil(int(s) / cell) for s in shape) for shape in shapes)
