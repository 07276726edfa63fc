"""FVAC's feature alignment on multi-class masks: the two readings of its foreground/background split (union of
the non-background classes, or one term per class) against brute-force sums, and both equal Eq. 11 when binary; and the class-normalised means against NumPy."""

from __future__ import annotations

import pytest
import torch

from fedseg.objectives.fvac import FVACObjective
from fedseg.objectives.fvac_losses import class_means, fvda_loss


def _brute_force_means(features: torch.Tensor, labels: torch.Tensor, groups):
    """``(B, len(groups), C)``: per image, sum of feature vectors over pixels whose class is in each group, divided by
    all H*W pixels (Eq. 10 as printed); labels already at the feature size."""
    b, c, h, w = features.shape
    out = torch.zeros(b, len(groups), c, dtype=torch.float64)
    for i in range(b):
        for k, group in enumerate(groups):
            for y in range(h):
                for x in range(w):
                    if int(labels[i, 0, y, x]) in group:
                        out[i, k] += features[i, :, y, x].double()
    return out / (h * w)


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    feats_k, feats_g = torch.randn(2, 4, 6, 6, generator=g), torch.randn(2, 4, 6, 6, generator=g)
    labels = torch.randint(0, 3, (2, 1, 6, 6), generator=g)
    return feats_k, feats_g, labels


@pytest.mark.parametrize("seed", [0, 1])
def test_class_means_match_brute_force(seed):
    feats, _, labels = _case(seed)
    torch.testing.assert_close(class_means(feats, labels, 3).double(), _brute_force_means(feats, labels, [{0}, {1}, {2}]))
    # union: background, and every other class together
    torch.testing.assert_close(class_means(feats, labels, 2, union_foreground=True).double(),
                               _brute_force_means(feats, labels, [{0}, {1, 2}]))


@pytest.mark.parametrize("seed", [0, 1])
def test_fvda_union_and_per_class_by_hand(seed):
    feats_k, feats_g, labels = _case(seed)
    sq = lambda a, b: ((a - b) ** 2).mean(dim=(0, 2)).sum()  # noqa: E731  sum over terms of batch-mean (1/C)||.||^2
    union = _brute_force_means(feats_k, labels, [{0}, {1, 2}]), _brute_force_means(feats_g, labels, [{0}, {1, 2}])
    per_class = _brute_force_means(feats_k, labels, [{0}, {1}, {2}]), _brute_force_means(feats_g, labels, [{0}, {1}, {2}])
    assert fvda_loss(feats_k, feats_g, labels, "union").item() == pytest.approx(sq(*union).item(), rel=1e-5)
    assert fvda_loss(feats_k, feats_g, labels, "per_class", 3).item() == pytest.approx(sq(*per_class).item(), rel=1e-5)


def test_both_readings_are_eq_11_for_binary_masks():
    feats_k, feats_g, labels = _case(2)
    binary = (labels > 0).long()
    assert fvda_loss(feats_k, feats_g, binary, "union").item() == pytest.approx(
        fvda_loss(feats_k, feats_g, binary, "per_class", 2).item(), rel=1e-6)


def test_objective_option_is_checked():
    assert FVACObjective(fvda_foreground="per_class").fvda_foreground == "per_class"
    with pytest.raises(ValueError, match="fvda_foreground"):
        FVACObjective(fvda_foreground="each")


def _numpy_class_means(features: torch.Tensor, labels: torch.Tensor, groups):
    """``(B, len(groups), C)``: NumPy's mean of the feature vectors over each group's pixels (zeros where none)."""
    import numpy as np

    f, lab = features.double().numpy(), labels[:, 0].numpy()
    out = np.zeros((f.shape[0], len(groups), f.shape[1]))
    for i in range(f.shape[0]):
        for k, group in enumerate(groups):
            inside = np.isin(lab[i], sorted(group))
            if inside.any():
                out[i, k] = f[i][:, inside].mean(axis=1)
    return torch.from_numpy(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_class_normalised_means_are_numpy_means_over_the_class(seed):
    feats_k, feats_g, labels = _case(seed)
    labels[0][labels[0] == 2] = 1  # class 2 absent from the first image: its vector is zero
    torch.testing.assert_close(class_means(feats_k, labels, 3, mean="class").double(),
                               _numpy_class_means(feats_k, labels, [{0}, {1}, {2}]))
    torch.testing.assert_close(class_means(feats_k, labels, 2, union_foreground=True, mean="class").double(),
                               _numpy_class_means(feats_k, labels, [{0}, {1, 2}]))
    sq = lambda a, b: ((a - b) ** 2).mean(dim=(0, 2)).sum()  # noqa: E731
    by_hand = sq(_numpy_class_means(feats_k, labels, [{0}, {1, 2}]), _numpy_class_means(feats_g, labels, [{0}, {1, 2}]))
    assert fvda_loss(feats_k, feats_g, labels, "union", mean="class").item() == pytest.approx(by_hand.item(), rel=1e-5)
    # the printed form is the class mean scaled by the class's pixel share
    share = torch.stack([(labels == 0).flatten(1).double().mean(1), (labels > 0).flatten(1).double().mean(1)], 1)
    torch.testing.assert_close(class_means(feats_k, labels, 2, union_foreground=True).double(),
                               _numpy_class_means(feats_k, labels, [{0}, {1, 2}]) * share[..., None])


def test_class_normalised_option_is_checked_and_reaches_the_job(tmp_path):
    from fedseg.bench.inprocess import controller_args

    assert FVACObjective(fvda_mean="class").fvda_mean == "class"
    with pytest.raises(ValueError, match="fvda_mean"):
        FVACObjective(fvda_mean="pixel")
    with pytest.raises(ValueError, match="mean"):
        class_means(torch.zeros(1, 2, 4, 4), torch.zeros(1, 1, 4, 4), 2, mean="pixel")
    assert controller_args("fvac", tmp_path / "c", fvda_mean="class")["objective_args"]["fvda_mean"] == "class"
    # the printed form: the exported job as before
    assert "fvda_mean" not in controller_args("fvac", tmp_path / "p")["objective_args"]
