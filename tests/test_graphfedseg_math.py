"""GraphFedSeg maths: graph QP vs closed form, dual-layer aggregation, regulariser, client uncertainty."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fedseg.networks.unet import FeatureUNet
from fedseg.strategies.aggregation import weighted_average
from fedseg.strategies.collaboration_graph import (
    GraphQP,
    collaboration_graph,
    dual_layer_aggregate,
    effective_weight,
    flatten_params,
    graph_rows_closed_form,
    neighbour_direction_from_flat,
    pairwise_cosine,
    project_to_simplex,
    row_norms,
    similarity_keys,
    similarity_regulariser,
)
from fedseg.uncertainty.client_uncertainty import (
    client_uncertainty,
    evidential_image_uncertainty,
    image_uncertainty,
    mc_dropout_pixel_uncertainty,
    mc_pixel_uncertainty,
)


def _random_instance(rng: np.random.Generator, k: int, dim: int = 12):
    """p on the simplex, cos from random vectors sharing a common component, U in [0, 1]."""
    p = rng.dirichlet(np.ones(k) * rng.uniform(0.3, 3.0))
    vectors = rng.normal(size=(k, dim)) + rng.uniform(0.0, 2.0) * rng.normal(size=dim)
    return p, pairwise_cosine(vectors), rng.uniform(0.0, 1.0, size=k)


def _assert_rows_convex(W: np.ndarray, atol: float = 1e-9) -> None:
    assert np.all(W >= 0.0)
    np.testing.assert_allclose(W.sum(axis=-1), 1.0, atol=atol)


# ---------------------------------------------------------------------------------------------------
# graph rows
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 5, 9, 16, 33, 64])
def test_cvxpy_qp_matches_closed_form(k):
    rng = np.random.default_rng(k)
    qp = GraphQP(k)
    for alpha, gamma in [(0.08 * k, 0.4), (rng.uniform(0, 20), rng.uniform(0, 5)), (0.0, 0.0)]:
        p, cos, U = _random_instance(rng, k)
        W_qp = qp.solve_all(p, cos, U, alpha, gamma)
        W_closed = graph_rows_closed_form(p, cos, U, alpha, gamma)
        np.testing.assert_allclose(W_qp, W_closed, atol=1e-6, rtol=0)
        _assert_rows_convex(W_qp)
        _assert_rows_convex(W_closed)


def test_graph_qp_row_minimises_the_paper_objective():
    """The row beats random feasible points and nearby perturbations on Eq. (2)'s objective."""
    rng = np.random.default_rng(0)
    k, alpha, gamma = 6, 0.48, 0.4
    p, cos, U = _random_instance(rng, k)

    def objective(w):
        return np.sum((w - p) ** 2) - alpha * w @ cos[2] + gamma * w @ U

    w = GraphQP(k).solve_row(p, cos[2], U, alpha, gamma)
    best = objective(w)
    for z in rng.dirichlet(np.ones(k), size=500):
        assert objective(z) >= best - 1e-12
        assert objective(0.99 * w + 0.01 * z) >= best - 1e-12


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**31 - 1), st.floats(-50, 50))
def test_projection_satisfies_the_variational_inequality(k, seed, shift):
    """w = proj(v) iff w is on the simplex and <v - w, z - w> <= 0 for every simplex point z."""
    rng = np.random.default_rng(seed)
    v = rng.normal(scale=3.0, size=k) + shift
    w = project_to_simplex(v)
    _assert_rows_convex(w[None, :])
    for z in np.vstack([np.eye(k), rng.dirichlet(np.ones(k), size=20)]):
        assert (v - w) @ (z - w) <= 1e-9 * (1 + np.abs(v).max())


def test_projection_is_vectorised_over_rows():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(7, 5))
    np.testing.assert_allclose(project_to_simplex(v), np.stack([project_to_simplex(row) for row in v]))


def test_projection_hand_example():
    # v = (0.5, 0.5, -1): the two large entries already sum to 1, the third is cut
    np.testing.assert_allclose(project_to_simplex([0.5, 0.5, -1.0]), [0.5, 0.5, 0.0])
    # v = (1, 1): the nearest point of the segment is its midpoint
    np.testing.assert_allclose(project_to_simplex([1.0, 1.0]), [0.5, 0.5])
    # v = (2, 0, 0): tau = 1, w = (1, 0, 0)
    np.testing.assert_allclose(project_to_simplex([2.0, 0.0, 0.0]), [1.0, 0.0, 0.0])


