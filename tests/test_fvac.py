"""FVAC: Eq. 6 uncertainty, the FMUG weight map and loss, FVDA fg/bg means, and the client objective."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fedseg.networks.unet import FeatureUNet
from fedseg.objectives import BatchOutput, RoundContext, build_objective
from fedseg.objectives.fvac import FVACObjective
from fedseg.objectives.fvac_losses import class_means, fmug_loss, fvda_loss
from fedseg.plots.fvac_figures import save_weight_map_figure
from fedseg.uncertainty.morphology import pixel_uncertainty, pixel_weight_map

CTX = RoundContext(site="site-1", round=0, total_rounds=1)


def _probs(per_pixel):
    """[[p_pixel00, p_pixel01], [p_pixel10, p_pixel11]] with p a class list -> (1, C, 2, 2)."""
    return torch.tensor(per_pixel, dtype=torch.float32).permute(2, 0, 1).unsqueeze(0)


def _tiny_net(seed: int = 0, norm: str = "instance") -> FeatureUNet:
    torch.manual_seed(seed)
    return FeatureUNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8), norm=norm)


def _batch(seed: int = 1, b: int = 2, size: int = 16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 1, size, size, generator=g)
    y = (torch.rand(b, 1, size, size, generator=g) < 0.3).float()  # float 0/1 like the engine's masks
    return x, y


def _out(model, x, y) -> BatchOutput:
    logits, feats = model.forward_features(x)
    return BatchOutput(inputs=x, labels=y, logits=logits, features=feats)


# ------------------------------------------------------------------------------------------- Eq. 6
def test_uncertainty_two_classes_by_hand():
    probs = _probs([[[0.8, 0.2], [0.8, 0.2]], [[0.3, 0.7], [0.45, 0.55]]])
    labels = torch.tensor([[[[0, 1], [1, 0]]]])
    # (0,0) right -> min 0.2; (0,1) wrong -> max 0.8; (1,0) right -> min 0.3; (1,1) wrong -> max 0.55
    expected = torch.tensor([[[[0.2, 0.8], [0.3, 0.55]]]])
    torch.testing.assert_close(pixel_uncertainty(probs, labels), expected)


def test_uncertainty_three_classes_by_hand():
    probs = _probs([[[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]], [[0.1, 0.6, 0.3], [0.1, 0.6, 0.3]]])
    labels = torch.tensor([[[[0, 2], [1, 0]]]], dtype=torch.float32)
    # right pixels take the smallest class probability (not 1 - P_Y, which would be 0.5 / 0.4)
    expected = torch.tensor([[[[0.2, 0.5], [0.1, 0.6]]]])
    torch.testing.assert_close(pixel_uncertainty(probs, labels), expected)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_uncertainty_binary_equals_one_minus_true_class_probability(seed):
    # for C = 2 both branches of Eq. 6 reduce to 1 - P_Y
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(2, 2, 5, 3, generator=g), dim=1)
    labels = torch.randint(0, 2, (2, 1, 5, 3), generator=g)
    u = pixel_uncertainty(probs, labels)
    torch.testing.assert_close(u, 1 - probs.gather(1, labels))


def test_uncertainty_rejects_single_channel():
    with pytest.raises(ValueError):
        pixel_uncertainty(torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))


# ------------------------------------------------------------------------------------- weight map
def test_weight_map_mix_and_normalisation_by_hand():
    u_local = torch.tensor([[[[0.2, 0.6]]]])
    u_global = torch.tensor([[[[0.4, 0.8]]]])
    torch.testing.assert_close(pixel_weight_map(u_local, u_global), torch.tensor([[[[0.3, 0.7]]]]))
    # mix = 1: global only, 0.4 / 1.2 and 0.8 / 1.2
    torch.testing.assert_close(pixel_weight_map(u_local, u_global, mix=1.0), torch.tensor([[[[1 / 3, 2 / 3]]]]))


def test_weight_map_sums_to_one_per_image_and_is_detached():
    u_local = torch.rand(3, 1, 6, 5, requires_grad=True)
    u_global = torch.rand(3, 1, 6, 5)
    alpha = pixel_weight_map(u_local, u_global, mix=0.3)
    torch.testing.assert_close(alpha.sum(dim=(1, 2, 3)), torch.ones(3))
    assert not alpha.requires_grad


def test_weight_map_all_zero_uncertainty_falls_back_to_uniform():
    u = torch.zeros(1, 1, 2, 4)
    alpha = pixel_weight_map(u, u)
    torch.testing.assert_close(alpha, torch.full_like(u, 1 / 8))


# ------------------------------------------------------------------------------------------- FMUG
def test_fmug_with_uniform_alpha_is_mean_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 3, 4, 5, generator=g)
    labels = torch.randint(0, 3, (3, 1, 4, 5), generator=g)
    alpha = torch.full((3, 1, 4, 5), 1 / 20)
    torch.testing.assert_close(fmug_loss(logits, labels, alpha), F.cross_entropy(logits, labels[:, 0]))


def test_fmug_single_pixel_weight_picks_that_pixels_log_loss():
    logits = torch.tensor([[[[2.0, 0.0]], [[0.0, 1.0]]]])  # (1, 2, 1, 2)
    labels = torch.tensor([[[[1, 1]]]])
    alpha = torch.tensor([[[[1.0, 0.0]]]])
    # pixel (0, 0): logits (2, 0), true class 1 -> -log(e^0 / (e^2 + e^0)) = log(1 + e^2)
    assert fmug_loss(logits, labels, alpha).item() == pytest.approx(math.log(1 + math.e**2), rel=1e-6)


# ------------------------------------------------------------------------------------ FVDA (Eq. 10)
def _fg_bg(features, labels):
    """Eq. 10's foreground (every non-background class together) and background feature vectors, each ``(B, C)``."""
    means = class_means(features, labels, 2, union_foreground=True)
    return means[:, 1], means[:, 0]


