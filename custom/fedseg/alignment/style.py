"""Collaborative style enhancement (CSE, PathFL section 3.3): restyle an image with another site's
intensity statistics (AdaIN) and keep half of the original through a random half-plane mask.

Statistics are per channel (the AdaIN form; the paper writes scalars, which would wash the hematoxylin /
eosin colour balance into one grey level).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

#: the 8 orientations of the half-plane mask: (quarter turns, flip the last axis)
ORIENTATIONS: Tuple[Tuple[int, bool], ...] = tuple((k, f) for k in range(4) for f in (False, True))


def channel_statistics(images: torch.Tensor, eps: float = 1e-6) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-image, per-channel mean and standard deviation.

    Args:
        images: ``(B, C, *spatial)``.
    Returns:
        ``(mean, std)`` each ``(B, C)``; ``std`` is the population std, at least ``eps``.
    """
    flat = images.flatten(2)
    return flat.mean(-1), flat.std(-1, unbiased=False).clamp_min(eps)


def adain_restyle(
    images: torch.Tensor,
    style_mean: torch.Tensor,
    style_std: torch.Tensor,
    eps: float = 1e-6,
    source: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> torch.Tensor:
    """``(x - mu_x) / sigma_x * sigma_s + mu_s`` per image and channel (PathFL eq. 8, AdaIN).

    Args:
        images: ``(B, C, *spatial)``.
        style_mean, style_std: ``(B, C)`` (one style per image) or ``(C,)`` (one for all).
        source: ``(mu_x, sigma_x)``, ``(B, C)`` each, when ``images`` are patches and the statistics should be
            those of the whole images they were cut from; ``None`` = each image's own.
    Returns:
        ``(B, C, *spatial)``.
    """
    if source is None:
        mean, std = channel_statistics(images, eps)
    else:
        mean = torch.as_tensor(source[0], dtype=images.dtype, device=images.device)
        std = torch.as_tensor(source[1], dtype=images.dtype, device=images.device).clamp_min(eps)
        if mean.shape != images.shape[:2] or std.shape != images.shape[:2]:
            raise ValueError(f"source statistics must be {tuple(images.shape[:2])}, got {tuple(mean.shape)} / {tuple(std.shape)}")
    extra = (1,) * (images.dim() - 2)
    style_mean = torch.as_tensor(style_mean, dtype=images.dtype, device=images.device).expand_as(mean)
    style_std = torch.as_tensor(style_std, dtype=images.dtype, device=images.device).expand_as(std)
    return (images - mean.view(*mean.shape, *extra)) / std.view(*std.shape, *extra) * style_std.view(
        *std.shape, *extra
    ) + style_mean.view(*mean.shape, *extra)


def half_space_mask(shape: Tuple[int, ...], generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Binary mask of ``shape`` (a volume's ``(X, Y, Z)``), exactly half ones: the lower half along a random axis,
    flipped at random -- the 3-D counterpart of the 8 half-plane orientations (2 x 3 here).

    Raises:
        ValueError: an odd side along the drawn axis (no exact half).
    """
    axis = int(torch.randint(len(shape), (1,), generator=generator))
    if shape[axis] % 2:
        raise ValueError(f"a half-space mask needs an even side along axis {axis}, got {shape}")
    mask = torch.zeros(shape)
    index = [slice(None)] * len(shape)
    index[axis] = slice(0, shape[axis] // 2)
    mask[tuple(index)] = 1.0
    return torch.flip(mask, dims=(axis,)) if bool(torch.randint(2, (1,), generator=generator)) else mask


def half_plane_mask(height: int, width: int, quarter_turns: int = 0, flip: bool = False) -> torch.Tensor:
    """Binary ``(height, width)`` mask, exactly half ones: the top half, rotated by ``quarter_turns`` x 90
    degrees and optionally flipped left-right (the 8 orientations are :data:`ORIENTATIONS`).

    Raises:
        ValueError: an odd side (no exact half) or a non-square mask asked to turn by 90 degrees.
    """
    if height % 2 or width % 2:
        raise ValueError(f"a half-plane mask needs even sides, got {height} x {width}")
    if quarter_turns % 2 and height != width:
        raise ValueError(f"a {height} x {width} mask cannot be turned by 90 degrees; use a square patch")
    mask = torch.zeros(height, width)
    mask[: height // 2] = 1.0
    mask = torch.rot90(mask, int(quarter_turns) % 4, dims=(0, 1))
    return torch.flip(mask, dims=(1,)) if flip else mask


def hybrid_images(
    images: torch.Tensor,
    style_means: Sequence[Sequence[float]],
    style_stds: Sequence[Sequence[float]],
    generator: Optional[torch.Generator] = None,
    source: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``M * x + (1 - M) * x_style`` (PathFL eq. 9) with, per image, a style drawn uniformly from the pool
    and a half-plane mask in a random one of the 8 orientations (non-square images: the 4 that keep the
    shape). Labels are unchanged.

    Args:
        images: ``(B, C, H, W)``; volumes ``(B, C, X, Y, Z)`` get half-space masks (:func:`half_space_mask`).
        style_means, style_stds: the style pool, ``(M, C)`` each.
        source: whole-image ``(mean, std)`` of each patch, ``(B, C)`` each (:func:`adain_restyle`); ``None`` =
            each image's own statistics.
    Returns:
        ``(hybrids (B, C, H, W), restyled (B, C, H, W))``.
    """
    means = torch.as_tensor(style_means, dtype=images.dtype)
    stds = torch.as_tensor(style_stds, dtype=images.dtype)
    if means.dim() != 2 or means.shape != stds.shape or means.shape[1] != images.shape[1]:
        raise ValueError(f"style pool must be (M, {images.shape[1]}) means and stds, got {tuple(means.shape)} / {tuple(stds.shape)}")
    b = images.shape[0]
    pick = torch.randint(len(means), (b,), generator=generator)
    restyled = adain_restyle(images, means[pick].to(images.device), stds[pick].to(images.device), source=source)
    if images.dim() == 5:  # volumes (a user's 3-D network): the half-space analogue of the half-plane masks
        masks = torch.stack([half_space_mask(tuple(images.shape[2:]), generator) for _ in range(b)]).to(images)[:, None]
        return masks * images + (1 - masks) * restyled, restyled
    h, w = images.shape[2:]
    allowed = ORIENTATIONS if h == w else tuple(o for o in ORIENTATIONS if o[0] % 2 == 0)
    orient = torch.randint(len(allowed), (b,), generator=generator)
    masks = torch.stack([half_plane_mask(h, w, *allowed[int(i)]) for i in orient]).to(images)
    masks = masks[:, None]
    return masks * images + (1 - masks) * restyled, restyled
