"""Native resolution: sliding-window inference, metrics at each image's own size (FOV, mm), images of
other sizes than the network's grid, images smaller than a patch, and the cache budget.

Reference values are brute force: a direct full-image forward pass for the inferer, numpy surface
distances (every boundary point against every other) for the metrics, the masks as PIL reads them from
disk for the engine. Tiny 4-level networks and images of a few dozen pixels keep it to seconds on CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.ndimage import binary_erosion

from fedseg.engine import SegEngine
from fedseg.engine.spatial import WholeImagePredictor
from fedseg.metrics import SegmentationMetrics
from fedseg.objectives.base import ClientObjective, RoundContext

#: 4 levels: patches / resized images must be multiples of 8 and at least 16
TINY_NET = {"channels": [8, 16, 32, 64], "augment": False, "batch_size": 2, "local_epochs": 1, "seed": 0}
SW = {"spatial_mode": "patch", "patch_size": 32, "sw_overlap": 0.25, "sw_blend_mode": "gaussian", "sw_batch_size": 4}


# ----------------------------------------------------------------------------------------------
# brute-force references
# ----------------------------------------------------------------------------------------------


def _surface(mask: np.ndarray) -> np.ndarray:
    """Boundary pixels (row, col): in the mask but not in its 4-connected erosion, outside = background."""
    cross = np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]])
    return np.argwhere(mask & ~binary_erosion(mask, structure=cross, border_value=0)).astype(float)


def _directed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)).min(axis=1)


def brute_force(pred: np.ndarray, truth: np.ndarray, spacing=(1.0, 1.0)) -> dict:
    """Foreground Dice, HD95 and ASSD of two boolean (H, W) masks; distances with (row, col) spacing."""
    pred, truth = pred.astype(bool), truth.astype(bool)
    if not pred.any() and not truth.any():
        return {"dice": 1.0, "hd95": 0.0, "assd": 0.0}
    if not pred.any() or not truth.any():
        diag = math.hypot(truth.shape[0] * spacing[0], truth.shape[1] * spacing[1])
        return {"dice": 0.0, "hd95": diag, "assd": diag}
    dice = 2 * (pred & truth).sum() / (pred.sum() + truth.sum())
    sp, st = _surface(pred) * spacing, _surface(truth) * spacing
    d_pt, d_tp = _directed(sp, st), _directed(st, sp)
    hd95 = max(np.percentile(d_pt, 95), np.percentile(d_tp, 95))
    assd = (d_pt.sum() + d_tp.sum()) / (len(d_pt) + len(d_tp))
    return {"dice": float(dice), "hd95": float(hd95), "assd": float(assd)}


def _blob(shape, center, radius) -> np.ndarray:
    yy, xx = np.mgrid[: shape[0], : shape[1]]
    return ((yy - center[0]) ** 2 + ((xx - center[1]) * 0.8) ** 2) <= radius**2


def _as_tensor(mask: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(mask.astype(np.float32))[None, None]


# ----------------------------------------------------------------------------------------------
# sliding-window inference
# ----------------------------------------------------------------------------------------------


def _pointwise_net() -> torch.nn.Module:
    """A fully convolutional net with a 1x1 receptive field: a window sees exactly what the whole image does."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.Tanh(), torch.nn.Conv2d(8, 2, 1)).eval()