@pytest.mark.parametrize("solver", ["cvxpy", "closed_form"])
def test_high_uncertainty_site_loses_weight_as_gamma_grows(solver):
    p = np.array([0.3, 0.3, 0.2, 0.2])
    cos = np.array(
        [[1.0, 0.6, 0.5, 0.4], [0.6, 1.0, 0.7, 0.3], [0.5, 0.7, 1.0, 0.2], [0.4, 0.3, 0.2, 1.0]]
    )
    U = np.array([0.1, 0.1, 0.9, 0.1])  # site 2 is much more uncertain
    gammas = np.linspace(0.0, 3.0, 16)
    column = np.array([collaboration_graph(p, cos, U, 0.32, g, solver=solver)[:, 2] for g in gammas])  # (G, K)
    assert np.all(np.diff(column, axis=0) <= 1e-9), "weight of the uncertain site must not grow with gamma"
    assert np.all(column[0] > 0.05) and np.all(column[-1] < 1e-9), "it starts included and ends cut off"
    # the other sites absorb the mass: rows stay convex
    for g in gammas:
        _assert_rows_convex(collaboration_graph(p, cos, U, 0.32, g, solver=solver))


@pytest.mark.parametrize("solver", ["cvxpy", "closed_form"])
def test_no_similarity_no_penalty_gives_rows_equal_to_p(solver):
    rng = np.random.default_rng(3)
    p, cos, U = _random_instance(rng, 5)
    W = collaboration_graph(p, cos, U, alpha=0.0, gamma=0.0, solver=solver)
    np.testing.assert_allclose(W, np.tile(p, (5, 1)), atol=1e-9)


def test_collaboration_graph_rejects_bad_input():
    with pytest.raises(ValueError):
        collaboration_graph([0.5, 0.5], np.eye(3), [0.1, 0.1], 0.1, 0.1)
    with pytest.raises(ValueError):
        collaboration_graph([0.5, 0.5], np.eye(2), [0.1, 0.1], 0.1, 0.1, solver="newton")


# ---------------------------------------------------------------------------------------------------
# hypothesis: convexity, permutation invariance, identical clients
# ---------------------------------------------------------------------------------------------------


@st.composite
def graph_instances(draw, max_k: int = 7):
    k = draw(st.integers(1, max_k))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k))
    vectors = rng.normal(size=(k, 8)) + draw(st.floats(0, 3)) * rng.normal(size=8)
    U = rng.uniform(0, 1, size=k) ** draw(st.floats(0.2, 4))
    alpha = draw(st.floats(0, 10))
    gamma = draw(st.floats(0, 5))
    lam = draw(st.floats(0, 1))
    return p, vectors, U, alpha, gamma, lam, rng


@settings(max_examples=40, deadline=None)
@given(graph_instances(), st.sampled_from(["cvxpy", "closed_form"]))
def test_graph_rows_and_effective_weights_are_convex(instance, solver):
    p, vectors, U, alpha, gamma, lam, _ = instance
    W = collaboration_graph(p, pairwise_cosine(vectors), U, alpha, gamma, solver=solver)
    _assert_rows_convex(W)
    _assert_rows_convex(effective_weight(p, W, lam)[None, :])


