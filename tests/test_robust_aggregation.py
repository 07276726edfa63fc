"""Robust aggregation: coordinate-wise median and trimmed mean against numpy/scipy, and their bounds under
hostile sites (property tests); the weighted mean's convex-combination and permutation invariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedseg.strategies.aggregation import coordinate_median, robust_average, trimmed_mean, weighted_average
from fedseg.strategies.base import ClientUpdate
from fedseg.strategies.fedavg import FedAvgStrategy
from fedseg.strategies.fedefm import FedEFMStrategy

SHAPE = (2, 3)
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
hostile_values = st.one_of(st.floats(-1e9, 1e9, allow_nan=False), st.sampled_from([0.0, 1e9, -1e9]))


def _models(rows):
    """K flat value lists -> K state dicts ``{"w": (2, 3), "n": counter}``."""
    return [{"w": torch.tensor(r, dtype=torch.float64).view(SHAPE), "n": torch.tensor(7)} for r in rows]


def _array(models):
    return np.stack([m["w"].numpy().ravel() for m in models])


@settings(max_examples=60, deadline=3000)
@given(st.lists(st.lists(finite, min_size=6, max_size=6), min_size=1, max_size=9), st.floats(0.0, 0.49))
def test_median_and_trimmed_mean_match_numpy_and_scipy(rows, trim):
    models = _models(rows)
    x = _array(models)
    np.testing.assert_allclose(coordinate_median(models)["w"].numpy().ravel(), np.median(x, axis=0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(trimmed_mean(models, trim)["w"].numpy().ravel(), stats.trim_mean(x, trim, axis=0), rtol=1e-12, atol=1e-9)
    assert int(coordinate_median(models)["n"]) == 7  # counters are copied, not averaged


@settings(max_examples=60, deadline=3000)
@given(st.data())
def test_mean_is_a_convex_combination_and_permutation_invariant(data):
    k = data.draw(st.integers(1, 7))
    rows = data.draw(st.lists(st.lists(finite, min_size=6, max_size=6), min_size=k, max_size=k))
    raw = data.draw(st.lists(st.floats(0.01, 10.0), min_size=k, max_size=k))
    weights = [w / sum(raw) for w in raw]
    models = _models(rows)
    out = weighted_average(models, weights)["w"].numpy().ravel()
    x = _array(models)
    np.testing.assert_allclose(out, np.asarray(weights) @ x, rtol=1e-9, atol=1e-9)
    assert np.all(out >= x.min(0) - 1e-9) and np.all(out <= x.max(0) + 1e-9)
    perm = data.draw(st.permutations(range(k)))
    permuted = weighted_average([models[i] for i in perm], [weights[i] for i in perm])["w"].numpy().ravel()
    np.testing.assert_allclose(permuted, out, rtol=1e-9, atol=1e-9)
    for aggregation in ("median", "trimmed_mean"):  # the robust ones too
        a = robust_average(models, weights, aggregation, 0.2)["w"]
        b = robust_average([models[i] for i in perm], [weights[i] for i in perm], aggregation, 0.2)["w"]
        torch.testing.assert_close(a, b)


@settings(max_examples=80, deadline=3000)
@given(st.data())
def test_median_stays_within_the_honest_range_when_f_below_half(data):
    k = data.draw(st.integers(1, 9))
    f = data.draw(st.integers(0, (k - 1) // 2))  # f < K/2
    honest = data.draw(st.lists(st.lists(finite, min_size=6, max_size=6), min_size=k - f, max_size=k - f))
    hostile = data.draw(st.lists(st.lists(hostile_values, min_size=6, max_size=6), min_size=f, max_size=f))
    order = data.draw(st.permutations(range(k)))
    rows = [(honest + hostile)[i] for i in order]
    out = coordinate_median(_models(rows))["w"].numpy().ravel()
    h = np.asarray(honest)
    assert np.all(out >= h.min(0) - 1e-9) and np.all(out <= h.max(0) + 1e-9)


@settings(max_examples=80, deadline=3000)
@given(st.data())
def test_trimmed_mean_stays_within_the_honest_range_when_f_at_most_trim_k(data):
    k = data.draw(st.integers(1, 10))
    trim = data.draw(st.floats(0.0, 0.49))
    f = data.draw(st.integers(0, int(trim * k)))  # f <= trim * K (f an integer)
    honest = data.draw(st.lists(st.lists(finite, min_size=6, max_size=6), min_size=k - f, max_size=k - f))
    hostile = data.draw(st.lists(st.lists(hostile_values, min_size=6, max_size=6), min_size=f, max_size=f))
    order = data.draw(st.permutations(range(k)))
    rows = [(honest + hostile)[i] for i in order]
    out = trimmed_mean(_models(rows), trim)["w"].numpy().ravel()
    h = np.asarray(honest)
    assert np.all(out >= h.min(0) - 1e-6) and np.all(out <= h.max(0) + 1e-6)


def test_mean_is_not_robust_which_is_why_the_option_exists():
    honest = [[1.0] * 6, [2.0] * 6, [3.0] * 6]
    hostile = [[1e6] * 6]
    models = _models(honest + hostile)
    assert float(weighted_average(models, [0.25] * 4)["w"].max()) > 1e5
    assert float(coordinate_median(models)["w"].max()) == 2.5
    assert float(trimmed_mean(models, 0.25)["w"].max()) == 2.5


@pytest.mark.parametrize("aggregation, trim, message", [("mode", 0.1, "aggregation must be one of"), ("trimmed_mean", 0.5, "trim")])
def test_bad_options(aggregation, trim, message):
    with pytest.raises(ValueError, match=message):
        FedAvgStrategy(aggregation=aggregation, trim=trim)
    with pytest.raises(ValueError, match=message):
        FedEFMStrategy(aggregation=aggregation, trim=trim)


@pytest.mark.parametrize("aggregation", ["median", "trimmed_mean"])
def test_fedavg_strategy_with_a_robust_aggregation_ignores_one_hostile_site(aggregation):
    strategy = FedAvgStrategy(aggregation=aggregation, trim=0.25)
    start = {"w": torch.zeros(SHAPE)}
    strategy.start(["a", "b", "c", "d"], start)
    values = {"a": 1.0, "b": 2.0, "c": 3.0, "d": -1e6}
    # the hostile site also claims a huge sample count: robust aggregation gives it no weight
    updates = {s: ClientUpdate(site=s, params={"w": torch.full(SHAPE, v)}, n_samples=10**6 if s == "d" else 10) for s, v in values.items()}
    fields = strategy.aggregate(0, updates, exchange=None)
    torch.testing.assert_close(strategy.global_params()["w"], torch.full(SHAPE, 1.5))
    assert fields == {"aggregated": ["a", "b", "c", "d"]}
    assert strategy.config()["aggregation"] == aggregation


def test_fedavg_default_is_unchanged_weighted_mean():
    strategy = FedAvgStrategy()
    strategy.start(["a", "b"], {"w": torch.zeros(SHAPE)})
    updates = {"a": ClientUpdate("a", {"w": torch.ones(SHAPE)}, n_samples=1), "b": ClientUpdate("b", {"w": torch.full(SHAPE, 4.0)}, n_samples=3)}
    fields = strategy.aggregate(0, updates, exchange=None)
    torch.testing.assert_close(strategy.global_params()["w"], torch.full(SHAPE, 3.25))
    assert fields["aggregation_weight"] == {"a": 0.25, "b": 0.75}