def _brute_force_fg_bg(features, labels):
    b, c, hf, wf = features.shape
    h, w = labels.shape[2:]
    fg = torch.zeros(b, c, dtype=torch.float64)
    bg = torch.zeros(b, c, dtype=torch.float64)
    for i in range(b):
        for y in range(hf):
            for x in range(wf):
                # nearest: output index reads input index floor(index * in / out)
                s = int(labels[i, 0, (y * h) // hf, (x * w) // wf])
                for ch in range(c):
                    if s == 1:
                        fg[i, ch] += float(features[i, ch, y, x])
                    elif s == 0:
                        bg[i, ch] += float(features[i, ch, y, x])
    return fg / (hf * wf), bg / (hf * wf)


@pytest.mark.parametrize("label_size", [8, 10, 4])
def test_fg_bg_means_match_brute_force_with_nearest_resize(label_size):
    g = torch.Generator().manual_seed(label_size)
    features = torch.randn(2, 3, 4, 4, generator=g)
    labels = (torch.rand(2, 1, label_size, label_size, generator=g) < 0.4).float()
    fg, bg = _fg_bg(features, labels)
    fg_ref, bg_ref = _brute_force_fg_bg(features, labels)
    torch.testing.assert_close(fg.double(), fg_ref)
    torch.testing.assert_close(bg.double(), bg_ref)
    # divided by all H'W' pixels (not the class counts): for binary masks fg + bg is the map mean
    torch.testing.assert_close(fg + bg, features.mean(dim=(2, 3)))


def test_fg_bg_nearest_resize_reads_even_rows_and_columns():
    # 8x8 mask whose only foreground pixels sit on odd rows: nearest to 4x4 reads rows 0, 2, 4, 6
    labels = torch.zeros(1, 1, 8, 8)
    labels[0, 0, 1::2, :] = 1
    fg, bg = _fg_bg(torch.ones(1, 2, 4, 4), labels)
    torch.testing.assert_close(fg, torch.zeros(1, 2))
    torch.testing.assert_close(bg, torch.ones(1, 2))


def test_fvda_loss_by_hand_and_global_side_detached():
    # one channel, 1x2 map, left pixel foreground: fg = F[0]/2, bg = F[1]/2
    feat_local = torch.tensor([[[[2.0, 4.0]]]], requires_grad=True)
    feat_global = torch.tensor([[[[0.0, 2.0]]]], requires_grad=True)
    labels = torch.tensor([[[[1, 0]]]])
    loss = fvda_loss(feat_local, feat_global, labels)
    assert loss.item() == pytest.approx((1.0 - 0.0) ** 2 + (2.0 - 1.0) ** 2)
    loss.backward()
    assert feat_global.grad is None
    assert feat_local.grad is not None and torch.count_nonzero(feat_local.grad) == 2


# ------------------------------------------------------------------------------------- objective
def test_objective_with_uniform_alpha_and_beta_zero_is_mean_cross_entropy():
    # for C = 2, U = 1 - P_Y; a global model with negated head logits has P^g_Y = 1 - P^k_Y, so
    # alpha = 0.5 (U_g + U_k) = 0.5 everywhere -> uniform after normalisation, with non-constant CE
    local = _tiny_net()
    negated = copy.deepcopy(local)
    with torch.no_grad():
        negated.head.weight.neg_()
        negated.head.bias.neg_()
    objective = FVACObjective(beta=0.0)
    objective.begin_round(CTX, negated)
    x, y = _batch()
    out = _out(local, x, y)
    torch.testing.assert_close(objective.loss(out), F.cross_entropy(out.logits, y[:, 0].long()))
    _, _, alpha = objective.last_weight_maps(1)
    torch.testing.assert_close(alpha, torch.full_like(alpha, 1 / alpha[0].numel()))

    # with the unmodified global model alpha is not uniform and the loss is no longer plain CE
    objective.begin_round(CTX, local)
    assert not torch.allclose(objective.loss(out), F.cross_entropy(out.logits, y[:, 0].long()))


def _train(model, objective, steps=3, lr=1e-2):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        x, y = _batch(seed=10 + step)
        optimizer.zero_grad()
        loss = objective.loss(_out(model, x, y))
        loss.backward()
        optimizer.step()


@pytest.mark.parametrize("norm", ["instance", "batch"])
def test_frozen_global_copy_is_untouched_by_local_training(norm):
    model = _tiny_net(norm=norm)
    objective = FVACObjective()
    objective.begin_round(CTX, model)
    frozen = objective.global_model
    global_before = copy.deepcopy(frozen.state_dict())  # parameters and BN running statistics
    local_before = copy.deepcopy(model.state_dict())

    _train(model, objective)

    assert not frozen.training
    for name, p in frozen.named_parameters():
        assert not p.requires_grad and p.grad is None, name
    for key, value in frozen.state_dict().items():
        torch.testing.assert_close(value, global_before[key], rtol=0, atol=0, msg=key)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, local_before[k])]
    assert "head.weight" in changed and "encoders.0.0.conv.weight" in changed