@settings(max_examples=40, deadline=None)
@given(graph_instances(), st.sampled_from(["cvxpy", "closed_form"]))
def test_permuting_clients_permutes_the_graph(instance, solver):
    p, vectors, U, alpha, gamma, _, rng = instance
    perm = rng.permutation(len(p))
    W = collaboration_graph(p, pairwise_cosine(vectors), U, alpha, gamma, solver=solver)
    W_perm = collaboration_graph(p[perm], pairwise_cosine(vectors[perm]), U[perm], alpha, gamma, solver=solver)
    np.testing.assert_allclose(W_perm, W[np.ix_(perm, perm)], atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(graph_instances(max_k=5), st.sampled_from(["cvxpy", "closed_form"]))
def test_identical_clients_reduce_to_sample_weighted_averaging(instance, solver):
    """Collinear models (cos = 1) with equal uncertainty: W rows = p, theta_global = FedAvg."""
    p, _, U, alpha, gamma, lam, rng = instance
    k = len(p)
    base = {"w": torch.from_numpy(rng.normal(size=(3, 4))).float(), "b": torch.from_numpy(rng.normal(size=4)).float()}
    scales = rng.uniform(0.5, 2.0, size=k)
    models = [{key: float(s) * v for key, v in base.items()} for s in scales]
    cos = pairwise_cosine(torch.stack([flatten_params(m, ["w", "b"]) for m in models]))
    W = collaboration_graph(p, cos, np.full(k, U[0]), alpha, gamma, solver=solver)
    np.testing.assert_allclose(W, np.tile(p, (k, 1)), atol=1e-5)
    theta_global, _, _, _ = dual_layer_aggregate(models, p, W, lam)
    fedavg = weighted_average(models, p.tolist())
    for key in base:
        torch.testing.assert_close(theta_global[key], fedavg[key], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------
# cosine, aggregation, regulariser
# ---------------------------------------------------------------------------------------------------


def test_pairwise_cosine_matches_torch_and_handles_zero_rows():
    torch.manual_seed(0)
    x = torch.randn(5, 1000)
    x[3] = 0.0
    cos = pairwise_cosine(x, chunk=64)  # several column blocks
    for i in range(5):
        for j in range(5):
            expected = 1.0 if i == j else F.cosine_similarity(x[i].double(), x[j].double(), dim=0).item()
            assert cos[i, j] == pytest.approx(expected, abs=1e-6)
    assert np.all(cos[3, [0, 1, 2, 4]] == 0.0)


def test_similarity_keys_skip_counters_and_running_stats():
    params = {
        "conv.weight": torch.zeros(2, 2),
        "bn.weight": torch.zeros(2),
        "bn.running_mean": torch.zeros(2),
        "bn.running_var": torch.ones(2),
        "bn.num_batches_tracked": torch.tensor(3),
    }
    assert similarity_keys(params) == ["conv.weight", "bn.weight"]


def _toy_models(rng: np.random.Generator, k: int):
    return [
        {
            "conv.weight": torch.from_numpy(rng.normal(size=(4, 3, 3, 3))).float(),
            "conv.bias": torch.from_numpy(rng.normal(size=4)).float(),
            "bn.running_mean": torch.from_numpy(rng.normal(size=4)).float(),
            "bn.num_batches_tracked": torch.tensor(int(rng.integers(0, 100))),
        }
        for _ in range(k)
    ]


def test_dual_layer_aggregation_matches_brute_force():
    rng = np.random.default_rng(7)
    k, lam = 4, 0.3
    models = _toy_models(rng, k)
    p = rng.dirichlet(np.ones(k))
    W = rng.dirichlet(np.ones(k), size=k)
    theta_global, neigh, base, graph = dual_layer_aggregate(models, p, W, lam, chunk_elems=16)  # many blocks

    for key, ref in models[0].items():
        if not torch.is_floating_point(ref):
            for out in neigh + [base, graph, theta_global]:
                assert torch.equal(out[key], ref)
            continue
        want_base = sum(p[j] * models[j][key].double() for j in range(k))
        want_neigh = [sum(W[i, j] * models[j][key].double() for j in range(k)) for i in range(k)]
        want_graph = sum(want_neigh) / k
        want_global = lam * want_base + (1 - lam) * want_graph
        torch.testing.assert_close(base[key].double(), want_base, atol=1e-6, rtol=0)
        torch.testing.assert_close(graph[key].double(), want_graph, atol=1e-6, rtol=0)
        torch.testing.assert_close(theta_global[key].double(), want_global, atol=1e-6, rtol=0)
        for i in range(k):
            torch.testing.assert_close(neigh[i][key].double(), want_neigh[i], atol=1e-6, rtol=0)
            assert neigh[i][key].dtype == ref.dtype and neigh[i][key].shape == ref.shape


def test_identical_clients_leave_the_model_unchanged():
    rng = np.random.default_rng(8)
    model = _toy_models(rng, 1)[0]
    p = rng.dirichlet(np.ones(3))
    W = rng.dirichlet(np.ones(3), size=3)
    theta_global, neigh, base, graph = dual_layer_aggregate([model] * 3, p, W, 0.2)
    for out in [theta_global, base, graph] + neigh:
        for key, ref in model.items():
            torch.testing.assert_close(out[key], ref, atol=1e-6, rtol=0)


def test_dual_layer_aggregation_rejects_non_convex_weights():
    models = _toy_models(np.random.default_rng(0), 2)
    with pytest.raises(ValueError):
        dual_layer_aggregate(models, [0.5, 0.5], [[1.2, -0.2], [0.5, 0.5]], 0.2)
    with pytest.raises(ValueError):
        dual_layer_aggregate(models, [0.7, 0.7], np.full((2, 2), 0.5), 0.2)


def test_effective_weight_is_the_coefficient_of_each_model_in_theta_global():
    """theta_global of one-hot 'models' e_j recovers the effective weight of client j."""
    rng = np.random.default_rng(9)
    k, lam = 5, 0.2
    p = rng.dirichlet(np.ones(k))
    W = rng.dirichlet(np.ones(k), size=k)
    one_hot = [{"x": torch.eye(k, dtype=torch.float64)[j]} for j in range(k)]
    theta_global, _, _, _ = dual_layer_aggregate(one_hot, p, W, lam)
    np.testing.assert_allclose(theta_global["x"].numpy(), effective_weight(p, W, lam), atol=1e-12)


@pytest.mark.parametrize("exclude_self", [True, False])
def test_similarity_regulariser_matches_sum_of_cosines(exclude_self):
    rng = np.random.default_rng(10)
    models = _toy_models(rng, 4)
    keys = similarity_keys(models[0])
    W_row = rng.dirichlet(np.ones(4))
    i, lambda1 = 1, 0.05
    vectors = torch.stack([flatten_params(m, keys) for m in models])
    direction = neighbour_direction_from_flat(vectors, W_row, exclude=i if exclude_self else None)

    theta = flatten_params(models[i], keys).double().requires_grad_(True)
    reg = similarity_regulariser(theta, direction.double(), lambda1)
    (grad,) = torch.autograd.grad(reg, theta)

    theta_ref = theta.detach().clone().requires_grad_(True)
    js = [j for j in range(4) if not (exclude_self and j == i)]
    expected = -0.5 * lambda1 * sum(
        W_row[j] * F.cosine_similarity(theta_ref, flatten_params(models[j], keys).double(), dim=0) for j in js
    )
    (grad_ref,) = torch.autograd.grad(expected, theta_ref)
    assert reg.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-9)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-4, atol=1e-9)


