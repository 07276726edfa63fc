"""Per-class and per-region Dice / HD95 / ASSD (fedseg.metrics with a label space) against brute-force numpy/scipy
computations, the empty-class policy, and binary numbers unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import ndimage
from scipy.spatial.distance import cdist

from fedseg.data.labels import BINARY, LabelSpace
from fedseg.metrics import SegmentationMetrics

SPACE = LabelSpace.from_datalist({
    "labels": {"background": 0, "rim": 1, "cup": 2},
    "regions": {"disc": ["rim", "cup"], "cup": ["cup"]},
})


def _dice(p: np.ndarray, t: np.ndarray) -> float:
    if not p.any() and not t.any():
        return 1.0
    return 2.0 * np.logical_and(p, t).sum() / (p.sum() + t.sum())


def _edges(m: np.ndarray) -> np.ndarray:
    """Border pixels of a mask (the mask minus its erosion), as MONAI's surface distance takes them."""
    return np.argwhere(m & ~ndimage.binary_erosion(m))


def _hd95_assd(p: np.ndarray, t: np.ndarray, spacing=(1.0, 1.0)):
    """Brute force over all border-pixel pairs: 95th percentile of each directed distance set, max of the two;
    ASSD = mean of both sets together. Empty-mask policy of fedseg.metrics."""
    if not p.any() and not t.any():
        return 0.0, 0.0
    if not p.any() or not t.any():
        diagonal = math.hypot(p.shape[0] * spacing[0], p.shape[1] * spacing[1])
        return diagonal, diagonal
    ep, et = _edges(p) * np.asarray(spacing), _edges(t) * np.asarray(spacing)
    d = cdist(ep, et)
    forward, backward = d.min(axis=1), d.min(axis=0)
    hd95 = max(np.percentile(forward, 95), np.percentile(backward, 95))
    assd = (forward.sum() + backward.sum()) / (len(forward) + len(backward))
    return hd95, assd


def _random_disc_cup(rng, size=24):
    yy, xx = np.mgrid[:size, :size]
    cy, cx = rng.uniform(8, size - 8, 2)
    r = rng.uniform(4, 7)
    disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
    cup = (yy - cy - rng.uniform(-1, 1)) ** 2 + (xx - cx - rng.uniform(-1, 1)) ** 2 <= (r * rng.uniform(0.3, 0.6)) ** 2
    return disc.astype(np.int64) + (cup & disc).astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_class_and_region_metrics_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    truth, pred = _random_disc_cup(rng), _random_disc_cup(rng)
    spacing = (0.5, 0.8)
    meter = SegmentationMetrics(3, label_space=SPACE)
    meter.update(torch.as_tensor(pred)[None, None], torch.as_tensor(truth)[None, None], spacing=spacing)
    row = meter.per_image()[0]
    structures = {"rim": [1], "cup": [2], "disc": [1, 2]}
    for name, classes in structures.items():
        p, t = np.isin(pred, classes), np.isin(truth, classes)
        assert row[f"dice:{name}"] == pytest.approx(_dice(p, t), abs=1e-6), name
        hd, assd = _hd95_assd(p, t)
        assert row[f"hd95:{name}"] == pytest.approx(hd, rel=1e-5, abs=1e-5), name
        assert row[f"assd:{name}"] == pytest.approx(assd, rel=1e-5, abs=1e-5), name
        hd_mm, assd_mm = _hd95_assd(p, t, spacing)
        assert row[f"hd95_mm:{name}"] == pytest.approx(hd_mm, rel=1e-5, abs=1e-5), name
        assert row[f"assd_mm:{name}"] == pytest.approx(assd_mm, rel=1e-5, abs=1e-5), name
    # the headline metrics are the means over the foreground classes (not over regions)
    for metric in ("dice", "hd95", "assd"):
        assert row[metric] == pytest.approx((row[f"{metric}:rim"] + row[f"{metric}:cup"]) / 2, rel=1e-6)


def test_a_class_absent_from_truth_and_prediction_never_makes_a_mean_nan():
    truth = np.zeros((16, 16), np.int64)
    truth[4:12, 4:12] = 1  # no cup anywhere
    pred = truth.copy()
    meter = SegmentationMetrics(3, label_space=SPACE)
    meter.update(torch.as_tensor(pred)[None, None], torch.as_tensor(truth)[None, None])
    row = meter.per_image()[0]
    assert row["dice:cup"] == 1.0 and row["hd95:cup"] == 0.0 and row["assd:cup"] == 0.0  # MONAI's ignore_empty=False
    assert row["dice"] == 1.0 and all(math.isfinite(v) for v in row.values())
    # a missed class costs the image diagonal, in that class only
    pred[6:8, 6:8] = 2
    meter = SegmentationMetrics(3, label_space=SPACE)
    meter.update(torch.as_tensor(pred)[None, None], torch.as_tensor(truth)[None, None])
    row = meter.per_image()[0]
    assert row["hd95:cup"] == pytest.approx(math.hypot(16, 16)) and row["dice:cup"] == 0.0
    assert row["dice:disc"] == 1.0  # the region still matches: cup and rim together are the same pixels


def test_binary_numbers_are_unchanged_by_a_label_space():
    rng = np.random.default_rng(3)
    truth = (rng.random((2, 1, 20, 20)) < 0.3).astype(np.int64)
    pred = (rng.random((2, 1, 20, 20)) < 0.3).astype(np.int64)
    pred[1] = 0  # one image with an empty prediction
    plain, spaced = SegmentationMetrics(2), SegmentationMetrics(2, label_space=BINARY)
    for meter in (plain, spaced):
        meter.update(torch.as_tensor(pred), torch.as_tensor(truth), spacing=(0.5, 0.5))
    assert plain.per_image() == spaced.per_image()
    assert set(plain.per_image()[0]) == {"dice", "hd95", "assd", "hd95_mm", "assd_mm"}  # no per-class keys
    for i in range(2):
        assert plain.per_image()[i]["dice"] == pytest.approx(_dice(pred[i, 0] > 0, truth[i, 0] > 0), abs=1e-6)