def test_fvda_switch_and_beta_scale_the_alignment_term():
    model = _tiny_net()
    on = FVACObjective(beta=2.0)
    on.begin_round(CTX, model)
    x, y = _batch(seed=3)
    off = FVACObjective(use_fvda=False)
    off.begin_round(CTX, model)
    # right after begin_round local == global (instance norm, no dropout): FVDA is exactly 0
    torch.testing.assert_close(on.loss(_out(model, x, y)), off.loss(_out(model, x, y)))

    _train(model, on, steps=3)
    losses = {}
    for beta in (0.0, 1.0, 2.0):
        objective = FVACObjective(beta=beta)
        objective._global = on.global_model  # same frozen global for all three
        losses[beta] = objective.loss(_out(model, x, y)).item()
    off._global = on.global_model
    assert off.loss(_out(model, x, y)).item() == pytest.approx(losses[0.0], rel=1e-6)
    assert losses[1.0] > losses[0.0]
    assert losses[2.0] - losses[0.0] == pytest.approx(2 * (losses[1.0] - losses[0.0]), rel=1e-4)


def test_fmug_switch_off_gives_plain_cross_entropy_and_no_weight_maps():
    model = _tiny_net()
    x, y = _batch(seed=4)
    out = _out(model, x, y)
    plain = FVACObjective(use_fmug=False, use_fvda=False)
    # neither term needs the global model, so no begin_round is required
    torch.testing.assert_close(plain.loss(out), F.cross_entropy(out.logits, y[:, 0].long()))
    with pytest.raises(LookupError):
        plain.last_weight_maps()

    weighted = FVACObjective(use_fvda=False)
    weighted.begin_round(CTX, model)
    loss = weighted.loss(out)
    # the same (local == global) alpha through fmug_loss, and different from plain CE
    u = pixel_uncertainty(torch.softmax(out.logits.detach(), dim=1), y)
    torch.testing.assert_close(loss, fmug_loss(out.logits, y, pixel_weight_map(u, u)))
    assert not torch.allclose(loss, plain.loss(out))


def test_last_weight_maps_are_small_cpu_copies_newest_kept():
    model = _tiny_net()
    objective = FVACObjective(keep_weight_maps=3)
    objective.begin_round(CTX, model)
    batches = [_batch(seed=20 + i, b=2, size=8) for i in range(5)]
    for x, y in batches:
        objective.loss(_out(model, x, y))
    images, labels, alpha = objective.last_weight_maps(10)
    assert images.shape == (3, 1, 8, 8) and labels.shape == (3, 1, 8, 8) and alpha.shape == (3, 1, 8, 8)
    assert images.device.type == "cpu" and not alpha.requires_grad
    torch.testing.assert_close(alpha.sum(dim=(1, 2, 3)), torch.ones(3))
    # oldest first: the first image of batches 2, 3, 4
    torch.testing.assert_close(images, torch.stack([batches[i][0][0] for i in (2, 3, 4)]))
    assert objective.last_weight_maps(1)[0].shape[0] == 1


def test_objective_contract():
    objective = build_objective("fvac", beta=1.0, feature_layer="dec0")
    assert isinstance(objective, FVACObjective) and objective.needs_features
    assert objective.declared_statistics == ()
    with pytest.raises(TypeError):
        build_objective("fvac", gamma=1.0)
    with pytest.raises(RuntimeError):
        objective.loss(_out(_tiny_net(), *_batch()))  # before begin_round
    model = _tiny_net()
    objective.begin_round(CTX, model)
    assert objective.end_round(CTX, model, engine=None) == {}
    assert objective.global_model is None


