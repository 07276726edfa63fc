"""Foreground Dice, HD95 and ASSD (and, on request, Jaccard and mIoU) from MONAI's metric implementations.

Metrics are computed on whatever grid they are given; the engine gives them the prediction at each
image's own size against the mask as stored, so distances are in pixels of the original image.

Per image, always: ``dice``, ``hd95``, ``assd`` over the whole image. Optionally:
  * with a field-of-view mask ``fov`` (DRIVE ships one): ``dice_fov``, ``hd95_fov``, ``assd_fov`` with
    prediction and truth both restricted to the FOV (pixels outside set to background);
  * with a pixel spacing in mm: ``hd95_mm``, ``assd_mm`` (over the FOV when there is one, else the whole
    image), from MONAI's ``spacing`` argument.

On request (``metrics=`` or ``train_config["eval_metrics"]``; FedEFM's downstream table uses them):
  * ``iou``: foreground Jaccard index ``|P & T| / |P | T|``;
  * ``miou``: mean IoU over all classes, background included (the segmentation-benchmark mIoU).

Multi-class (a label space with more than one foreground class, or with regions; :mod:`fedseg.data.labels`):
  * ``dice`` / ``hd95`` / ``assd`` (and ``iou``) are the mean over the foreground classes of each class's value
    (the headline; with one foreground class it is that class, so binary numbers are unchanged);
  * ``<metric>:<class>`` for every foreground class (one-vs-rest: the class's pixels against all others), and
    ``<metric>:<region>`` for every region, scored as a binary problem on the union of its classes (REFUGE's
    optic disc = rim + cup); FOV and mm variants likewise, e.g. ``dice_fov:cup``, ``hd95_mm:disc``.

Empty-mask policy (MONAI returns NaN/Inf there, which would poison averages), applied to each class and region
on its own, before any mean over classes:
  * Dice, IoU: prediction and truth both empty -> 1 (MONAI's ``ignore_empty=False``: a class absent from an
    image and correctly not predicted is a perfect score, so a mean over classes is never NaN).
  * HD95 / ASSD: both empty -> 0; exactly one empty -> the image diagonal, the largest distance
    possible on that grid, so a missed lesion is penalised instead of silently dropped.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from monai.metrics import DiceMetric, HausdorffDistanceMetric, MeanIoU, SurfaceDistanceMetric
from monai.networks.utils import one_hot

#: computed unless the caller asks for fewer
ALL_METRICS = ("dice", "hd95", "assd")
#: every metric a caller may ask for
AVAILABLE_METRICS = ALL_METRICS + ("iou", "miou")


class SegmentationMetrics:
    """Accumulate per-image foreground metrics over batches; ``aggregate()`` returns means,
    ``per_image()`` the values of each image in update order.

    ``update(pred_labels, labels, fov=None, spacing=None)`` takes integer label maps ``(B, 1, H, W)``
    (argmax of the logits), the ground truth ``(B, 1, H, W)``, optionally a field-of-view mask
    ``(B, 1, H, W)`` and a pixel spacing ``(row_mm, col_mm)`` shared by the batch (module docstring).

    With a multi-class ``label_space`` (:class:`fedseg.data.labels.LabelSpace`: more than one foreground class,
    or regions), each row also holds ``<metric>:<name>`` for every foreground class and every region (module
    docstring); the headline ``dice`` / ``hd95`` / ``assd`` stay the mean over the foreground classes.
    """

    def __init__(self, num_classes: int = 2, metrics: Sequence[str] = ALL_METRICS, label_space=None):
        unknown = set(metrics) - set(AVAILABLE_METRICS)
        if unknown:
            raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {AVAILABLE_METRICS}")
        if label_space is not None and label_space.num_classes != num_classes:
            raise ValueError(f"label space {label_space.describe()} does not have num_classes={num_classes}")
        self.num_classes = num_classes
        self.metrics = tuple(metrics)
        #: ``{name: class indices}`` scored on their own (per class / per region); empty for a binary space
        self.structures: Dict[str, Tuple[int, ...]] = (
            label_space.evaluated_structures() if label_space is not None and label_space.multi_class else {}
        )
        self._dice = DiceMetric(include_background=False, reduction="none", ignore_empty=False)
        self._hd95 = HausdorffDistanceMetric(include_background=False, percentile=95, reduction="none")
        self._assd = SurfaceDistanceMetric(include_background=False, symmetric=True, reduction="none")
        self._iou = MeanIoU(include_background=False, reduction="none", ignore_empty=False)
        self._miou = MeanIoU(include_background=True, reduction="none", ignore_empty=False)
        self._rows: List[Dict[str, float]] = []

    @property
    def _values(self) -> Dict[str, list]:
        """``{metric: [value per image that has it]}``."""
        names = list(dict.fromkeys(k for row in self._rows for k in row))
        return {m: [row[m] for row in self._rows if m in row] for m in names} or {m: [] for m in self.metrics}

    def update(
        self,
        pred_labels: torch.Tensor,
        labels: torch.Tensor,
        fov: Optional[torch.Tensor] = None,
        spacing: Optional[Sequence[float]] = None,
    ) -> None:
        rows = [dict() for _ in range(labels.shape[0])]
        self._score(rows, pred_labels, labels, "", None)
        if fov is not None:
            # restricted once: the FOV metrics and (below) the mm distances use the same pair
            inside = fov > 0
            pred_labels, labels = pred_labels * inside, labels * inside
            self._score(rows, pred_labels, labels, "_fov", None)
        if spacing is not None:
            self._score(rows, pred_labels, labels, "_mm", spacing, distances_only=True)
        self._rows.extend(rows)

    def _score(self, rows, pred_labels, labels, suffix: str, spacing, distances_only: bool = False) -> None:
        pred = one_hot(pred_labels.long(), self.num_classes)
        truth = one_hot(labels.long(), self.num_classes)
        diagonal = math.sqrt(sum((s * (1.0 if spacing is None else float(spacing[i]))) ** 2 for i, s in enumerate(labels.shape[2:])))
        per_class = self._per_channel(pred, truth, spacing, diagonal, distances_only)  # {metric: (B, C-1)}
        for name, values in per_class.items():
            for row, v in zip(rows, values.mean(dim=1).tolist()):
                row[name + suffix] = v
        if "miou" in self.metrics and not distances_only:
            for row, v in zip(rows, self._miou(pred, truth).mean(dim=1).tolist()):
                row["miou" + suffix] = v
            self._miou.reset()
        for structure, classes in self.structures.items():
            if len(classes) == 1:  # a class: its column of the per-class values
                values = {name: v[:, classes[0] - 1] for name, v in per_class.items()}
            else:  # a region: the union of its classes against the rest, as a binary problem
                inside_pred = _member(pred_labels, classes)
                inside_truth = _member(labels, classes)
                values = {name: v[:, 0] for name, v in self._per_channel(
                    one_hot(inside_pred, 2), one_hot(inside_truth, 2), spacing, diagonal, distances_only).items()}
            for name, v in values.items():
                for row, x in zip(rows, v.tolist()):
                    row[f"{name}{suffix}:{structure}"] = x

    def _per_channel(self, pred, truth, spacing, diagonal: float, distances_only: bool) -> Dict[str, torch.Tensor]:
        """``{metric: (B, K)}`` for the K foreground channels of one-hot ``pred`` / ``truth`` ``(B, K + 1, *spatial)``,
        with the empty-mask policy of the module docstring applied channel by channel."""
        out: Dict[str, torch.Tensor] = {}
        if "dice" in self.metrics and not distances_only:
            out["dice"] = self._dice(pred, truth)
            self._dice.reset()
        if "iou" in self.metrics and not distances_only:
            out["iou"] = self._iou(pred, truth)
            self._iou.reset()
        pred_empty = pred[:, 1:].flatten(2).sum(2) == 0  # (B, K)
        truth_empty = truth[:, 1:].flatten(2).sum(2) == 0
        kwargs = {} if spacing is None else {"spacing": [float(s) for s in spacing]}
        for name, metric in (("hd95", self._hd95), ("assd", self._assd)):
            if name not in self.metrics:
                continue
            with _quiet():
                value = metric(pred, truth, **kwargs)
            metric.reset()
            value = torch.where(pred_empty & truth_empty, torch.zeros_like(value), value)
            value = torch.where(pred_empty ^ truth_empty, torch.full_like(value, diagonal), value)
            out[name] = value
        return out

    def per_image(self) -> List[Dict[str, float]]:
        """One dict per image (update order) with every metric computed for it."""
        return [dict(row) for row in self._rows]

    def aggregate(self) -> Dict[str, float]:
        """Mean of each metric over the images that have it (``nan`` for a requested metric no image has)."""
        values = self._values
        out = {m: float("nan") for m in self.metrics}
        out.update({m: (float(sum(v) / len(v)) if v else float("nan")) for m, v in values.items()})
        return out

    def reset(self) -> None:
        self._rows = []


#: suffix of a metric scored after :func:`keep_largest_component` (``dice_lcc``, ``dice_lcc:cup``)
LARGEST_COMPONENT_SUFFIX = "_lcc"


def keep_largest_component(pred_labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Keep only the largest connected component of every foreground class in each image of a batch of class maps:
    ``(B, 1, *spatial)`` class indices -> the same shape and dtype, the removed pixels set to background (0).

    Components are ``scipy.ndimage.label``'s with its default structure, connectivity 1 (4-neighbours in 2-D, 6 in
    3-D), as the FedEvi reference code uses; each class on its own (MONAI's ``KeepLargestConnectedComponent`` with
    ``independent=True`` computes the same, but needs scikit-image). Of two equally large components the one with
    the lower label (first in scan order) is kept. A class with no pixel stays empty (the reference code turns an
    empty prediction into the whole image; we do not).
    """
    from scipy import ndimage

    out = pred_labels.detach().cpu().clone()
    maps = out.numpy()
    for image in maps:
        for c in range(1, int(num_classes)):
            inside = image[0] == c
            components, count = ndimage.label(inside)
            if count > 1:
                sizes = np.bincount(components.ravel())
                sizes[0] = 0  # background of this class
                image[0][inside & (components != int(sizes.argmax()))] = 0
    return out.to(pred_labels.device)


def largest_component_key(key: str) -> str:
    """The key of ``key``'s metric after :func:`keep_largest_component`: ``"dice" -> "dice_lcc"``,
    ``"dice:cup" -> "dice_lcc:cup"``, ``"hd95_fov" -> "hd95_fov_lcc"``."""
    from fedseg.data.labels import metric_key, split_metric_key

    base, name = split_metric_key(key)
    return base + LARGEST_COMPONENT_SUFFIX if name is None else metric_key(base + LARGEST_COMPONENT_SUFFIX, name)


def _member(label_map: torch.Tensor, classes: Sequence[int]) -> torch.Tensor:
    """``(B, 1, *spatial)`` class indices -> ``(B, 1, *spatial)`` long, 1 where the class is one of ``classes``."""
    inside = torch.zeros_like(label_map, dtype=torch.bool)
    for c in classes:
        inside |= label_map.long() == int(c)
    return inside.long()


class _quiet:
    """MONAI warns on every empty mask; the policy above handles those cases explicitly."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)
