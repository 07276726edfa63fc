"""Batch augmentation on the device against MONAI's per-sample transforms (``fedseg.data.batch_transforms``,
``fedseg.engine.resident``).

Two things must hold for every random transform the bundles use:
* given its parameters, a sample is transformed exactly as MONAI's deterministic counterpart does (a range
  collapsed to one value fixes the parameter);
* the parameters are drawn from MONAI's distribution: outcome frequencies against the exact distribution (by
  enumeration) and against MONAI's own draws, with scipy's chi-square / Kolmogorov-Smirnov tests. Seeds are fixed, so
  the tests are deterministic; the thresholds (p > 1e-3) hold with a wide margin at these seeds.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

import monai.transforms as mt
from fedseg.data.batch_transforms import (ClipIntensityRange, RandomAdjustContrast, RandomRotate, RandomScaleCropResize,
                                          RandomScaleIntensity, RandomShiftIntensity, apply_pipeline, batch_pipeline)
from fedseg.engine.resident import PatchSampler, ResidentLoader, ResidentTrainingData

N_DRAWS = 2000


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _distinct_image(size: int = 6, channels: int = 2) -> torch.Tensor:
    """``(C, S, S)`` with every pixel distinct, so a dihedral transform is recognisable from its output."""
    return torch.arange(channels * size * size, dtype=torch.float32).view(channels, size, size)


def _dihedral_outcomes(x: torch.Tensor):
    """The 8 distinct images the flips and 90-degree turns of ``x`` give, and a classifier of an output."""
    outcomes = []
    for f0, f1, k in itertools.product((0, 1), (0, 1), range(4)):
        y = x
        if f0:
            y = y.flip(1)
        if f1:
            y = y.flip(2)
        y = torch.rot90(y, k, (1, 2))
        if not any(torch.equal(y, o) for o in outcomes):
            outcomes.append(y)
    assert len(outcomes) == 8

    def classify(y: torch.Tensor) -> int:
        for i, o in enumerate(outcomes):
            if torch.equal(y, o):
                return i
        raise AssertionError("not a dihedral transform of the source")

    return outcomes, classify


def _basic_compose():
    return [mt.RandFlipd(keys=["image", "label"], prob=0.5, spatial_axis=0),
            mt.RandFlipd(keys=["image", "label"], prob=0.5, spatial_axis=1),
            mt.RandRotate90d(keys=["image", "label"], prob=0.5, max_k=3)]


def _exact_basic_distribution(classify, x):
    """P(outcome) of flip0 (1/2), flip1 (1/2), turn k in {0 w.p. 1/2, 1, 2, 3 w.p. 1/6 each}, by enumeration."""
    probs = np.zeros(8)
    for f0, f1, k in itertools.product((0, 1), (0, 1), range(4)):
        p = 0.25 * (0.5 if k == 0 else 0.5 / 3)
        y = x
        if f0:
            y = y.flip(1)
        if f1:
            y = y.flip(2)
        probs[classify(torch.rot90(y, k, (1, 2)))] += p
    return probs


def _monai_outcomes(compose, x, classify, n=N_DRAWS):
    t = mt.Compose(compose)
    t.set_random_state(seed=1)
    counts = np.zeros(8)
    for _ in range(n):
        out = t({"image": x.clone(), "label": x[:1].clone()})
        counts[classify(torch.as_tensor(out["image"]).as_tensor())] += 1
    return counts


def _batch_outcomes(ops, x, classify, n=N_DRAWS, batch=50):
    g = _gen(2)
    counts = np.zeros(8)
    for _ in range(n // batch):
        imgs = x[None].repeat(batch, 1, 1, 1)
        out = apply_pipeline(ops, {"image": imgs, "label": imgs[:, :1].clone()}, g)
        for y, lab in zip(out["image"], out["label"]):
            counts[classify(y)] += 1
            assert torch.equal(lab, y[:1])  # the label moved with its image
    return counts


def test_basic_level_outcomes_match_monai_and_the_exact_distribution():
    x = _distinct_image()
    _, classify = _dihedral_outcomes(x)
    exact = _exact_basic_distribution(classify, x)
    ours = _batch_outcomes(batch_pipeline(_basic_compose()), x, classify)
    theirs = _monai_outcomes(_basic_compose(), x, classify)
    assert stats.chisquare(ours, exact * ours.sum()).pvalue > 1e-3
    assert stats.chisquare(theirs, exact * theirs.sum()).pvalue > 1e-3
    assert stats.chi2_contingency(np.stack([ours, theirs])).pvalue > 1e-3


def test_flip_level_outcomes_match_monai():
    """RandAxisFlipd(prob 0.5): nothing w.p. 1/2, each axis w.p. 1/4."""
    x = _distinct_image()
    outcomes, classify = _dihedral_outcomes(x)
    compose = [mt.RandAxisFlipd(keys=["image", "label"], prob=0.5)]
    ours = _batch_outcomes(batch_pipeline(compose), x, classify)
    theirs = _monai_outcomes(compose, x, classify)
    exact = np.zeros(8)
    exact[classify(x)] = 0.5
    exact[classify(x.flip(1))] = 0.25
    exact[classify(x.flip(2))] = 0.25
    support = exact > 0
    assert ours[~support].sum() == 0 and theirs[~support].sum() == 0
    assert stats.chisquare(ours[support], exact[support] * ours.sum()).pvalue > 1e-3
    assert stats.chisquare(theirs[support], exact[support] * theirs.sum()).pvalue > 1e-3


def test_flips_and_turns_of_volumes_act_on_the_right_axes():
    """3-D patches: RandFlipd per network axis and RandRotate90d in the (0, 1) plane, prob 1: MONAI's Flip / Rotate90."""
    x = torch.arange(2 * 4 * 4 * 3, dtype=torch.float32).view(2, 4, 4, 3)
    for axis in range(3):
        (op,) = batch_pipeline([mt.RandFlipd(keys=["image"], prob=1.0, spatial_axis=axis)])
        out = op({"image": x[None], "label": x[None, :1]}, _gen())
        assert torch.equal(out["image"][0], torch.as_tensor(mt.Flip(spatial_axis=axis)(x)).as_tensor())
    (op,) = batch_pipeline([mt.RandRotate90d(keys=["image"], prob=1.0, max_k=3, spatial_axes=(0, 1))])
    out = op({"image": x[None].repeat(64, 1, 1, 1, 1), "label": x[None, :1].repeat(64, 1, 1, 1, 1)}, _gen())
    turned = [torch.as_tensor(mt.Rotate90(k=k, spatial_axes=(0, 1))(x)).as_tensor() for k in (1, 2, 3)]
    seen = {next(k for k, t in zip((1, 2, 3), turned) if torch.equal(y, t)) for y in out["image"]}
    assert seen == {1, 2, 3}