def test_missing_feature_layer_is_reported():
    model = _tiny_net()
    objective = FVACObjective(feature_layer="dec7")
    objective.begin_round(CTX, model)
    with pytest.raises(KeyError, match="dec7"):
        objective.loss(_out(model, *_batch()))


# ----------------------------------------------------------------------------------------- figure
@pytest.mark.parametrize("in_channels", [1, 3])
def test_weight_map_figure_writes_png(tmp_path, in_channels):
    images = torch.rand(2, in_channels, 12, 12)
    labels = (torch.rand(2, 1, 12, 12) > 0.5).float()
    alpha = pixel_weight_map(torch.rand(2, 1, 12, 12), torch.rand(2, 1, 12, 12))
    path = save_weight_map_figure(images, labels, alpha, tmp_path / "figs" / "fvac_alpha.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_panel_grid_titles_each_row_once_hides_every_axis_and_closes_the_figure(tmp_path):
    """``save_panel_grid`` (both site-local figures end with it): a row's title over its first panel only, no
    panel's axes shown, the PNG written under new folders, the figure closed."""
    import matplotlib.pyplot as plt

    from fedseg.plots.fvac_figures import save_panel_grid

    fig, axes = plt.subplots(2, 3, squeeze=False)
    path = save_panel_grid(fig, axes, ("top", "bottom"), tmp_path / "a" / "b" / "grid.png", dpi=40)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [[ax.get_title(loc="left") for ax in row] for row in axes] == [["top", "", ""], ["bottom", "", ""]]
    assert not any(ax.axison for row in axes for ax in row)
    assert not plt.fignum_exists(fig.number)


def test_record_terms_reports_each_term_s_share_of_the_loss_and_gradient():
    """``record_terms``: the train metrics carry FVDA's share of the loss and its gradient norm against the main
    term's, checked against the two terms computed here with plain cross-entropy (``use_fmug=False``) and autograd."""
    import torch.nn.functional as F

    from fedseg.networks import FeatureUNet
    from fedseg.objectives.base import BatchOutput, RoundContext
    from fedseg.objectives.fvac import FVACObjective
    from fedseg.objectives.fvac_losses import fvda_loss

    torch.manual_seed(0)
    model = FeatureUNet(spatial_dims=2, in_channels=1, out_channels=2, channels=(4, 8, 16), init_seed=0)
    inputs = torch.rand(2, 1, 16, 16)
    labels = (torch.rand(2, 1, 16, 16) > 0.7).float()
    objective = FVACObjective(beta=2.0, use_fmug=False, record_terms=1)
    objective.begin_round(RoundContext("s", 0, 1), model)
    with torch.no_grad():  # a step away from the global weights, so that FVDA is not zero
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    logits, feats = model.forward_features(inputs)
    objective.loss(BatchOutput(inputs, labels, logits, feats))
    main = F.cross_entropy(logits, labels[:, 0].long())
    with torch.no_grad():
        _, feats_g = objective.global_model.forward_features(inputs)
    align = 2.0 * fvda_loss(feats["decoder_last"], feats_g["decoder_last"], labels)
    params = [p for p in model.parameters() if p.requires_grad]
    norm = lambda t: torch.sqrt(sum((g ** 2).sum() for g in torch.autograd.grad(t, params, retain_graph=True, allow_unused=True) if g is not None))
    (m, a), = objective._terms
    assert m == pytest.approx(float(main), rel=1e-6) and a == pytest.approx(float(align), rel=1e-6) and a > 0
    assert objective._grad_ratios[0] == pytest.approx(float(norm(align) / norm(main)), rel=1e-5)

    class _Engine:  # local training's metrics with the recorded terms added
        def train(self, model, objective, ctx, epochs=None):
            return {"train_loss": 0.0, "steps": 1.0}

    metrics = objective.local_training(_Engine(), model, RoundContext("s", 0, 1))
    assert metrics["fvda_loss_share"] == pytest.approx(a / (m + a)) and metrics["fvda_grad_ratio"] == objective._grad_ratios[0]
    # every second batch: the gradients are read on the round's second batch, not on its first
    every_second = FVACObjective(beta=2.0, use_fmug=False, record_terms=2)
    every_second.begin_round(RoundContext("s", 0, 1), model)
    for expected in (0, 1, 1, 2):
        logits, feats = model.forward_features(inputs)
        every_second.loss(BatchOutput(inputs, labels, logits, feats))
        assert len(every_second._grad_ratios) == expected
    with pytest.raises(ValueError, match="record_terms"):
        FVACObjective(record_terms=-1)
