"""FVAC's two loss terms: uncertainty-weighted cross-entropy (FMUG, Eq. 9) and foreground/background
decoupled feature alignment (FVDA, Eqs. 10-11).

Shapes are written for 2D; all functions also accept 3D maps ``(B, C, D, H, W)``.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from fedseg.uncertainty.morphology import as_class_index


def fmug_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Eq. 9: ``-sum_{h,w} alpha(h,w) * log softmax(logits)_{Y(h,w)}(h,w)`` per image, mean over the batch.

    Args:
        logits: ``(B, C, H, W)``.
        labels: integer-valued ``(B, 1, H, W)``.
        alpha: pixel weights ``(B, 1, H, W)``, normally summing to 1 per image
            (:func:`fedseg.uncertainty.morphology.pixel_weight_map`); used as given, without gradient.

    Returns:
        scalar. With uniform ``alpha = 1 / (H W)`` it equals the mean pixel cross-entropy.
    """
    # log_softmax rather than log(softmax): finite even for saturated logits
    log_probs = F.log_softmax(logits.float(), dim=1)
    log_p_true = log_probs.gather(1, as_class_index(labels))  # (B, 1, H, W)
    per_image = -(alpha.detach() * log_p_true).flatten(1).sum(dim=1)
    return per_image.mean()


def resize_mask_nearest(labels: torch.Tensor, size: Tuple[int, ...]) -> torch.Tensor:
    """``(B, 1, H, W)`` -> ``(B, 1, *size)`` with torch's ``"nearest"`` rule.

    Output index ``i`` reads input index ``floor(i * in_size / out_size)`` (per axis), so an 8x8 mask
    read at 4x4 keeps rows/columns 0, 2, 4, 6. Nearest keeps the mask binary; no thresholding needed.
    """
    if tuple(labels.shape[2:]) == tuple(size):
        return labels
    return F.interpolate(labels.float(), size=tuple(size), mode="nearest")


#: how FVDA splits a multi-class mask (identical for a binary mask): foreground = every non-background class
#: together ("union", the default), or one mean feature per class, background included ("per_class")
FVDA_FOREGROUND = ("union", "per_class")

#: what FVDA's class feature vectors are divided by: ``"image"``, every pixel of the map (``H' W'``, Eq. 10 as printed:
#: a class's mean feature scaled by its pixel share), or ``"class"``, the class's own pixels (its plain mean feature,
#: which weighs thin vessels as much as the background)
FVDA_MEAN = ("image", "class")


def class_means(features: torch.Tensor, labels: torch.Tensor, num_classes: int, union_foreground: bool = False,
                mean: str = "image") -> torch.Tensor:
    """Eq. 10 for every class: ``F_k = (1 / N) sum_{h,w} F[:, h, w] * [S(h, w) = k]``, ``(B, K, C)``.

    Args:
        features: ``(B, C, H', W')``.
        labels: integer-valued ``(B, 1, H, W)``, resized to ``(H', W')`` by nearest neighbour.
        num_classes: K; labels >= K are counted in class K - 1 when ``union_foreground`` (K = 2: background and
            the union of every other class), never otherwise (they must not occur).
        mean: ``N`` is ``H' W'`` (``"image"``, as printed) or the class's pixel count ``|S = k|`` (``"class"``; a
            class absent from an image gives a zero vector, as under ``"image"``).
    """
    if mean not in FVDA_MEAN:
        raise ValueError(f"mean must be one of {FVDA_MEAN}, got {mean!r}")
    mask = as_class_index(resize_mask_nearest(labels, tuple(features.shape[2:])))
    if union_foreground:
        mask = mask.clamp(max=num_classes - 1)
    n_pixels = features[0, 0].numel()
    feats = features.flatten(2)  # (B, C, N)
    onehot = F.one_hot(mask.flatten(1), num_classes).to(feats.dtype)  # (B, N, K)
    sums = torch.einsum("bcn,bnk->bkc", feats, onehot)
    if mean == "image":
        return sums / n_pixels
    return sums / onehot.sum(dim=1).clamp_min(1.0).unsqueeze(-1)


def fvda_loss(feat_local: torch.Tensor, feat_global: torch.Tensor, labels: torch.Tensor, foreground: str = "union",
              num_classes: int = 2, mean: str = "image") -> torch.Tensor:
    """Eq. 11: ``(1/C)||F_fg^k - F_fg^g||^2 + (1/C)||F_bg^k - F_bg^g||^2`` per image, mean over the batch.

    Args:
        feat_local: local model's feature map ``(B, C, H', W')``; gradients flow into it.
        feat_global: frozen global model's map at the same layer, same shape; detached here so the
            global side is a fixed target.
        labels: integer-valued ``(B, 1, H, W)``.
        foreground: ``"union"`` (the two terms of Eq. 11, foreground = every non-background class) or
            ``"per_class"`` (one term per class of ``num_classes``, background included:
            ``sum_k (1/C)||F_k^k - F_k^g||^2``). Both equal Eq. 11 for a binary mask.
        num_classes: the segmentation classes (``per_class`` only).
        mean: what each class vector is divided by (:data:`FVDA_MEAN`, :func:`class_means`); ``"image"`` is Eq. 10.

    Returns:
        scalar (mean over batch and channels of the squared differences, summed over the terms).
    """
    if feat_local.shape != feat_global.shape:
        raise ValueError(f"feature maps differ in shape: {tuple(feat_local.shape)} vs {tuple(feat_global.shape)}")
    if foreground not in FVDA_FOREGROUND:
        raise ValueError(f"foreground must be one of {FVDA_FOREGROUND}, got {foreground!r}")
    k = 2 if foreground == "union" else int(num_classes)
    local = class_means(feat_local, labels, k, union_foreground=foreground == "union", mean=mean)
    target = class_means(feat_global.detach(), labels, k, union_foreground=foreground == "union", mean=mean)
    # mean over (B, C) of each term == batch mean of (1/C) * squared L2 norm; summed over the terms
    return ((local - target) ** 2).mean(dim=(0, 2)).sum()