def test_scale_crop_resize_equals_monai_for_a_fixed_box_and_draws_monai_sizes():
    x = torch.rand(2, 20, 20, generator=_gen())
    label = (x[:1] > 0.5).float()
    op = RandomScaleCropResize(["image", "label"], 0.8, 1.0, True, True, ["image", "label"], (20, 20),
                               ("area", "nearest"), (None, None))
    # a fixed box: the crop + resize MONAI's SpatialCrop and Resize give
    sizes, corners = torch.tensor([[17, 19]]), torch.tensor([[2, 0]])
    op.draw = lambda n, spatial, generator: (sizes.expand(n, -1), corners.expand(n, -1))
    out = op({"image": x[None], "label": label[None]}, _gen())
    crop = mt.SpatialCrop(roi_start=[2, 0], roi_end=[19, 19])
    expected = mt.Resize(spatial_size=(20, 20), mode="area")(crop(x))
    expected_label = mt.Resize(spatial_size=(20, 20), mode="nearest")(crop(label))
    torch.testing.assert_close(out["image"][0], torch.as_tensor(expected).as_tensor())
    assert torch.equal(out["label"][0], torch.as_tensor(expected_label).as_tensor())
    # the drawn sizes and corners against MONAI's RandScaleCrop draws
    draw = RandomScaleCropResize(["image"], 0.8, 1.0, True, True, ["image"], (20, 20), ("area",), (None,)).draw
    ours_size, ours_corner = draw(N_DRAWS, (20, 20), _gen(3))
    monai = mt.RandScaleCrop(roi_scale=0.8, max_roi_scale=1.0, random_size=True, random_center=True)
    monai.set_random_state(seed=4)
    theirs_size = []
    for _ in range(N_DRAWS):
        monai.randomize((20, 20))
        theirs_size.append(monai._size)
    theirs_size = np.array(theirs_size)
    for axis in range(2):
        support = np.arange(16, 21)  # ceil(0.8 * 20) .. 20, uniform
        ours_counts = np.array([(ours_size[:, axis].numpy() == s).sum() for s in support])
        theirs_counts = np.array([(theirs_size[:, axis] == s).sum() for s in support])
        assert ours_counts.sum() == theirs_counts.sum() == N_DRAWS
        assert stats.chisquare(ours_counts).pvalue > 1e-3 and stats.chisquare(theirs_counts).pvalue > 1e-3
    # corners uniform on 0..(20 - size) given the size
    room = (20 - ours_size).numpy()
    u = (ours_corner.numpy() + 0.5) / (room + 1)  # the discrete uniform mapped to (0, 1)
    assert (ours_corner.numpy() <= room).all() and (ours_corner.numpy() >= 0).all()
    assert stats.kstest(u.ravel(), "uniform").pvalue > 1e-3 or np.abs(u.mean() - 0.5) < 0.02


