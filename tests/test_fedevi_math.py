"""FedEvi maths: uncertainty decomposition, KL term, evidential Dice losses, weight update.

Every formula is checked against something independent: scipy's digamma/entropy, torch.distributions,
Monte-Carlo sampling of the Dirichlet, or a hand computation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import digamma as sp_digamma
from scipy.stats import entropy as sp_entropy
from torch.distributions import Dirichlet, kl_divergence

from fedseg.objectives.evidential_losses import (
    EvidentialSegLoss,
    bayes_risk_dice_loss,
    evidential_dice_loss,
    expected_squared_probability,
    kl_annealing_weight,
    one_hot_labels,
)
from fedseg.strategies.evidential_weights import reliability, update_beta
from fedseg.uncertainty.evidential import (
    aleatoric_uncertainty,
    dirichlet_alpha,
    epistemic_uncertainty,
    kl_dirichlet_to_uniform,
    remove_true_class_evidence,
    total_uncertainty,
)

# ------------------------------------------------------------------------------------------------
# uncertainty decomposition


def _alpha_pixel(values):
    """A K-vector of concentrations as a (1, K, 1, 1) float64 tensor (one pixel)."""
    return torch.tensor(values, dtype=torch.float64).view(1, -1, 1, 1)


alpha_vectors = st.integers(min_value=2, max_value=6).flatmap(
    lambda c: st.lists(st.floats(min_value=0.0, max_value=12.0), min_size=c, max_size=c)
).map(lambda logs: [1.0 + math.expm1(v) + 1e-3 for v in logs])  # alpha in (1, ~1.6e5], as exp(z) + 1


@settings(max_examples=80, deadline=None)
@given(alpha_vectors)
def test_decomposition_matches_scipy_and_is_consistent(alpha):
    a = np.asarray(alpha)
    rho = a / a.sum()
    # numpy re-derivation: scipy's entropy and digamma, aleatoric written as psi(S+1) - E_rho[psi(alpha+1)]
    total_ref = sp_entropy(rho)
    ale_ref = sp_digamma(a.sum() + 1.0) - np.dot(rho, sp_digamma(a + 1.0))
    epi_ref = total_ref - ale_ref

    t = _alpha_pixel(alpha)
    u_tot = total_uncertainty(t).item()
    u_ale = aleatoric_uncertainty(t).item()
    u_epi = epistemic_uncertainty(t).item()

    assert u_tot == pytest.approx(total_ref, rel=1e-9, abs=1e-12)
    assert u_ale == pytest.approx(ale_ref, rel=1e-9, abs=1e-12)
    assert u_epi == pytest.approx(max(epi_ref, 0.0), rel=1e-7, abs=1e-10)
    assert u_ale >= 0.0
    assert u_epi >= 0.0
    assert u_epi + u_ale == pytest.approx(u_tot, rel=1e-9, abs=1e-10)
    assert u_tot <= math.log(len(alpha)) + 1e-12


def test_unclamped_epistemic_is_exactly_total_minus_aleatoric():
    torch.manual_seed(0)
    alpha = dirichlet_alpha(torch.randn(4, 3, 5, 5) * 30)  # many near-certain pixels: differences of ~0 can round below 0
    difference = total_uncertainty(alpha) - aleatoric_uncertainty(alpha)
    assert torch.equal(epistemic_uncertainty(alpha, clamp=False), difference)
    assert torch.equal(epistemic_uncertainty(alpha), difference.clamp_min(0.0))


def test_aleatoric_is_expected_entropy_by_monte_carlo():
    # U_ale = E_{p ~ Dir(alpha)} [ -sum p log p ], estimated by sampling (independent of the digamma form)
    rng = np.random.default_rng(0)
    for alpha in ([1.0, 1.0], [2.0, 5.0, 1.5], [30.0, 1.2, 4.0, 9.0]):
        p = rng.dirichlet(alpha, size=200_000)
        h = -(p * np.log(np.clip(p, 1e-300, None))).sum(axis=1)
        got = aleatoric_uncertainty(_alpha_pixel(alpha)).item()
        assert abs(got - h.mean()) < 4 * h.std() / math.sqrt(len(h)) + 1e-4


def test_uniform_beta_by_hand():
    # Dir(1, 1) is Beta(1, 1): E[H] = 2 * int_0^1 -p log p dp = 1/2, H[rho] = log 2, I = log 2 - 1/2
    a = _alpha_pixel([1.0, 1.0])
    assert aleatoric_uncertainty(a).item() == pytest.approx(0.5, abs=1e-12)
    assert total_uncertainty(a).item() == pytest.approx(math.log(2.0), abs=1e-12)
    assert epistemic_uncertainty(a).item() == pytest.approx(math.log(2.0) - 0.5, abs=1e-12)


def test_uncertainties_shape_and_float32_extremes():
    # logits at and beyond the clamp: exp(80) in float32 must give finite, non-negative maps
    logits = torch.tensor([[200.0, -200.0], [80.0, 80.0], [0.0, 0.0], [-3.0, 90.0]]).T.reshape(1, 2, 2, 2)
    alpha = dirichlet_alpha(logits)
    for fn in (total_uncertainty, aleatoric_uncertainty, epistemic_uncertainty):
        u = fn(alpha)
        assert u.shape == (1, 1, 2, 2)
        assert torch.isfinite(u).all() and (u >= 0).all()
    # a confident pixel has (almost) no uncertainty of either kind
    assert total_uncertainty(alpha)[0, 0, 0, 0] < 1e-30


# ------------------------------------------------------------------------------------------------
# KL regulariser


def test_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(1)
    alpha = 1.0 + torch.exp(3.0 * torch.randn(2, 4, 3, 5, generator=g, dtype=torch.float64))
    got = kl_dirichlet_to_uniform(alpha)
    assert got.shape == (2, 1, 3, 5)
    a = alpha.movedim(1, -1)
    ref = kl_divergence(Dirichlet(a), Dirichlet(torch.ones_like(a))).unsqueeze(1)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    assert kl_dirichlet_to_uniform(torch.ones(1, 3, 2, 2)).abs().max() < 1e-6


def test_remove_true_class_evidence_by_hand():
    alpha = torch.tensor([5.0, 2.0, 3.0]).view(1, 3, 1, 1)
    onehot = torch.tensor([0.0, 1.0, 0.0]).view(1, 3, 1, 1)
    assert remove_true_class_evidence(alpha, onehot).flatten().tolist() == [5.0, 1.0, 3.0]


# ------------------------------------------------------------------------------------------------
# Dice losses


def _two_pixel_example():
    """Two images of one pixel each, C = 2, both labelled class 1.

    alpha = (1, 3) -> rho = (0.25, 0.75);  alpha = (3, 1) -> rho = (0.75, 0.25).
    """
    alpha = torch.tensor([[1.0, 3.0], [3.0, 1.0]], dtype=torch.float64).view(2, 2, 1, 1)
    onehot = torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64).view(2, 2, 1, 1)
    return alpha, onehot


def test_evidential_dice_by_hand():
    alpha, onehot = _two_pixel_example()
    eps = 1e-5
    # class 0: no overlap, sum rho^2 = 0.0625 + 0.5625 = 0.625, no labels
    dice0 = eps / (0.625 + eps)
    # class 1: overlap 0.75 + 0.25 = 1, sum rho^2 = 0.625, two labelled pixels; one Dice over the batch
    dice1 = (2.0 + eps) / (0.625 + 2.0 + eps)
    expected = 1.0 - (dice0 + dice1) / 2.0
    assert evidential_dice_loss(alpha, onehot, eps=eps).item() == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.619040, abs=1e-6)


def test_bayes_risk_dice_by_hand():
    alpha, onehot = _two_pixel_example()
    eps = 1e-5
    # S = 4, S + 1 = 5: E[rho^2] = (1*2/20, 3*4/20) = (0.1, 0.6) for the first pixel, (0.6, 0.1) for the second
    dice0 = eps / (0.7 + eps)
    dice1 = (2.0 + eps) / (0.7 + 2.0 + eps)
    expected = 1.0 - (dice0 + dice1) / 2.0
    assert bayes_risk_dice_loss(alpha, onehot, eps=eps).item() == pytest.approx(expected, rel=1e-12)


def test_dice_is_zero_for_a_perfect_confident_prediction():
    labels = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0]], dtype=torch.float32)
    labels = labels.view(1, 1, 4, 4)
    onehot = one_hot_labels(labels, 2)
    logits = 100.0 * (2.0 * onehot - 1.0)  # beyond the clamp on purpose
    alpha = dirichlet_alpha(logits)
    assert evidential_dice_loss(alpha, onehot).item() == pytest.approx(0.0, abs=1e-6)
    assert bayes_risk_dice_loss(alpha, onehot).item() == pytest.approx(0.0, abs=1e-6)
    # and the full loss: the KL sees alpha~ = 1 everywhere
    loss = EvidentialSegLoss()(logits, labels, round_=20)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)


def test_expected_squared_probability_by_monte_carlo():
    alpha = torch.tensor([[0.7, 2.0, 5.0], [1.0, 1.0, 1.0], [12.0, 3.0, 1.5]], dtype=torch.float64)
    torch.manual_seed(0)
    samples = Dirichlet(alpha).sample(torch.Size([200_000]))  # (N, 3 pixels, 3 classes)
    mc_mean = (samples**2).mean(dim=0)
    mc_se = (samples**2).std(dim=0) / math.sqrt(samples.shape[0])
    got = expected_squared_probability(alpha.T.unsqueeze(0)).squeeze(0).T  # classes on dim 1, as the API wants
    assert torch.all((got - mc_mean).abs() < 4 * mc_se + 1e-5)


def test_bayes_risk_dice_equals_dice_of_monte_carlo_moments():
    g = torch.Generator().manual_seed(3)
    alpha = 1.0 + torch.exp(torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64))
    onehot = one_hot_labels(torch.randint(0, 3, (2, 1, 4, 4), generator=g), 3).double()
    torch.manual_seed(4)
    rho_samples = Dirichlet(alpha.movedim(1, -1)).sample(torch.Size([40_000])).movedim(-1, 2)  # (N, B, C, H, W)
    e_rho = rho_samples.mean(0)
    e_rho2 = (rho_samples**2).mean(0)
    dims = (0, 2, 3)
    eps = 1e-5
    dice = (2 * (e_rho * onehot).sum(dims) + eps) / (e_rho2.sum(dims) + onehot.sum(dims) + eps)
    expected = 1.0 - dice.mean()
    assert bayes_risk_dice_loss(alpha, onehot).item() == pytest.approx(expected.item(), abs=2e-3)
    # the variance term makes the Bayes-risk form the stricter one
    assert bayes_risk_dice_loss(alpha, onehot) > evidential_dice_loss(alpha, onehot)


def test_bayes_risk_is_finite_at_the_logit_clamp():
    logits = torch.full((1, 2, 2, 2), 80.0, requires_grad=True)
    loss = EvidentialSegLoss(dice_form="bayes_risk")(logits, torch.zeros(1, 1, 2, 2), round_=3)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_kl_annealing_weight():
    assert kl_annealing_weight(1) == pytest.approx(0.001)
    assert kl_annealing_weight(5) == pytest.approx(0.005)
    assert kl_annealing_weight(10) == pytest.approx(0.01)
    assert kl_annealing_weight(37) == pytest.approx(0.01)
    assert kl_annealing_weight(3, lam=0.1, anneal_rounds=4) == pytest.approx(0.075)
    with pytest.raises(ValueError):
        kl_annealing_weight(-1)


def test_seg_loss_penalises_wrong_evidence_more_as_rounds_go_on():
    labels = torch.zeros(1, 1, 4, 4)
    logits = torch.zeros(1, 2, 4, 4)
    logits[:, 1] = 6.0  # confident and wrong everywhere
    loss = EvidentialSegLoss()
    early, late = loss(logits, labels, 1), loss(logits, labels, 10)
    kl = kl_dirichlet_to_uniform(torch.tensor([1.0, math.exp(6.0) + 1.0]).view(1, 2, 1, 1)).item()
    assert (late - early).item() == pytest.approx((0.01 - 0.001) * kl, rel=1e-4)
    assert loss(logits, labels, 30).item() == pytest.approx(late.item(), rel=1e-6)


def test_one_hot_labels_rejects_out_of_range():
    with pytest.raises(ValueError):
        one_hot_labels(torch.full((1, 1, 2, 2), 2.0), 2)


# ------------------------------------------------------------------------------------------------
# weight update


def test_update_beta_two_rounds_by_hand():
    beta0 = [0.5, 0.3, 0.2]
    # round 1: G*R = (0.1*2, 0.2*1, 0.3*1) = (0.2, 0.2, 0.3); beta0 + G*R = (0.7, 0.5, 0.5), sum 1.7
    beta1 = update_beta(beta0, G=[0.1, 0.2, 0.3], R=[2.0, 1.0, 1.0])
    np.testing.assert_allclose(beta1, [7 / 17, 5 / 17, 5 / 17], rtol=1e-12)
    # round 2: G*R = (0, 0.1, 0.8); (70, 67, 186) / 170, sum 323 / 170
    beta2 = update_beta(beta1, G=[0.0, 0.1, 0.4], R=[1.0, 1.0, 2.0])
    np.testing.assert_allclose(beta2, [70 / 323, 67 / 323, 186 / 323], rtol=1e-12)
    # delta scales the step: delta = 0.5 halves G*R
    half = update_beta(beta0, G=[0.1, 0.2, 0.3], R=[2.0, 1.0, 1.0], delta=0.5)
    np.testing.assert_allclose(half, np.array([0.6, 0.4, 0.35]) / 1.35, rtol=1e-12)


def test_update_beta_without_accumulation_forgets_the_previous_weights():
    # G*R = (0.2, 0.2, 0.3) alone, sum 0.7: whatever the previous weights were
    for beta0 in ([0.5, 0.3, 0.2], [0.1, 0.1, 0.8]):
        np.testing.assert_allclose(update_beta(beta0, G=[0.1, 0.2, 0.3], R=[2.0, 1.0, 1.0], accumulate=False),
                                   [2 / 7, 2 / 7, 3 / 7], rtol=1e-12)


def test_update_beta_mapping_keeps_sites():
    out = update_beta({"b": 0.3, "a": 0.7}, G={"a": 0.1, "b": 0.1}, R={"a": 1.0, "b": 3.0})
    assert list(out) == ["b", "a"]
    assert out["a"] == pytest.approx(0.8 / 1.4) and out["b"] == pytest.approx(0.6 / 1.4)
    with pytest.raises(ValueError):
        update_beta({"a": 0.5, "b": 0.5}, G={"a": 0.1}, R={"a": 1.0, "b": 1.0})


def test_update_beta_clip():
    # normalised weights (0.9995, 0.0005): the clip lifts the second to 1e-3
    raw = update_beta([0.9995, 0.0005], G=[0.0, 0.0], R=[1.0, 1.0], renormalise_after_clip=False)
    np.testing.assert_allclose(raw, [0.9995, 0.001], rtol=1e-12)  # the reference code: sums to 1.0005
    renorm = update_beta([0.9995, 0.0005], G=[0.0, 0.0], R=[1.0, 1.0])
    np.testing.assert_allclose(renorm, [0.9995 / 1.0005, 0.001 / 1.0005], rtol=1e-12)
    assert renorm.sum() == pytest.approx(1.0, abs=1e-15)


# Reference log (FedEvi code, polyp, 4 sites with 700/138/267/429 training images):
#   beta0 = n / sum(n) = [0.45632334 0.08996089 0.17405476 0.27966102]
#   beta1 =              [0.38058908 0.13825581 0.19505428 0.28610083]
# With beta1 = (beta0 + g) / (1 + D), g_k = delta * G_k * R_k and D = sum(g), one step of normalised
# weights only fixes g up to its total: g_k = beta1_k (1 + D) - beta0_k. The data are consistent with
# delta = 1 for every D with all g_k > 0, i.e. D > max(beta0 / beta1) - 1 = 0.1990 (client 0 shrinks,
# so the others must have gained at least that much). The reference run's later rounds shrink the gap
# to the limiting weights by ~0.7 per round, i.e. D ~ 0.43, so G*R ~ 0.1 per site.
LOG_N = np.array([700, 138, 267, 429], dtype=np.float64)
LOG_BETA1 = np.array([0.38058908, 0.13825581, 0.19505428, 0.28610083])


def implied_gr(beta0, beta1, total):
    return beta1 * (1.0 + total) - beta0


@pytest.mark.parametrize("total", [0.25, 0.43, 1.0])
def test_reference_log_round_one(total):
    beta0 = LOG_N / LOG_N.sum()
    np.testing.assert_allclose(beta0, [0.456, 0.090, 0.174, 0.280], atol=5e-4)  # the spec's rounding
    gr = implied_gr(beta0, LOG_BETA1, total)
    assert np.all(gr > 0) and gr.sum() == pytest.approx(total, abs=1e-7)
    beta1 = update_beta(beta0, G=gr, R=np.ones(4), delta=1.0)
    np.testing.assert_allclose(beta1, LOG_BETA1, atol=1e-7)
    np.testing.assert_allclose(beta1, [0.381, 0.138, 0.195, 0.286], atol=5e-4)


def test_reference_log_needs_enough_total_adjustment():
    beta0 = LOG_N / LOG_N.sum()
    bound = float(np.max(beta0 / LOG_BETA1) - 1.0)
    assert bound == pytest.approx(0.1990, abs=1e-4)
    # below the bound the implied G*R of client 0 would be negative, which G, R >= 0 rule out
    assert implied_gr(beta0, LOG_BETA1, bound - 1e-3)[0] < 0
    assert implied_gr(beta0, LOG_BETA1, bound + 1e-3)[0] > 0


def test_reliability_forms():
    assert reliability(A=0.25, form="code") == pytest.approx(4.0)
    assert reliability(A=0.25, form="paper", inv_mean=5.5) == pytest.approx(5.5)
    # per-image aleatoric uncertainties (0.1, 0.4): paper form mean(1/u) = 6.25 >= code form 1/mean(u) = 4
    u = np.array([0.1, 0.4])
    assert reliability(A=u.mean(), form="paper", inv_mean=(1 / u).mean()) > reliability(A=u.mean(), form="code")
    with pytest.raises(ValueError):
        reliability(A=0.0, form="code")
    with pytest.raises(ValueError):
        reliability(A=0.3, form="paper")
    with pytest.raises(ValueError):
        reliability(A=0.3, form="other")
