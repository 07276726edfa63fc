"""FedEFM's earth mover's distance against scipy's LP solver, closed forms and finite differences."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from fedseg.foundation.emd import batch_emd, cosine_cost, emd_distance, emd_marginals


def _linprog_emd(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> float:
    """The transport LP written out: min <G, M> s.t. G 1 = a, G^T 1 = b, G >= 0 (G flattened row-major)."""
    n, k = cost.shape
    rows = np.kron(np.eye(n), np.ones((1, k)))  # sum over k of G[i, k]
    cols = np.kron(np.ones((1, n)), np.eye(k))  # sum over i of G[i, k]
    res = linprog(cost.ravel(), A_eq=np.vstack([rows, cols]), b_eq=np.concatenate([a, b]), bounds=(0, None), method="highs")
    assert res.status == 0
    return float(res.fun)


def _features(seed: int, n: int, k: int, d: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    # a shared offset makes most dot products positive, so the marginals are not mostly the floor
    shift = torch.randn(d, generator=g, dtype=dtype)
    return torch.randn(n, d, generator=g, dtype=dtype) + shift, torch.randn(k, d, generator=g, dtype=dtype) + shift


# ------------------------------------------------------------------------------------- the LP
@pytest.mark.parametrize("n,k,d", [(1, 1, 3), (2, 3, 4), (4, 4, 8), (5, 3, 6), (7, 9, 5), (16, 16, 12)])
def test_emd_equals_scipy_linprog(n, k, d):
    u, v = _features(n * 100 + k, n, k, d)
    a, b = emd_marginals(u, v)
    expected = _linprog_emd(a.numpy(), b.numpy(), cosine_cost(u, v).numpy())
    assert float(emd_distance(u, v)) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # and POT on plain numpy arrays agrees with its torch path
    assert float(ot.emd2(a.numpy(), b.numpy(), cosine_cost(u, v).numpy())) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_emd_closed_forms():
    u, v = _features(1, 1, 5, 4)
    # one supplier: the only feasible plan sends b_k to every demander
    _, b = emd_marginals(u, v)
    assert float(emd_distance(u, v)) == pytest.approx(float((b * cosine_cost(u, v)[0]).sum()), rel=1e-12)
    # one node each: the cost itself
    u1, v1 = u[:1], v[:1]
    cos = float(torch.dot(u1[0], v1[0]) / (u1.norm() * v1.norm()))
    assert float(emd_distance(u1, v1)) == pytest.approx(1.0 - cos, rel=1e-12)
    # swapping the sets swaps the marginals and transposes the cost: the same value
    u, v = _features(2, 6, 4, 5)
    assert float(emd_distance(u, v)) == pytest.approx(float(emd_distance(v, u)), rel=1e-10)


def test_cosine_cost_against_numpy():
    u, v = _features(3, 4, 6, 5)
    un, vn = u.numpy(), v.numpy()
    expected = 1 - (un @ vn.T) / np.outer(np.linalg.norm(un, axis=1), np.linalg.norm(vn, axis=1))
    np.testing.assert_allclose(cosine_cost(u, v).numpy(), expected, rtol=1e-12, atol=1e-14)


def test_marginals_match_hand_computation():
    u = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    v = torch.tensor([[2.0, 0.0], [0.0, 4.0]], dtype=torch.float64)
    a, b = emd_marginals(u, v)
    # mean v = (1, 2): <u_i, (1, 2)> = 1, 2, -3 -> relu + 1e-3
    raw_a = np.array([1.001, 2.001, 0.001])
    # mean u = (0, 0): every <v_k, 0> = 0 -> only the floor, so uniform
    np.testing.assert_allclose(a.numpy(), raw_a / raw_a.sum(), rtol=1e-12)
    np.testing.assert_allclose(b.numpy(), [0.5, 0.5], rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), k=st.integers(1, 8), d=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3))
def test_emd_nonnegative_and_marginals_are_distributions(n, k, d, seed, scale):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(k, d, generator=g, dtype=torch.float64) * scale
    a, b = emd_marginals(u, v)
    assert a.shape == (n,) and b.shape == (k,)
    assert bool((a > 0).all()) and bool((b > 0).all())
    assert float(a.sum()) == pytest.approx(1.0, abs=1e-12) and float(b.sum()) == pytest.approx(1.0, abs=1e-12)
    assert not a.requires_grad and not b.requires_grad
    value = float(emd_distance(u, v))
    assert 0.0 <= value <= 2.0 + 1e-12


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 10), d=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_identical_sets_have_zero_emd(n, d, seed):
    u = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert abs(float(emd_distance(u, u.clone()))) < 1e-9
    # a permuted copy of the same set too (the plan follows the permutation)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))
    assert abs(float(emd_distance(u, u[perm]))) < 1e-9


# ---------------------------------------------------------------------------------- gradients
def _central_differences(fn, x: torch.Tensor, h: float = 1e-6) -> torch.Tensor:
    grad = torch.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        up, down = x.clone(), x.clone()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (fn(up) - fn(down)) / (2 * h)
    return grad


@pytest.mark.parametrize("n,k,d,seed", [(3, 3, 4, 0), (4, 6, 5, 1), (6, 4, 3, 2), (8, 8, 6, 3)])
def test_gradient_matches_central_finite_differences(n, k, d, seed):
    u, v = _features(seed, n, k, d)
    # the marginals are constants of the problem (detached), so the finite differences hold them fixed
    marginals = emd_marginals(u, v)
    u_, v_ = u.clone().requires_grad_(True), v.clone().requires_grad_(True)
    emd_distance(u_, v_, marginals=marginals).backward()
    fd_u = _central_differences(lambda x: float(emd_distance(x, v, marginals=marginals)), u)
    fd_v = _central_differences(lambda x: float(emd_distance(u, x, marginals=marginals)), v)
    np.testing.assert_allclose(u_.grad.numpy(), fd_u.numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(v_.grad.numpy(), fd_v.numpy(), rtol=1e-5, atol=1e-8)
    assert float(u_.grad.abs().max()) > 1e-4  # not a vacuous zero gradient


def test_gradient_wrt_cost_is_the_optimal_plan():
    u, v = _features(5, 5, 4, 3)
    a, b = emd_marginals(u, v)
    cost = cosine_cost(u, v).requires_grad_(True)
    ot.emd2(a, b, cost).backward()
    plan = ot.emd(a.numpy(), b.numpy(), cost.detach().numpy())
    np.testing.assert_allclose(cost.grad.numpy(), plan, atol=1e-12)
    np.testing.assert_allclose(plan.sum(1), a.numpy(), atol=1e-12)


def test_batch_emd_matches_per_sample_and_frozen_teacher_gets_no_gradient():
    g = torch.Generator().manual_seed(7)
    student = torch.randn(3, 5, 4, generator=g, requires_grad=True)
    teacher = torch.randn(3, 6, 4, generator=g, requires_grad=True)
    out = batch_emd(student, teacher.detach())
    assert out.shape == (3,)
    for i in range(3):
        assert float(out[i].detach()) == pytest.approx(float(emd_distance(student[i].detach(), teacher[i].detach())), rel=1e-6)
    out.sum().backward()
    assert student.grad is not None and float(student.grad.abs().sum()) > 0
    assert teacher.grad is None
    with pytest.raises(ValueError, match="token sets"):
        batch_emd(student, teacher[:2])