def test_rotation_equals_monai_rotate_at_a_fixed_angle():
    x = torch.rand(3, 16, 16, generator=_gen())
    label = (x[:1] > 0.5).float()
    op = RandomRotate(["image", "label"], 1.0, (0.2, 0.2), ("bilinear", "nearest"), ("zeros", "zeros"), (False, False))
    out = op({"image": x[None], "label": label[None]}, _gen())
    torch.testing.assert_close(out["image"][0], torch.as_tensor(mt.Rotate(angle=0.2, mode="bilinear", padding_mode="zeros")(x)).as_tensor())
    assert torch.equal(out["label"][0], torch.as_tensor(mt.Rotate(angle=0.2, mode="nearest", padding_mode="zeros")(label)).as_tensor())


def test_intensity_jitter_equals_monai_at_fixed_parameters():
    x = torch.rand(2, 3, 8, 8, generator=_gen())
    one = {"image": x, "label": x[:, :1]}
    out = RandomScaleIntensity(["image"], 1.0, (0.1, 0.1), True)(one, _gen())["image"]
    torch.testing.assert_close(out[0], torch.as_tensor(mt.ScaleIntensity(minv=None, maxv=None, factor=0.1)(x[0])).as_tensor())
    out = RandomShiftIntensity(["image"], 1.0, (-0.03, -0.03), True)(one, _gen())["image"]
    torch.testing.assert_close(out[1], torch.as_tensor(mt.ShiftIntensity(offset=-0.03)(x[1])).as_tensor())
    out = RandomAdjustContrast(["image"], 1.0, (1.3, 1.3))(one, _gen())["image"]
    torch.testing.assert_close(out[0], torch.as_tensor(mt.AdjustContrast(gamma=1.3)(x[0])).as_tensor())
    out = ClipIntensityRange(["image"], 0.0, 1.0, 0.0, 1.0, True)({"image": x * 2 - 0.5}, _gen())["image"]
    torch.testing.assert_close(out, torch.as_tensor(mt.ScaleIntensityRange(0.0, 1.0, 0.0, 1.0, clip=True)(x * 2 - 0.5)).as_tensor())


