"""Window sample for GraphFedSeg's U_i and FedEvi's G / A / R_paper at native resolution
(``fedseg.uncertainty.window_sample``; docs/methods.md).

References are independent of the sampler: the tiling is checked pixel by pixel, the padding against
MONAI's ``SpatialPad``; the estimators against (a) the whole-image pass itself — MONAI's sliding window —
on images the non-overlapping tiling reproduces exactly, and (b) a NumPy / SciPy computation over the
sampled cells with a pointwise network, whose value at a pixel does not depend on the window around it.
Tiny networks and images of a few dozen pixels keep it to seconds on CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from monai.transforms import SpatialPad
from PIL import Image
from scipy.special import digamma

from fedseg.engine import SegEngine
from fedseg.objectives.base import RoundContext
from fedseg.objectives.fedevi import FedEviObjective
from fedseg.objectives.graphfedseg import GraphFedSegObjective
from fedseg.uncertainty.window_sample import (
    allocate_windows,
    cells_in_split,
    check_window_count,
    crop_windows,
    sample_generator,
    sample_windows,
    tile_cells,
    window_cell_size,
)

PATCH = 16
#: 3 levels: a 16 px window passes every pooling level
TINY = {"channels": [4, 8, 16], "augment": False, "batch_size": 2, "local_epochs": 1, "seed": 0,
        "spatial_mode": "patch", "patch_size": PATCH, "sw_batch_size": 3}
#: MONAI-tiled sizes (multiples of the patch), an axis shorter than the patch, and one that is neither
TILED_SIZES = [(32, 48), (16, 16), (10, 32), (48, 13)]
OTHER_SIZES = [(37, 29), (21, 40)]


# ----------------------------------------------------------------------------------------------
# geometry
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(70, 53), (20, 27), (32, 32), (64, 96), (33, 31), (5, 40)])
def test_tiling_covers_every_pixel_exactly_once(shape):
    count = np.zeros(shape, int)
    for (r0, r1), (c0, c1) in tile_cells(shape, 32):
        assert 0 <= r0 < r1 <= shape[0] and 0 <= c0 < c1 <= shape[1]
        assert r1 - r0 <= 32 and c1 - c0 <= 32
        count[r0:r1, c0:c1] += 1
    assert (count == 1).all()
    assert cells_in_split([shape, shape], 32) == 2 * len(tile_cells(shape, 32))


@pytest.mark.parametrize("cell", [32, 24])
@pytest.mark.parametrize("shape", [(70, 53), (20, 27), (32, 32), (33, 31), (5, 40)])
def test_each_window_holds_its_cell_and_only_image_or_monai_padding(shape, cell):
    """The mask's pixels of a window are exactly the cell's pixels of the image (in order); the window is
    a patch-size crop of the image padded the way MONAI's SpatialPad pads it symmetrically; a cell smaller
    than the window sits (patch - cell) / 2 px from the window's border unless the image border is nearer."""
    patch = 32
    margin = (patch - cell) // 2
    image = torch.arange(3 * shape[0] * shape[1], dtype=torch.float32).reshape(3, *shape) + 1  # unique, non-zero
    cells = tile_cells(shape, cell)
    windows, masks = crop_windows(image, cells, patch, cell)
    assert windows.shape == (len(cells), 3, patch, patch) and masks.shape == (len(cells), 1, patch, patch)
    padded = SpatialPad(spatial_size=[max(s, patch) for s in shape], method="symmetric")(image)
    padded = torch.as_tensor(padded)
    pads = [(max(patch - s, 0) // 2) for s in shape]
    for window, mask, cell_bounds in zip(windows, masks, cells):
        (r0, r1), (c0, c1) = cell_bounds
        got = window[:, mask[0]].reshape(3, r1 - r0, c1 - c0)
        torch.testing.assert_close(got, image[:, r0:r1, c0:c1], rtol=0, atol=0)
        # find the window in the padded image by brute force
        found = [(i, j) for i in range(padded.shape[1] - patch + 1) for j in range(padded.shape[2] - patch + 1)
                 if torch.equal(padded[:, i : i + patch, j : j + patch], window)]
        assert len(found) == 1
        for axis, ((start, _), size) in enumerate(zip(cell_bounds, shape)):
            offset = int(mask[0].nonzero()[:, axis].min())  # where the cell starts inside the window
            origin = found[0][axis]
            assert offset == start + pads[axis] - origin
            if margin <= start + pads[axis] <= max(size, patch) - patch + margin:  # room on both sides
                assert offset == margin


# ----------------------------------------------------------------------------------------------
# the sample: sizes, balance, determinism
# ----------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(1, 12), min_size=1, max_size=8), num=st.integers(1, 120), seed=st.integers(0, 10**6))
def test_allocation_is_as_even_as_the_images_allow(counts, num, seed):
    taken = allocate_windows(counts, num, torch.Generator().manual_seed(seed))
    assert sum(taken) == min(num, sum(counts))
    assert all(0 <= t <= c for t, c in zip(taken, counts))
    # an image below its cap holds at least as many as every other image, minus one
    for t, c in zip(taken, counts):
        if t < c:
            assert all(t >= other - 1 for other in taken)
    if num >= sum(counts):
        assert taken == counts


def test_cell_is_the_sliding_window_stride():
    assert [window_cell_size(64, o) for o in (0.0, 0.25, 0.5)] == [64, 48, 32]
    with pytest.raises(ValueError, match="sw_overlap"):
        window_cell_size(64, 1.0)


def test_sample_is_every_cell_when_it_is_large_enough():
    shapes = [(40, 33), (16, 16), (7, 50)]
    total = cells_in_split(shapes, PATCH)
    sample = sample_windows(shapes, PATCH, total, torch.Generator().manual_seed(0))
    assert [s.index for s in sample] == [0, 1, 2]
    assert [list(s.cells) for s in sample] == [tile_cells(shape, PATCH) for shape in shapes]
    assert sum(len(s.cells) for s in sample) == total


def test_sample_is_seeded_per_site_round_and_purpose():
    shapes = [(64, 64)] * 6  # 16 cells each
    draw = lambda *key: [(s.index, s.cells) for s in sample_windows(shapes, PATCH, 10, sample_generator(*key))]  # noqa: E731
    first = draw(0, "site-a", 3, "u")
    assert draw(0, "site-a", 3, "u") == first  # deterministic (a restarted site draws the same)
    for other in [(0, "site-b", 3, "u"), (0, "site-a", 4, "u"), (0, "site-a", 3, "g"), (1, "site-a", 3, "u")]:
        assert draw(*other) != first, other
    assert sum(len(cells) for _, cells in first) == 10
    # cells of one image are distinct (drawn without replacement)
    assert all(len(set(cells)) == len(cells) for _, cells in first)


def test_fewer_windows_than_images_samples_images():
    sample = sample_windows([(32, 32)] * 10, PATCH, 4, torch.Generator().manual_seed(1))
    assert len(sample) == 4 and all(len(s.cells) == 1 for s in sample)
    assert sorted(s.index for s in sample) == [s.index for s in sample]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "all", True, [4]])