def test_neighbour_direction_with_shared_norms_matches_numpy():
    # the server computes the K norms once per round and reuses them for every site's direction
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(5, 300)).astype(np.float32)
    vectors[3] = 0.0  # a zero model contributes nothing
    W_row = rng.dirichlet(np.ones(5))
    norms = row_norms(torch.from_numpy(vectors))
    np.testing.assert_allclose(norms.numpy(), np.linalg.norm(vectors.astype(np.float64), axis=1), rtol=1e-12)
    for exclude in (None, 1):
        w = W_row.copy()
        if exclude is not None:
            w[exclude] = 0.0
        safe = np.where(norms.numpy() > 0, norms.numpy(), 1.0)
        expected = ((w / safe) * (norms.numpy() > 0)) @ vectors.astype(np.float64)
        for norms_given in (None, norms):
            got = neighbour_direction_from_flat(torch.from_numpy(vectors), W_row, exclude=exclude, norms=norms_given)
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="norms"):
        neighbour_direction_from_flat(torch.from_numpy(vectors), W_row, norms=norms[:3])


def test_similarity_regulariser_per_parameter_form_matches_cosine_and_closed_form_gradient():
    # the form training uses: one tensor per parameter, never concatenated
    gen = torch.Generator().manual_seed(4)
    shapes = [(3, 2, 3, 3), (3,), (5, 3), (1,)]
    params = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]
    direction = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    lambda1 = 0.3
    reg = similarity_regulariser(params, direction, lambda1)
    grads = torch.autograd.grad(reg, params)

    theta = torch.cat([p.detach().reshape(-1) for p in params])
    d = torch.cat([x.reshape(-1) for x in direction])
    # -(l/2) <theta/|theta|, d> = -(l/2) |d| cos(theta, d)
    expected = -0.5 * lambda1 * d.norm() * F.cosine_similarity(theta, d, dim=0)
    assert reg.item() == pytest.approx(expected.item(), rel=1e-12)
    # d/dtheta = -(l/2) (d / |theta| - <theta, d> theta / |theta|^3)
    n = theta.norm()
    grad_closed = -0.5 * lambda1 * (d / n - torch.dot(theta, d) * theta / n**3)
    torch.testing.assert_close(torch.cat([g.reshape(-1) for g in grads]), grad_closed, rtol=1e-12, atol=1e-15)

    with pytest.raises(ValueError, match="tensors"):
        similarity_regulariser(params, direction[:2], lambda1)