@pytest.mark.parametrize("transform, attribute", [
    (mt.RandScaleIntensityd(keys="image", factors=0.15, channel_wise=True, prob=0.8), "scale"),
    (mt.RandShiftIntensityd(keys="image", offsets=0.05, channel_wise=True, prob=0.8), "shift"),
    (mt.RandAdjustContrastd(keys="image", gamma=[0.7, 1.5], prob=0.5), "gamma"),
])
def test_intensity_parameters_follow_monai_distributions(transform, attribute):
    """The per-channel factor / offset and the gamma: how often applied (binomial) and their law (two-sample KS)."""
    (op,) = batch_pipeline([transform])
    base = torch.full((1, 4, 4), 0.5)  # one channel: one draw per sample, so the counts below are independent
    base[:, 0, 0], base[:, 0, 1] = 0.25, 1.0  # a range for the contrast adjustment: the probe pixel sits at 1/3 of it

    def parameter(before: torch.Tensor, after: torch.Tensor):
        if attribute == "scale":
            return (after[:, 1, 1] / before[:, 1, 1] - 1).tolist()
        if attribute == "shift":
            return (after[:, 1, 1] - before[:, 1, 1]).tolist()
        lo, hi = before.min(), before.max()
        return [float(torch.log((after[0, 1, 1] - lo) / (hi - lo)) / torch.log((before[0, 1, 1] - lo) / (hi - lo + 1e-7)))]

    ours = []
    out = op({"image": base[None].repeat(N_DRAWS, 1, 1, 1)}, _gen(13))["image"]
    for y in out:
        ours.extend(parameter(base, y))
    transform.set_random_state(seed=6)
    theirs = []
    for _ in range(N_DRAWS):
        theirs.extend(parameter(base, torch.as_tensor(transform({"image": base.clone()})["image"]).as_tensor()))
    ours, theirs = np.array(ours), np.array(theirs)
    neutral = 1.0 if attribute == "gamma" else 0.0
    applied_ours, applied_theirs = np.abs(ours - neutral) > 1e-6, np.abs(theirs - neutral) > 1e-6
    assert stats.binomtest(int(applied_ours.sum()), len(ours), transform.prob).pvalue > 1e-3
    assert stats.binomtest(int(applied_theirs.sum()), len(theirs), transform.prob).pvalue > 1e-3
    assert stats.ks_2samp(ours[applied_ours], theirs[applied_theirs]).pvalue > 1e-3


def test_an_unknown_random_transform_keeps_the_per_sample_path():
    assert batch_pipeline([mt.RandGaussianNoised(keys="image", prob=0.5)]) is None
    assert batch_pipeline([]) == []


# ------------------------------------------------------------------------------------------------ patches
def _patch_label(shape=(40, 50)):
    lab = torch.zeros(1, *shape)
    lab[0, 5:9, 30:36] = 1  # a small foreground region
    return lab