def test_bad_window_count_is_refused_with_the_option_name(bad):
    with pytest.raises(ValueError, match="uncertainty_windows"):
        check_window_count(bad, "uncertainty_windows")
    with pytest.raises(ValueError, match="uncertainty_windows"):
        GraphFedSegObjective(uncertainty_windows=bad)
    with pytest.raises(ValueError, match="surrogate_windows"):
        FedEviObjective(surrogate_windows=bad)
    assert check_window_count(None, "x") is None and check_window_count("whole_image", "x") is None
    assert check_window_count(64, "x") == 64 and check_window_count(64.0, "x") == 64


# ----------------------------------------------------------------------------------------------
# estimators on a real engine
# ----------------------------------------------------------------------------------------------


def _write_site(root: Path, sizes) -> Path:
    """Textured RGB images of the given (H, W) with a bright blob as the mask, in every split."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    rng = np.random.default_rng(0)
    data = {"name": "window-test", "spatial_mode": "patch"}
    for split in ("training", "validation", "test"):
        data[split] = []
        for j, (h, w) in enumerate(sizes):
            yy, xx = np.mgrid[:h, :w]
            label = (yy - h / 2) ** 2 + (xx - w / 2) ** 2 <= (min(h, w) / 3) ** 2
            img = (rng.random((h, w, 3)) * 120).astype(np.uint8)
            img[label] += 100
            entry = {"image": f"images/{split}_{j}.png", "label": f"labels/{split}_{j}.png"}
            Image.fromarray(img).save(root / entry["image"])
            Image.fromarray(label.astype(np.uint8) * 255).save(root / entry["label"])
            data[split].append(entry)
    path = root / "datalist.json"
    path.write_text(json.dumps(data))
    return path


def _engine(tmp_path, sizes, **cfg) -> SegEngine:
    return SegEngine("site-a", _write_site(tmp_path / "site", sizes), {**TINY, **cfg}, device=torch.device("cpu"))


def _uncertainty(engine, model, windows, round_=0) -> float:
    objective = GraphFedSegObjective(uncertainty_windows=windows)
    ctx = RoundContext("site-a", round_, 5, server_meta={}, train_config=engine.train_config)
    objective.begin_round(ctx, model)
    return objective.end_round(ctx, model, engine)["uncertainty"]


def _surrogate(engine, local, surrogate, windows, round_=2) -> dict:
    objective = FedEviObjective(surrogate_windows=windows)
    ctx = RoundContext("site-a", round_, 5, server_meta={"fedevi": {"round": round_}}, train_config=engine.train_config)
    with_update = objective.end_round(ctx, local, engine)  # A and R_paper of the local model
    return {**with_update, **objective.handle_task("evaluate_surrogate", ctx, surrogate, engine)}  # + G


def _unet(engine, seed):
    torch.manual_seed(seed)
    return engine.build_network()


def test_full_sample_equals_the_whole_image_pass_where_the_tiling_is_the_sliding_window(tmp_path):
    """Images the non-overlapping sliding window tiles exactly (sizes multiple of the patch, or shorter than
    it: MONAI pads and crops back): with every cell sampled, U, G, A and R_paper equal the whole-image pass
    (MONAI's sliding window, overlap 0) for a real U-Net whose output depends on the whole window."""
    engine = _engine(tmp_path, TILED_SIZES, sw_overlap=0.0)
    local, surrogate = _unet(engine, 0), _unet(engine, 1)
    assert engine.window_cell == PATCH  # overlap 0: the cells are the sliding window's own windows
    every = cells_in_split(engine.grid_shapes("training"), PATCH)
    assert every == 6 + 1 + 2 + 3
    assert _uncertainty(engine, local, every) == pytest.approx(_uncertainty(engine, local, None), rel=1e-6)
    sampled, whole = _surrogate(engine, local, surrogate, every), _surrogate(engine, local, surrogate, "whole_image")
    assert sampled == pytest.approx(whole, rel=1e-5)

    # not a tautology: with overlapping, blended windows (the default) the whole-image pass differs
    blended = _engine(tmp_path / "b", TILED_SIZES, sw_overlap=0.5)
    local_b = _unet(blended, 0)
    every_b = cells_in_split(blended.grid_shapes("training"), blended.window_cell)
    assert abs(_uncertainty(blended, local_b, every_b) - _uncertainty(blended, local_b, None)) > 1e-6


def _pointwise_net(seed=0) -> torch.nn.Module:
    """1x1 receptive field: a pixel's logits do not depend on the window around it."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.Tanh(), torch.nn.Conv2d(8, 2, 1), torch.nn.Tanh())


def _pixel_logits(engine, net, split):
    """Logits of every whole image of ``split`` on the network grid, by one direct forward pass (C, H, W)."""
    dataset = engine._dataset(split, False)
    with torch.no_grad():
        return [net(torch.as_tensor(dataset[i]["image"])[None])[0].double().numpy() for i in range(len(dataset))]


def _cell_mean(pixel_map: np.ndarray, cells) -> float:
    values = np.concatenate([pixel_map[r0:r1, c0:c1].ravel() for (r0, r1), (c0, c1) in cells])
    return float(values.mean())


def test_sampled_u_is_the_mean_over_sampled_images_of_their_cells_pixel_mean(tmp_path):
    """Eqs. 3-4 on the sample, recomputed with NumPy: vacuity C / S per pixel from a direct forward pass,
    averaged over each sampled image's sampled cells, then over the sampled images."""
    engine = _engine(tmp_path, TILED_SIZES + OTHER_SIZES)
    net = _pointwise_net()
    logits = _pixel_logits(engine, net, "training")
    for windows, round_ in ((5, 0), (9, 3), (3, 1)):  # fewer windows than images, a few per image
        sample = engine.window_sample("training", windows, round_, "graphfedseg_uncertainty")
        assert sum(len(s.cells) for s in sample) == windows
        values = []
        for s in sample:
            alpha = np.exp(logits[s.index]) + 1.0
            values.append(_cell_mean(2.0 / alpha.sum(axis=0), s.cells))
        assert _uncertainty(engine, net, windows, round_) == pytest.approx(np.mean(values), rel=1e-6)


def test_sampled_surrogate_statistics_against_scipy_on_the_same_cells_for_both_models(tmp_path):
    """G from the surrogate, A and R_paper from the kept local model, all on this round's cells (one sample
    for both models), recomputed with SciPy's digamma from direct forward passes."""
    engine = _engine(tmp_path, TILED_SIZES + OTHER_SIZES)
    local, surrogate = _pointwise_net(0), _pointwise_net(1)
    sample = engine.window_sample("validation", 7, 2, "fedevi_surrogate")

    def per_image(net, which):
        out = []
        for s, z in ((s, _pixel_logits(engine, net, "validation")[s.index]) for s in sample):
            alpha = np.exp(z) + 1.0
            strength = alpha.sum(axis=0)
            rho = alpha / strength
            aleatoric = (rho * (digamma(strength + 1.0) - digamma(alpha + 1.0))).sum(axis=0)
            total = -(rho * np.log(rho)).sum(axis=0)
            out.append(_cell_mean(aleatoric if which == "A" else total - aleatoric, s.cells))
        return np.array(out)

    got = _surrogate(engine, local, surrogate, 7)
    assert set(got) == {"G", "A", "R_paper"}
    ale = per_image(local, "A")
    assert got["G"] == pytest.approx(per_image(surrogate, "G").mean(), rel=1e-5)
    assert got["A"] == pytest.approx(ale.mean(), rel=1e-5)
    assert got["R_paper"] == pytest.approx((1.0 / ale).mean(), rel=1e-5)


def test_default_is_a_sample_in_patch_mode_and_the_whole_image_pass_stays_available(tmp_path):
    """The default draws ``DEFAULT_UNCERTAINTY_WINDOWS`` windows (never touching the sliding window); the
    whole-image option runs the sliding window over every training image."""
    engine = _engine(tmp_path, [(64, 64)] * 3)  # 108 cells of 12 px (the stride of 16 px windows at overlap 0.25)
    assert engine.window_cell == 12 and cells_in_split(engine.grid_shapes("training"), 12) == 108
    calls = {"whole": 0}
    original = engine.predictor

    def counting(model, x, with_features=False):
        calls["whole"] += 1
        return original(model, x, with_features)

    engine.predictor = counting
    net = _unet(engine, 0)
    default = GraphFedSegObjective()
    assert default.uncertainty_windows >= 1
    u_default = _uncertainty(engine, net, default.uncertainty_windows, round_=4)
    assert calls["whole"] == 0
    assert u_default == pytest.approx(_uncertainty(engine, net, min(default.uncertainty_windows, 108), round_=4))
    _uncertainty(engine, net, None)
    assert calls["whole"] == 3
    assert 0 < u_default <= 1 and math.isfinite(u_default)


def test_mc_dropout_on_the_sample(tmp_path):
    """MC-dropout's T passes run on the sampled windows: 0 without dropout, in (0, 1] with it."""
    engine = _engine(tmp_path, [(32, 40)])
    objective = GraphFedSegObjective(uncertainty="mc_dropout", mc_samples=3, uncertainty_windows=4)
    ctx = RoundContext("site-a", 0, 5, server_meta={}, train_config=engine.train_config)
    for dropout, check in ((0.0, lambda u: u == pytest.approx(0.0, abs=1e-9)), (0.3, lambda u: 0 < u <= 1)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Dropout2d(dropout), torch.nn.Conv2d(8, 2, 1))
        objective.begin_round(ctx, net)
        assert check(objective.end_round(ctx, net, engine)["uncertainty"])


def test_resize_mode_ignores_the_window_option(tmp_path):
    """In resize mode an image is one forward pass: the value is the whole-image one whatever the option."""
    engine = _engine(tmp_path, [(40, 30), (24, 36)], spatial_mode="resize", image_size=16)
    net = _unet(engine, 0)
    assert _uncertainty(engine, net, 1) == _uncertainty(engine, net, None)
    with pytest.raises(ValueError, match="patch"):
        engine.window_sample("training", 4, 0, "x")


# ----------------------------------------------------------------------------------------------
# the server side is unchanged
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, option", [("graphfedseg", "uncertainty_windows"), ("fedevi", "surrogate_windows")])
def test_the_option_only_reaches_the_site_objective(method, option, tmp_path):
    """Exported jobs with the default sample and with ``whole_image`` differ in the objective's option only:
    the strategy, its arguments and the site configuration are the same."""
    from fedseg.recipes.export import export_job

    default = export_job(method, tmp_path / "a")
    whole = export_job(method, tmp_path / "b", **{option: "whole_image"})
    server = [json.loads((job / "app/config/config_fed_server.json").read_text()) for job in (default, whole)]
    args = [next(w["args"] for w in s["workflows"] if w["id"] == "controller") for s in server]
    assert args[0]["objective_args"][option] >= 1 and args[1]["objective_args"][option] is None
    for a in args:
        a["objective_args"].pop(option)
    assert args[0] == args[1]
    assert option not in json.dumps(args[0]["strategy_args"])
    client = [(job / "app/config/config_fed_client.json").read_text() for job in (default, whole)]
    assert client[0] == client[1]
