"""Label-aware pixel uncertainty and the FMUG pixel weight map (FVAC, Eqs. 6-8).

Shapes are written for 2D, ``(B, C, H, W)``; every function works the same on 3D ``(B, C, D, H, W)``
because reductions run over all dimensions after the channel axis.

Eq. 6 needs the label: a pixel the model gets right is "uncertain" by how weakly it separates the
classes (the smallest class probability), a pixel it gets wrong by how confident it is in the wrong
answer (the largest probability). For two classes both cases reduce to ``U = 1 - P_Y``.
"""

from __future__ import annotations

import torch


def as_class_index(labels: torch.Tensor) -> torch.Tensor:
    """``(B, 1, *spatial)`` integer-valued (int or float 0., 1., ...) -> ``(B, 1, *spatial)`` int64.

    Rounded before the cast so a float mask stored as 0.9999999 does not become class 0.
    """
    if labels.dtype.is_floating_point:
        labels = torch.round(labels)
    return labels.long()


def pixel_uncertainty(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Eq. 6 of FVAC: ``U = min_c P_c`` where ``argmax_c P == Y``, else ``U = max_c P_c``.

    Args:
        probs: class probabilities ``(B, C, H, W)`` (softmax output), ``C >= 2``.
        labels: integer-valued ground truth ``(B, 1, H, W)``.

    Returns:
        ``(B, 1, H, W)`` uncertainty in ``[0, 1]``, detached from the graph (it only ever feeds the
        weight map, which carries no gradient). Ties in ``argmax`` go to the lowest class index
        (``torch.argmax``), so a pixel with ``P = (0.5, 0.5)`` and label 0 counts as correct.
    """
    if probs.shape[1] < 2:
        raise ValueError(f"pixel_uncertainty needs C >= 2 class probabilities, got {probs.shape[1]}")
    if labels.shape[1] != 1 or labels.shape[0] != probs.shape[0] or labels.shape[2:] != probs.shape[2:]:
        raise ValueError(f"labels {tuple(labels.shape)} must be (B, 1, *spatial) matching probs {tuple(probs.shape)}")
    probs = probs.detach()
    correct = probs.argmax(dim=1, keepdim=True) == as_class_index(labels)
    low = probs.amin(dim=1, keepdim=True)
    high = probs.amax(dim=1, keepdim=True)
    return torch.where(correct, low, high)


def pixel_weight_map(u_local: torch.Tensor, u_global: torch.Tensor, mix: float = 0.5) -> torch.Tensor:
    """Eqs. 7-8: ``alpha = mix * U_g + (1 - mix) * U_k``, normalised to sum to 1 over each image.

    Args:
        u_local: local-model uncertainty ``U_k``, ``(B, 1, H, W)``.
        u_global: frozen-global-model uncertainty ``U_g``, ``(B, 1, H, W)``.
        mix: weight of the global map; the paper uses 0.5.

    Returns:
        ``alpha`` ``(B, 1, H, W)``, detached, each image summing to 1. An image whose combined
        uncertainty is exactly zero everywhere (every pixel right with probabilities saturated to 0/1
        in floating point) gets uniform weights ``1 / (H * W)``: the ratio is undefined there, and
        uniform weighting turns FMUG into plain cross-entropy for that image instead of a NaN.
    """
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix}")
    if u_local.shape != u_global.shape:
        raise ValueError(f"uncertainty maps differ in shape: {tuple(u_local.shape)} vs {tuple(u_global.shape)}")
    alpha = mix * u_global.detach() + (1.0 - mix) * u_local.detach()
    reduce_dims = tuple(range(1, alpha.ndim))
    total = alpha.sum(dim=reduce_dims, keepdim=True)
    uniform = torch.full_like(alpha, 1.0 / alpha[0].numel())
    return torch.where(total > 0, alpha / torch.where(total > 0, total, torch.ones_like(total)), uniform)