@pytest.mark.parametrize("size", [(70, 53), (20, 27), (32, 32), (33, 31)])
def test_sliding_window_equals_full_forward_pass(size):
    """Window 32 over sizes that are no multiple of it (and one smaller than it: MONAI pads the window
    and crops back): Gaussian blending of identical values is the value itself."""
    net = _pointwise_net()
    x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = WholeImagePredictor(SW)(net, x)
        want = net(x)
    assert got.shape == (2, 2, *size)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_sliding_window_blending_matters_for_a_wider_receptive_field():
    """Sanity check of the comparison above: with a 3x3 convolution the window borders differ from the full
    pass (zero padding at window edges), so equality there is not a tautology of the predictor."""
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 2, 3, padding=1).eval()
    x = torch.rand(1, 3, 70, 53, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = WholeImagePredictor(SW)(net, x), net(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() > 1e-3
    # away from every window border the receptive field lies inside each window: equal there
    torch.testing.assert_close(got[..., :1, :1], want[..., :1, :1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("size", [(70, 53), (20, 27)])
def test_sliding_window_feature_unet_keeps_image_size(size):
    from fedseg.bundle import load_bundle

    net = load_bundle(None, {"channels": [8, 16, 32, 64]}).get_parsed_content("network_def", lazy=False).eval()
    x = torch.rand(1, 3, *size)
    with torch.no_grad():
        out = WholeImagePredictor({**SW, "patch_size": 16})(net, x)
    assert out.shape == (1, 2, *size)
    assert torch.isfinite(out).all()


def test_resize_mode_predictor_is_one_forward_pass():
    net = _pointwise_net()
    x = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(WholeImagePredictor({"spatial_mode": "resize"})(net, x), net(x))


# ----------------------------------------------------------------------------------------------
# metrics at the original size: whole image, inside a FOV, in mm
# ----------------------------------------------------------------------------------------------


CASES = {  # name -> (shape, pred blob, truth blob)
    "wide": ((37, 61), ((18, 25), 9), ((20, 30), 8)),
    "tall": ((58, 29), ((30, 14), 10), ((26, 15), 7)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_metrics_at_original_size_match_brute_force(case):
    shape, (pc, pr), (tc, tr) = CASES[case]
    pred, truth = _blob(shape, pc, pr), _blob(shape, tc, tr)
    meter = SegmentationMetrics()
    meter.update(_as_tensor(pred).long(), _as_tensor(truth))
    (row,) = meter.per_image()
    ref = brute_force(pred, truth)
    for name in ("dice", "hd95", "assd"):
        assert row[name] == pytest.approx(ref[name], abs=1e-4), name


@pytest.mark.parametrize("case", sorted(CASES))
def test_fov_metrics_match_brute_force_inside_fov(case):
    """``*_fov``: prediction and truth both set to background outside the FOV; the whole-image values
    are unchanged by passing a FOV."""
    shape, (pc, pr), (tc, tr) = CASES[case]
    pred, truth = _blob(shape, pc, pr), _blob(shape, tc, tr)
    fov = np.zeros(shape, bool)
    fov[: shape[0] // 2 + 3, :] = True  # cuts through both blobs
    meter = SegmentationMetrics()
    meter.update(_as_tensor(pred).long(), _as_tensor(truth), fov=_as_tensor(fov))
    (row,) = meter.per_image()
    whole, inside = brute_force(pred, truth), brute_force(pred & fov, truth & fov)
    assert inside["dice"] != pytest.approx(whole["dice"], abs=1e-3)  # the FOV changes the answer
    for name in ("dice", "hd95", "assd"):
        assert row[name] == pytest.approx(whole[name], abs=1e-4), name
        assert row[name + "_fov"] == pytest.approx(inside[name], abs=1e-4), name


def test_mm_metrics_with_anisotropic_spacing_match_brute_force():
    """``hd95_mm`` / ``assd_mm`` with spacing (0.5, 0.25) mm for (row, column) of the tensor given to
    the meter: brute force on coordinates scaled by the same factors."""
    shape, (pc, pr), (tc, tr) = CASES["wide"]
    pred, truth = _blob(shape, pc, pr), _blob(shape, tc, tr)
    spacing = (0.5, 0.25)
    meter = SegmentationMetrics()
    meter.update(_as_tensor(pred).long(), _as_tensor(truth), spacing=spacing)
    (row,) = meter.per_image()
    ref, ref_px = brute_force(pred, truth, spacing), brute_force(pred, truth)
    assert ref["hd95"] != pytest.approx(ref_px["hd95"] * 0.5, abs=1e-3)  # anisotropy matters here
    assert row["hd95_mm"] == pytest.approx(ref["hd95"], abs=1e-4)
    assert row["assd_mm"] == pytest.approx(ref["assd"], abs=1e-4)
    assert row["hd95"] == pytest.approx(ref_px["hd95"], abs=1e-4)


# ----------------------------------------------------------------------------------------------
# the engine on images of their own sizes
# ----------------------------------------------------------------------------------------------


def _write_site(root: Path, sizes, spacing=None, fov=False, spatial_mode=None) -> Path:
    """A site whose images have the given (H, W) sizes: textured RGB, a vessel-like bar and a blob as the
    mask (away from the border), optionally a FOV (an ellipse) and a top-level pixel spacing. Every
    split holds a copy of each image (a datalist may not list one file twice)."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    data = {"name": "native-test"}
    for split in ("training", "validation", "test"):
        data[split] = _write_images(root, split, sizes, fov, np.random.default_rng(0))
    if spacing is not None:
        data["spacing"] = list(spacing)
    if spatial_mode is not None:
        data["spatial_mode"] = spatial_mode
    path = root / "datalist.json"
    path.write_text(json.dumps(data))
    return path


def _write_images(root: Path, split: str, sizes, fov: bool, rng) -> list:
    entries = []
    for j, (h, w) in enumerate(sizes):
        i = f"{split}_{j}"
        label = _blob((h, w), (h * 0.45, w * 0.55), min(h, w) * 0.22)
        label[h // 3 : h // 3 + 2, w // 8 : w - w // 8] = True
        img = (rng.random((h, w, 3)) * 120).astype(np.uint8)
        img[label] = np.clip(img[label].astype(int) + 110, 0, 255).astype(np.uint8)
        entry = {"image": f"images/{i}.png", "label": f"labels/{i}.png"}
        Image.fromarray(img).save(root / entry["image"])
        Image.fromarray(label.astype(np.uint8) * 255).save(root / entry["label"])
        if fov:
            (root / "fov").mkdir(exist_ok=True)
            yy, xx = np.mgrid[:h, :w]
            disk = ((yy - h / 2) / (0.45 * h)) ** 2 + ((xx - w / 2) / (0.4 * w)) ** 2 <= 1
            entry["fov"] = f"fov/{i}.png"
            Image.fromarray(disk.astype(np.uint8) * 255).save(root / entry["fov"])
        entries.append(entry)
    return entries


def _read_mask(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path)) > 0


def test_engine_scores_at_original_size_resize_mode(tmp_path):
    """Resize mode, image_size 16, images of other (non-square) sizes: every metric — whole image, inside
    the FOV, in mm — equals brute force on the argmax at the image's own size against the mask on disk."""
    sizes = [(40, 52), (47, 33), (24, 24)]
    spacing = (0.5, 0.25)  # mm per (row, column) of the image as PIL shows it
    datalist = _write_site(tmp_path / "site", sizes, spacing=spacing, fov=True)
    engine = SegEngine("s", datalist, {**TINY_NET, "spatial_mode": "resize", "image_size": 16}, device=torch.device("cpu"))
    model = engine.build_network()
    engine.train(model, ClientObjective(), RoundContext("s", 0, 1))  # some structure in the prediction

    means, rows = engine.evaluate(model, "test", per_image=True)
    outputs = list(engine.iterate_logits(model, "test"))
    entries = json.loads(datalist.read_text())["test"]
    assert len(rows) == len(outputs) == len(sizes)
    for (h, w), entry, row, (inputs, labels, logits, _) in zip(sizes, entries, rows, outputs):
        # MONAI's PIL reader indexes (x, y): tensors are (W, H); transpose to compare with PIL's (H, W)
        assert logits.shape[2:] == labels.shape[2:] == inputs.shape[2:] == (w, h)
        truth = _read_mask(tmp_path / "site" / entry["label"])
        fov = _read_mask(tmp_path / "site" / entry["fov"])
        np.testing.assert_array_equal(labels[0, 0].numpy().T > 0, truth)
        pred = logits.argmax(1)[0].numpy().T.astype(bool)
        whole, inside = brute_force(pred, truth), brute_force(pred & fov, truth & fov)
        in_mm = brute_force(pred & fov, truth & fov, spacing)
        for name in ("dice", "hd95", "assd"):
            assert row[name] == pytest.approx(whole[name], abs=1e-4), (entry["image"], name)
            assert row[name + "_fov"] == pytest.approx(inside[name], abs=1e-4), (entry["image"], name)
        for name in ("hd95", "assd"):
            assert row[name + "_mm"] == pytest.approx(in_mm[name], abs=1e-4), (entry["image"], name)
    assert means["dice"] == pytest.approx(np.mean([r["dice"] for r in rows]))


# ----------------------------------------------------------------------------------------------
# bad input: an image smaller than the patch
# ----------------------------------------------------------------------------------------------


def test_image_smaller_than_patch_is_zero_padded(tmp_path):
    """Documented behaviour (fedseg.engine.spatial): an image smaller than ``patch_size`` is zero-padded
    (label 0) to the patch size before cropping; training batches keep the patch size and evaluation
    scores the image at its own 20 x 20."""
    datalist = _write_site(tmp_path / "site", [(20, 20)], spatial_mode="patch")
    cfg = {**TINY_NET, "patch_size": 32, "patch_samples": 3, "batch_size": 1}
    engine = SegEngine("s", datalist, cfg, device=torch.device("cpu"))
    assert engine.spatial_mode == "patch"
    truth = _read_mask(tmp_path / "site" / "labels" / "test_0.png")

    batch = next(iter(engine.loader("training", train=True)))
    assert batch["image"].shape == (3, 3, 32, 32) and batch["label"].shape == (3, 1, 32, 32)
    for k in range(3):  # symmetric padding, 6 px on each side; the crop is the whole padded image
        label = batch["label"][k, 0].numpy()
        np.testing.assert_array_equal(label[6:26, 6:26].T > 0, truth)
        inside = np.zeros((32, 32), bool)
        inside[6:26, 6:26] = True
        assert (label[~inside] == 0).all() and (batch["image"][k][:, ~inside] == 0).all()

    model = engine.build_network()
    losses = engine.train(model, ClientObjective(), RoundContext("s", 0, 1))
    assert math.isfinite(losses["train_loss"])
    (_, labels, logits, _), = list(engine.iterate_logits(model, "test"))
    assert logits.shape == (1, 2, 20, 20) and labels.shape == (1, 1, 20, 20)
    means, (row,) = engine.evaluate(model, "test", per_image=True)
    pred = logits.argmax(1)[0].numpy().T.astype(bool)
    assert row["dice"] == pytest.approx(brute_force(pred, truth)["dice"], abs=1e-6)
    assert all(math.isfinite(v) for v in means.values())


# ----------------------------------------------------------------------------------------------
# cache budget
# ----------------------------------------------------------------------------------------------


def test_cache_budget_limits_cached_images(tmp_path):
    """With a budget for three 32 x 32 training items ((3 + 1) channels x 4 B x 1024 px = 16 KiB each),
    three of the training images are cached, the rest decoded on access; training and evaluation still
    work and the booked memory never exceeds the budget."""
    from fedseg.data.synthetic import generate_site_data

    datalist = generate_site_data("vessel", "site-1", tmp_path, profile="tiny")
    budget_mb = (3 * 16 * 1024 + 100) / 2**20
    cfg = {**TINY_NET, "patch_size": 16, "cache_max_mb": budget_mb}
    engine = SegEngine("s", datalist, cfg, device=torch.device("cpu"))
    assert engine.spatial_mode == "patch"
    n_train = len(engine.data["training"])
    assert n_train > 3

    train_ds = engine._dataset("training", train=True)
    assert train_ds.cache_num == 3 and len(train_ds._cache) == 3
    assert engine.cache.used_mb <= budget_mb
    model = engine.build_network()
    result = engine.train(model, ClientObjective(), RoundContext("s", 0, 1))
    assert math.isfinite(result["train_loss"]) and result["steps"] == math.ceil(n_train / 2)
    means = engine.evaluate(model, "test")
    assert 0.0 <= means["dice"] <= 1.0
    assert engine._dataset("test", train=False).cache_num == 0  # nothing left for the test split
    assert engine.cache.used_mb <= budget_mb

    unbounded = SegEngine("s", datalist, {**cfg, "cache_max_mb": None}, device=torch.device("cpu"))
    assert unbounded._dataset("training", train=True).cache_num == n_train
    # the same predictions whether an image came from the cache or was decoded again
    torch.testing.assert_close(unbounded.evaluate(model, "test")["dice"], means["dice"])


def test_pooled_datalist_keeps_each_data_sets_rescale(tmp_path):
    """The pooled reference mixes data sets: each entry keeps its own fixed factor and patch mode stays on."""
    import json

    from fedseg.bench.runs import pooled_datalist
    from fedseg.config import resolve_profile
    from fedseg.data.synthetic import generate_site_data
    from fedseg.engine.engine import SegEngine

    a = generate_site_data("vessel", "site-1", tmp_path / "data", profile="tiny")
    b = generate_site_data("vessel", "site-2", tmp_path / "data", profile="tiny")
    info = json.loads(b.read_text())
    info["rescale"] = 0.5
    b.write_text(json.dumps(info))
    pooled = pooled_datalist({"site-1": str(a), "site-2": str(b)}, tmp_path / "pooled" / "datalist.json")
    data = json.loads(pooled.read_text())
    assert data["spatial_mode"] == "patch"
    n_a = len(json.loads(a.read_text())["training"])
    assert [e["rescale"] for e in data["training"]] == [1.0] * n_a + [0.5] * (len(data["training"]) - n_a)

    cfg = resolve_profile("tiny")["train_config"]
    engine = SegEngine("pooled", pooled, cfg)
    assert engine.spatial_mode == "patch"
    dataset = engine._dataset("training", train=False)  # deterministic part: whole images after rescaling
    sizes = [tuple(dataset[i]["image"].shape[1:]) for i in range(len(dataset))]
    assert sizes[:n_a] == [(32, 32)] * n_a and set(sizes[n_a:]) == {(16, 16)}


def test_run_records_the_sites_common_spatial_mode(tmp_path):
    """`fedseg run --site-datalists` writes the mode every datalist declares into the job's train_config
    (so the checkpoint tells `fedseg infer` how to run the model); mixed declarations leave it to each site."""
    from fedseg.data.datalist import common_spatial_mode
    from fedseg.data.synthetic import generate_site_data

    vessel = [generate_site_data("vessel", s, tmp_path, profile="tiny") for s in ("site-1", "site-2")]
    polyp = generate_site_data("polyp", "site-3", tmp_path, profile="tiny")
    assert common_spatial_mode(vessel) == "patch"
    assert common_spatial_mode([polyp]) == "resize"
    assert common_spatial_mode(vessel + [polyp]) is None