# ---------------------------------------------------------------------------------------------------
# client uncertainty
# ---------------------------------------------------------------------------------------------------


def test_evidential_image_uncertainty_hand_example():
    # one 2-class 2x2 image; per pixel alpha_c = exp(z_c) + 1, u = 2 / (alpha_0 + alpha_1)
    #   (0, 0)          -> alpha (2, 2)  -> u = 2/4  = 0.5
    #   (0, ln 3)       -> alpha (2, 4)  -> u = 2/6  = 1/3
    #   (ln 3, ln 3)    -> alpha (4, 4)  -> u = 2/8  = 0.25
    #   (ln 7, 0)       -> alpha (8, 2)  -> u = 2/10 = 0.2
    l3, l7 = math.log(3.0), math.log(7.0)
    class0 = torch.tensor([[0.0, 0.0], [l3, l7]])
    class1 = torch.tensor([[0.0, l3], [l3, 0.0]])
    logits = torch.stack([class0, class1])[None]  # (1, 2, 2, 2)
    expected = (0.5 + 1 / 3 + 0.25 + 0.2) / 4
    assert evidential_image_uncertainty(logits).tolist() == pytest.approx([expected], abs=1e-7)


def test_evidential_image_uncertainty_is_finite_for_saturated_logits():
    logits = torch.tensor([1000.0, 0.0]).reshape(1, 2, 1, 1)  # would overflow exp() without the clamp
    u = evidential_image_uncertainty(logits)
    assert torch.isfinite(u).all() and 0 < u.item() < 1e-30


def test_client_uncertainty_is_mean_over_images_not_batches():
    batches = [torch.tensor([0.2, 0.4, 0.6]), torch.tensor([1.0])]
    assert client_uncertainty(batches) == pytest.approx(0.55)  # not (0.4 + 1.0) / 2
    with pytest.raises(ValueError):
        client_uncertainty([])


def test_mc_pixel_uncertainty_hand_example():
    # one pixel, two classes, T = 2 samples: p = (0.9, 0.1) and (0.5, 0.5); mean (0.7, 0.3)
    probs = torch.tensor([[0.9, 0.1], [0.5, 0.5]], dtype=torch.float64).reshape(2, 1, 2, 1, 1)
    h = lambda q: -sum(x * math.log(x) for x in q)  # noqa: E731
    entropy = h([0.7, 0.3])
    mutual_information = entropy - 0.5 * (h([0.9, 0.1]) + h([0.5, 0.5]))
    variance = ((0.9 - 0.7) ** 2 + (0.5 - 0.7) ** 2) / 2  # the same for both classes
    assert mc_pixel_uncertainty(probs, "entropy").item() == pytest.approx(entropy / math.log(2))
    assert mc_pixel_uncertainty(probs, "mutual_information").item() == pytest.approx(mutual_information / math.log(2))
    assert mc_pixel_uncertainty(probs, "variance").item() == pytest.approx(variance)


@pytest.mark.parametrize("measure", ["mutual_information", "variance"])
def test_mc_dropout_uncertainty_needs_dropout(measure):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    with_dropout = FeatureUNet(channels=(4, 8), dropout=0.2)
    with_dropout.train()  # the function must not leave it in another mode
    u = image_uncertainty(mc_dropout_pixel_uncertainty(with_dropout, x, num_samples=5, measure=measure))
    assert u.shape == (2,) and torch.all(u > 0)
    assert with_dropout.training and all(m.training for m in with_dropout.modules())

    without_dropout = FeatureUNet(channels=(4, 8), dropout=0.0).eval()
    u0 = image_uncertainty(mc_dropout_pixel_uncertainty(without_dropout, x, num_samples=5, measure=measure))
    assert torch.all(u0.abs() < 1e-9)
    assert not any(m.training for m in without_dropout.modules())
