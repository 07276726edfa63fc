"""FedEFM's distillation loss against hand computations in numpy and torch's own KL."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fedseg.foundation.distillation import distillation_loss, soft_kl, teacher_weights
from fedseg.foundation.emd import batch_emd


def _batch(seed: int, b: int = 4, c: int = 5, n: int = 6, d: int = 8, teachers: int = 3):
    g = torch.Generator().manual_seed(seed)
    z_s = torch.randn(b, c, generator=g, dtype=torch.float64, requires_grad=True)
    f_s = torch.randn(b, n, d, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, c, (b,), generator=g)
    z_t = [torch.randn(b, c, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(teachers)]
    f_t = [torch.randn(b, n, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(teachers)]
    return z_s, f_s, y, z_t, f_t


def _np_log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def _np_ce(z: np.ndarray, y: np.ndarray) -> float:
    return float(-_np_log_softmax(z)[np.arange(len(y)), y].mean())


def _np_kl(z_t: np.ndarray, z_s: np.ndarray, temp: float) -> float:
    lt, ls = _np_log_softmax(z_t / temp), _np_log_softmax(z_s / temp)
    return float((np.exp(lt) * (lt - ls)).sum(1).mean())


# ------------------------------------------------------------------------------------ weights
@settings(max_examples=50, deadline=None)
@given(emds=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=6), tau=st.floats(0.01, 10.0))
def test_teacher_weights_sum_to_one_and_favour_the_smaller_emd(emds, tau):
    e = torch.tensor(emds, dtype=torch.float64)
    w = teacher_weights(e, tau)
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-12) and bool((w >= 0).all())
    order = torch.argsort(e)
    assert bool((w[order][1:] <= w[order][:-1] + 1e-15).all())  # smaller EMD, larger weight
    # the closed form: w_t proportional to exp(-EMD_t / tau)
    raw = np.exp(-(np.array(emds) - min(emds)) / tau)
    np.testing.assert_allclose(w.numpy(), raw / raw.sum(), rtol=1e-10, atol=1e-300)


def test_teacher_weights_two_teachers_is_a_sigmoid_and_uniform_without_emd():
    w = teacher_weights(torch.tensor([0.3, 0.5], dtype=torch.float64), tau=0.1)
    assert float(w[0]) == pytest.approx(1 / (1 + np.exp(-(0.5 - 0.3) / 0.1)), rel=1e-12)
    np.testing.assert_array_equal(teacher_weights(torch.tensor([0.3, 0.5, 9.0]), 0.1, use_emd=False).numpy(), np.full(3, 1 / 3, np.float32))
    e = torch.tensor([0.2, 0.4], requires_grad=True)
    assert not teacher_weights(e, 0.1).requires_grad  # the weights never pass gradient to the EMDs
    with pytest.raises(ValueError):
        teacher_weights(torch.tensor([]), 0.1)


# --------------------------------------------------------------------------------------- KL
def test_soft_kl_matches_torch_kl_div_and_numpy():
    z_s, _, _, z_t, _ = _batch(0)
    temp = 4.0
    ours = soft_kl(z_t[0], z_s, temp).item()
    # torch's KL(target || input) with input = log q_student, target = p_teacher, averaged over the batch
    theirs = F.kl_div(F.log_softmax(z_s / temp, 1), F.softmax(z_t[0] / temp, 1), reduction="batchmean").item()
    assert ours == pytest.approx(theirs, rel=1e-12)
    assert ours == pytest.approx(_np_kl(z_t[0].detach().numpy(), z_s.detach().numpy(), temp), rel=1e-12)
    assert soft_kl(z_s, z_s, temp).item() == pytest.approx(0.0, abs=1e-15)


# ------------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("alpha,temp", [(0.5, 4.0), (0.3, 1.0), (1.0, 2.0)])
def test_without_emd_equals_hand_computed_ce_plus_kl(alpha, temp):
    z_s, _, y, z_t, _ = _batch(1)
    loss, info = distillation_loss(z_s, None, y, z_t, None, alpha=alpha, temperature=temp, use_emd=False)
    zs, yy = z_s.detach().numpy(), y.numpy()
    kls = [_np_kl(z.detach().numpy(), zs, temp) for z in z_t]
    expected = (1 - alpha) * _np_ce(zs, yy) + np.mean([alpha * temp**2 * k for k in kls])
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert info["emd"] is None
    np.testing.assert_allclose(info["weights"].numpy(), np.full(3, 1 / 3))
    np.testing.assert_allclose(info["kl"].numpy(), kls, rtol=1e-12)
    # the tokens are ignored without EMD: passing them changes nothing
    _, f_s, _, _, f_t = _batch(1)
    assert distillation_loss(z_s, f_s, y, z_t, f_t, alpha=alpha, temperature=temp, use_emd=False)[0].item() == loss.item()


def test_alpha_zero_is_plain_cross_entropy():
    z_s, f_s, y, z_t, f_t = _batch(2)
    for use_emd in (False, True):
        loss, _ = distillation_loss(z_s, f_s, y, z_t, f_t, alpha=0.0, mu=0.0, use_emd=use_emd)
        assert loss.item() == pytest.approx(F.cross_entropy(z_s, y).item(), rel=1e-12)
        assert loss.item() == pytest.approx(_np_ce(z_s.detach().numpy(), y.numpy()), rel=1e-12)


def test_with_emd_equals_hand_computed_form():
    z_s, f_s, y, z_t, f_t = _batch(3)
    alpha, temp, tau, mu = 0.4, 3.0, 0.05, 0.2
    loss, info = distillation_loss(z_s, f_s, y, z_t, f_t, alpha=alpha, temperature=temp, tau=tau, mu=mu)
    emds = np.array([float(batch_emd(f_s.detach(), f.detach()).mean()) for f in f_t])
    w = np.exp(-emds / tau) / np.exp(-emds / tau).sum()
    zs = z_s.detach().numpy()
    kls = np.array([_np_kl(z.detach().numpy(), zs, temp) for z in z_t])
    expected = (1 - alpha) * _np_ce(zs, y.numpy()) + float((w * (alpha * temp**2 * kls + mu * emds)).sum())
    assert loss.item() == pytest.approx(expected, rel=1e-10)
    np.testing.assert_allclose(info["emd"].numpy(), emds, rtol=1e-12)
    np.testing.assert_allclose(info["weights"].numpy(), w, rtol=1e-10)


def test_a_teacher_with_identical_features_gets_the_most_weight():
    z_s, f_s, y, z_t, f_t = _batch(4)
    f_t[1] = f_s.detach().clone()  # transports to the student at zero cost
    _, info = distillation_loss(z_s, f_s, y, z_t, f_t)
    assert float(info["emd"][1]) == pytest.approx(0.0, abs=1e-9)
    assert int(info["weights"].argmax()) == 1


def test_gradient_flows_to_the_student_only():
    z_s, f_s, y, z_t, f_t = _batch(5)
    loss, info = distillation_loss(z_s, f_s, y, z_t, f_t)
    loss.backward()
    assert float(z_s.grad.abs().sum()) > 0 and float(f_s.grad.abs().sum()) > 0  # the EMD term reaches the tokens
    assert all(t.grad is None for t in z_t + f_t)
    assert not info["emd"].requires_grad and not info["weights"].requires_grad
    # the token gradient is exactly mu * sum_t w_t dEMD_t/dF_s (the weights themselves pass none)
    f = f_s.detach().clone().requires_grad_(True)
    w = info["weights"]
    (0.1 * sum(w[i] * batch_emd(f, f_t[i].detach()).mean() for i in range(3))).backward()
    torch.testing.assert_close(f_s.grad, f.grad, rtol=1e-10, atol=1e-14)


def test_invalid_arguments_raise():
    z_s, f_s, y, z_t, f_t = _batch(6)
    with pytest.raises(ValueError, match="at least one teacher"):
        distillation_loss(z_s, f_s, y, [], [])
    with pytest.raises(ValueError, match="tokens"):
        distillation_loss(z_s, None, y, z_t, None, use_emd=True)
    with pytest.raises(ValueError, match="alpha"):
        distillation_loss(z_s, f_s, y, z_t, f_t, alpha=1.5)