@pytest.mark.parametrize("pos, neg", [(1.0, 1.0), (3.0, 1.0), (1.0, 0.0)])
def test_pos_neg_patches_follow_monai(pos, neg):
    """Every patch inside the image, its centre a corrected candidate, the share of foreground-centred patches as
    MONAI's RandCropByPosNegLabeld draws them."""
    lab = _patch_label()
    cropper = mt.RandCropByPosNegLabeld(keys=["image", "label"], label_key="label", spatial_size=[16, 16], pos=pos, neg=neg,
                                        num_samples=4)
    sampler = PatchSampler(cropper, [lab], num_classes=2)
    centres = sampler.centres(torch.zeros(N_DRAWS // 4, dtype=torch.long), _gen(7))
    fg = lab[0].nonzero()
    lo, hi = fg.min(0).values, fg.max(0).values
    from monai.transforms.utils import correct_crop_centers

    def foreground_centred(c):  # a corrected foreground centre stays near the region (the patch covers it)
        return bool(((c >= lo - 8) & (c <= hi + 8)).all())

    ours = np.array([foreground_centred(c) for c in centres])
    for c in centres[:200].tolist():  # corrected: MONAI's correction leaves them where they are
        assert tuple(c) == tuple(correct_crop_centers(c, [16, 16], [40, 50]))
    starts = sampler.starts(centres)
    assert all(0 <= s0 <= 40 - 16 and 0 <= s1 <= 50 - 16 for s0, s1 in starts)
    cropper.set_random_state(seed=8)
    theirs = []
    for _ in range(N_DRAWS // 4):
        cropper.cropper.randomize(label=lab)
        theirs.extend(foreground_centred(torch.tensor(c)) for c in cropper.cropper.centers)
    theirs = np.array(theirs)
    if neg == 0:
        assert ours.all() and theirs.all()
        return
    assert stats.chi2_contingency([[ours.sum(), (~ours).sum()], [theirs.sum(), (~theirs).sum()]]).pvalue > 1e-3


def test_class_patches_follow_the_ratios_over_present_classes():
    lab = torch.zeros(1, 30, 30)
    lab[0, 2:6, 2:6] = 1
    lab[0, 20:28, 20:28] = 2
    cropper = mt.RandCropByLabelClassesd(keys=["image", "label"], label_key="label", spatial_size=[8, 8], ratios=[1, 2, 3, 4],
                                         num_classes=4, num_samples=2, warn=False)  # class 3 absent: its ratio becomes 0
    sampler = PatchSampler(cropper, [lab], num_classes=4)
    g = _gen(9)
    per = torch.zeros(N_DRAWS // 2, dtype=torch.long).repeat_interleave(2)
    which = torch.multinomial(sampler._probs[per], 1, generator=g)[:, 0]
    counts = np.bincount(which.numpy(), minlength=4)
    assert counts[3] == 0
    assert stats.chisquare(counts[:3], np.array([1, 2, 3]) / 6 * counts.sum()).pvalue > 1e-3
    centres = sampler.centres(torch.zeros(200, dtype=torch.long), g)
    assert ((centres >= 4) & (centres <= 26)).all()


# ------------------------------------------------------------------------------------------------ the resident data
def _items(n=10, size=8):
    g = _gen(11)
    return [{"image": torch.rand(3, size, size, generator=g), "label": (torch.rand(1, size, size, generator=g) > 0.5).float()}
            for _ in range(n)]


def test_an_epoch_holds_every_image_once_in_the_shuffled_order():
    items = _items()
    data = ResidentTrainingData(items, [], torch.device("cpu"), batch_size=3, drop_last=False, num_classes=2)
    loader = ResidentLoader(data, torch.Generator().manual_seed(0))
    expected_order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    batches = list(loader)
    assert [len(b["image"]) for b in batches] == [3, 3, 3, 1] and len(loader) == 4
    seen = torch.cat([b["image"] for b in batches])
    assert torch.equal(seen, torch.stack([items[i]["image"] for i in expected_order]))
    second = torch.cat([b["image"] for b in loader])  # the next epoch: a new order of the same images
    assert not torch.equal(second, seen)
    assert sorted(map(lambda t: t.sum().item(), second)) == sorted(map(lambda t: t.sum().item(), seen))
    dropped = ResidentTrainingData(items, [], torch.device("cpu"), batch_size=3, drop_last=True, num_classes=2)
    assert len(dropped) == 3 and sum(len(b["image"]) for b in ResidentLoader(dropped, _gen())) == 9


def test_whole_images_of_several_shapes_keep_the_loader():
    items = _items(3) + [{"image": torch.rand(3, 6, 6), "label": torch.zeros(1, 6, 6)}]
    with pytest.raises(ValueError, match="one image shape"):
        ResidentTrainingData(items, [], torch.device("cpu"), 2, False, 2)
