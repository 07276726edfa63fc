"""Predictions of a volume back in the scan's own geometry, and the scan's voxel spacing.

Evaluation of a volume job predicts on the job's grid (reoriented to ``orientation``, resampled to
``target_spacing``: the image's evaluation transforms) while the label stays as stored on disk. Before any metric the
class scores go back through the image's recorded transforms with MONAI's ``Invertd`` — orientation and spacing undone,
scores interpolated (not nearest: the argmax comes after) — so every metric is computed in the scan's own geometry
and distances in mm come from its header.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import torch

__all__ = ["invert_to_scan", "scan_spacing", "plain"]


def plain(x: Any) -> torch.Tensor:
    """A MONAI ``MetaTensor`` (or anything tensor-like) as a plain ``torch.Tensor``."""
    return x.as_tensor() if hasattr(x, "as_tensor") else torch.as_tensor(x)


def invert_to_scan(batch: Dict[str, Any], scores: torch.Tensor, transform) -> torch.Tensor:
    """``scores (1, K, *grid)`` on the network's grid -> ``(1, K, *scan)`` in the geometry of ``batch["image"]``'s
    file, by inverting the invertible steps of ``transform`` recorded on the batch's image (one item per batch).

    Args:
        batch: an evaluation batch of one volume, ``batch["image"]`` a MetaTensor carrying its applied transforms.
        scores: class scores (or any channels) on the image's transformed grid.
        transform: the evaluation ``Compose`` that made ``batch["image"]``.
    """
    from monai.data import decollate_batch
    from monai.transforms import Invertd

    image = batch["image"]
    if image.shape[0] != 1:
        raise ValueError(f"volumes are evaluated one at a time, got a batch of {image.shape[0]}")
    item = decollate_batch({"image": image, "pred": scores.detach().cpu()})[0]
    inverted = Invertd(keys="pred", transform=transform, orig_keys="image", nearest_interp=False, to_tensor=True)(item)
    return plain(inverted["pred"])[None].to(scores.device)


def scan_spacing(label: Any) -> Sequence[float]:
    """Voxel spacing (mm) per array axis of a scan, from the affine its MetaTensor carries (the header's)."""
    from monai.data.utils import affine_to_spacing

    affine = label.affine
    if affine.ndim == 3:
        affine = affine[0]
    return [float(s) for s in affine_to_spacing(affine, r=len(label.shape) - 2)]
