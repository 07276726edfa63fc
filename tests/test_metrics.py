"""Dice / HD95 / ASSD from MONAI checked against brute-force numpy on small masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import binary_erosion

from fedseg.metrics import SegmentationMetrics


def _surface(mask: np.ndarray) -> np.ndarray:
    """Boundary pixels: in the mask but not in its 4-connected erosion (MONAI's default surface)."""
    return np.argwhere(mask & ~binary_erosion(mask, structure=np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]]), border_value=0))


def _directed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each point of a, Euclidean distance to the nearest point of b (brute force)."""
    return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)).min(axis=1)


def brute_force(pred: np.ndarray, truth: np.ndarray):
    dice = 2 * (pred & truth).sum() / (pred.sum() + truth.sum())
    sp, st = _surface(pred), _surface(truth)
    d_pt, d_tp = _directed(sp, st), _directed(st, sp)
    hd95 = max(np.percentile(d_pt, 95), np.percentile(d_tp, 95))
    assd = (d_pt.sum() + d_tp.sum()) / (len(d_pt) + len(d_tp))
    return dice, hd95, assd


def _random_blob(rng, size=24):
    yy, xx = np.mgrid[:size, :size]
    cy, cx, r = rng.integers(6, size - 6), rng.integers(6, size - 6), rng.integers(3, 6)
    return ((yy - cy) ** 2 + (xx - cx) ** 2) <= r**2


@pytest.mark.parametrize("seed", range(5))
def test_metrics_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    pred, truth = _random_blob(rng), _random_blob(rng)
    meter = SegmentationMetrics()
    meter.update(torch.as_tensor(pred)[None, None].long(), torch.as_tensor(truth)[None, None].float())
    got = meter.aggregate()
    dice, hd95, assd = brute_force(pred, truth)
    assert got["dice"] == pytest.approx(dice, abs=1e-6)
    assert got["hd95"] == pytest.approx(hd95, abs=1e-4)
    assert got["assd"] == pytest.approx(assd, abs=1e-4)


def test_mean_over_images_and_perfect_prediction():
    rng = np.random.default_rng(7)
    a, b = _random_blob(rng), _random_blob(rng)
    meter = SegmentationMetrics()
    preds = torch.as_tensor(np.stack([a, a]))[:, None].long()
    truths = torch.as_tensor(np.stack([a, b]))[:, None].float()
    meter.update(preds, truths)
    got = meter.aggregate()
    d_ab = brute_force(a, b)
    assert got["dice"] == pytest.approx((1.0 + d_ab[0]) / 2, abs=1e-6)
    assert got["hd95"] == pytest.approx(d_ab[1] / 2, abs=1e-4)


def test_empty_mask_policy():
    size = 16
    empty = torch.zeros(1, 1, size, size)
    blob = torch.zeros(1, 1, size, size)
    blob[..., 4:8, 4:8] = 1
    meter = SegmentationMetrics()
    meter.update(empty.long(), empty)  # both empty: perfect
    meter.update(empty.long(), blob)  # missed lesion: maximal distance
    got = meter._values
    assert got["dice"] == [1.0, 0.0]
    assert got["hd95"][0] == 0.0 and got["assd"][0] == 0.0
    assert got["hd95"][1] == pytest.approx(math.sqrt(2) * size)
    assert all(math.isfinite(v) for v in got["hd95"] + got["assd"])


def test_unknown_metric_rejected():
    with pytest.raises(ValueError, match="unknown metrics"):
        SegmentationMetrics(metrics=("dice", "volume_similarity"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_iou_and_miou_match_brute_force(seed):
    """Jaccard (foreground) and mIoU (background and foreground) against numpy set counts."""
    rng = np.random.default_rng(seed)
    pred = (rng.random((3, 1, 17, 23)) < 0.3).astype(np.int64)
    truth = (rng.random((3, 1, 17, 23)) < 0.4).astype(np.int64)
    meter = SegmentationMetrics(2, metrics=("dice", "iou", "miou"))
    meter.update(torch.from_numpy(pred), torch.from_numpy(truth))
    for i, row in enumerate(meter.per_image()):
        p, t = pred[i, 0].astype(bool), truth[i, 0].astype(bool)
        iou_fg = (p & t).sum() / (p | t).sum()
        iou_bg = (~p & ~t).sum() / (~p | ~t).sum()
        assert row["iou"] == pytest.approx(iou_fg, abs=1e-6)
        assert row["miou"] == pytest.approx((iou_fg + iou_bg) / 2, abs=1e-6)
        # Dice and Jaccard are tied by D = 2J / (1 + J): an independent cross-check
        assert row["dice"] == pytest.approx(2 * iou_fg / (1 + iou_fg), abs=1e-6)


def test_iou_empty_policy():
    """Both empty -> IoU 1 (as Dice); prediction empty but truth not -> 0."""
    empty = torch.zeros(1, 1, 8, 8, dtype=torch.long)
    some = empty.clone()
    some[..., 2:4, 2:4] = 1
    meter = SegmentationMetrics(2, metrics=("iou", "miou"))
    meter.update(empty, empty)
    meter.update(empty, some)
    both, missed = meter.per_image()
    assert both["iou"] == pytest.approx(1.0) and both["miou"] == pytest.approx(1.0)
    assert missed["iou"] == pytest.approx(0.0)
    assert missed["miou"] == pytest.approx((60 / 64) / 2)
