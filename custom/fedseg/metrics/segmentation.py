"""Foreground Dice, HD95 and ASSD from MONAI's metric implementations.

Empty-mask policy (MONAI returns NaN/Inf there, which would poison averages):
  * Dice: prediction and truth both empty -> 1 (``ignore_empty=False``).
  * HD95 / ASSD: both empty -> 0; exactly one empty -> the image diagonal, the largest distance
    possible on that grid, so a missed lesion is penalised instead of silently dropped.
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence

import torch
from monai.metrics import DiceMetric, HausdorffDistanceMetric, SurfaceDistanceMetric
from monai.networks.utils import one_hot

ALL_METRICS = ("dice", "hd95", "assd")


class SegmentationMetrics:
    """Accumulate per-image foreground metrics over batches; ``aggregate()`` returns means.

    ``update(pred_labels, labels)`` takes integer label maps ``(B, 1, H, W)`` (argmax of the logits)
    and the ground truth ``(B, 1, H, W)``.
    """

    def __init__(self, num_classes: int = 2, metrics: Sequence[str] = ALL_METRICS):
        unknown = set(metrics) - set(ALL_METRICS)
        if unknown:
            raise ValueError(f"unknown metrics {sorted(unknown)}; choose from {ALL_METRICS}")
        self.num_classes = num_classes
        self.metrics = tuple(metrics)
        self._dice = DiceMetric(include_background=False, reduction="none", ignore_empty=False)
        self._hd95 = HausdorffDistanceMetric(include_background=False, percentile=95, reduction="none")
        self._assd = SurfaceDistanceMetric(include_background=False, symmetric=True, reduction="none")
        self._values: Dict[str, list] = {m: [] for m in self.metrics}

    def update(self, pred_labels: torch.Tensor, labels: torch.Tensor) -> None:
        pred = one_hot(pred_labels.long(), self.num_classes)
        truth = one_hot(labels.long(), self.num_classes)
        diagonal = math.sqrt(sum(s**2 for s in labels.shape[2:]))
        pred_empty = pred[:, 1:].flatten(1).sum(1) == 0
        truth_empty = truth[:, 1:].flatten(1).sum(1) == 0
        if "dice" in self.metrics:
            self._values["dice"].extend(self._dice(pred, truth).mean(dim=1).tolist())
        for name, metric in (("hd95", self._hd95), ("assd", self._assd)):
            if name not in self.metrics:
                continue
            with _quiet():
                value = metric(pred, truth).mean(dim=1)
            value = torch.where(pred_empty & truth_empty, torch.zeros_like(value), value)
            value = torch.where(pred_empty ^ truth_empty, torch.full_like(value, diagonal), value)
            self._values[name].extend(value.tolist())

    def aggregate(self) -> Dict[str, float]:
        return {m: (float(sum(v) / len(v)) if v else float("nan")) for m, v in self._values.items()}

    def per_image(self) -> List[Dict[str, float]]:
        """One dict per image, in ``update`` order, keyed by this meter's metrics (same policy as ``aggregate``)."""
        n = len(self._values[self.metrics[0]]) if self.metrics else 0
        return [{m: float(self._values[m][i]) for m in self.metrics} for i in range(n)]

    def reset(self) -> None:
        self._values = {m: [] for m in self.metrics}


class _quiet:
    """MONAI warns on every empty mask; the policy above handles those cases explicitly."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)
