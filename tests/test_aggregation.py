"""FedAvg aggregation: closed-form checks and hypothesis properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedseg.strategies.aggregation import sample_weights, weighted_average
from fedseg.strategies.base import ClientUpdate
from fedseg.strategies.fedavg import FedAvgStrategy


def _models(values):
    return [{"w": torch.full((2, 2), float(v)), "n": torch.tensor(1)} for v in values]


def test_weighted_average_closed_form():
    out = weighted_average(_models([1.0, 3.0]), [0.25, 0.75])
    assert torch.allclose(out["w"], torch.full((2, 2), 2.5))
    assert out["n"].item() == 1  # counters are not averaged


def test_weights_must_be_convex():
    with pytest.raises(ValueError, match="convex"):
        weighted_average(_models([1, 2]), [0.7, 0.7])
    with pytest.raises(ValueError, match="convex"):
        weighted_average(_models([1, 2]), [1.5, -0.5])


sizes = st.lists(st.integers(1, 500), min_size=2, max_size=8)


@settings(max_examples=40, deadline=None)
@given(sizes, st.integers(0, 10_000))
def test_fedavg_properties(n_samples, seed):
    rng = np.random.default_rng(seed)
    sites = [f"site-{i}" for i in range(len(n_samples))]
    params = {s: {"w": torch.as_tensor(rng.normal(size=(3,)), dtype=torch.float32)} for s in sites}
    updates = {s: ClientUpdate(site=s, params=params[s], n_samples=n) for s, n in zip(sites, n_samples)}
    strategy = FedAvgStrategy()
    strategy.start(sites, {"w": torch.zeros(3)})
    fields = strategy.aggregate(0, updates, exchange=None)
    weights = np.array([fields["aggregation_weight"][s] for s in sites])
    # convex combination proportional to n
    assert np.all(weights >= 0) and weights.sum() == pytest.approx(1.0)
    assert weights == pytest.approx(np.array(n_samples) / sum(n_samples))
    expected = sum(w * params[s]["w"].double() for w, s in zip(weights, sites))
    assert torch.allclose(strategy.global_params()["w"].double(), expected, atol=1e-6)
    # permutation invariance: shuffled insertion order gives the same model
    order = list(rng.permutation(sites))
    strategy2 = FedAvgStrategy()
    strategy2.start(order, {"w": torch.zeros(3)})
    strategy2.aggregate(0, {s: updates[s] for s in order}, exchange=None)
    assert torch.allclose(strategy2.global_params()["w"], strategy.global_params()["w"], atol=1e-6)
    # identical clients: the average is that client's model, whatever the weights
    same = {s: ClientUpdate(site=s, params=params[sites[0]], n_samples=n) for s, n in zip(sites, n_samples)}
    strategy.aggregate(1, same, exchange=None)
    assert torch.allclose(strategy.global_params()["w"], params[sites[0]]["w"], atol=1e-6)


def test_uniform_weighting_ignores_sizes():
    sites = ["a", "b"]
    updates = {s: ClientUpdate(site=s, params={"w": torch.tensor([float(i)])}, n_samples=n) for i, (s, n) in enumerate(zip(sites, [1, 99]))}
    strategy = FedAvgStrategy(weighting="uniform")
    strategy.start(sites, {"w": torch.zeros(1)})
    strategy.aggregate(0, updates, exchange=None)
    assert strategy.global_params()["w"].item() == pytest.approx(0.5)
    assert sample_weights({"a": 1, "b": 3}, sites) == [0.25, 0.75]


@pytest.mark.parametrize("path, args", [
    ("fedseg.strategies.fedevi:FedEviStrategy", dict(delta=0.5, weight_form="paper", beta0="uniform", clip=0.01,
                                                     use_gap=False, use_reliability=True, accumulate=False)),
    ("fedseg.strategies.pathfl:PathFLStrategy", dict(use_cse=False, use_afa=True, use_ssa=False, weighting="uniform",
                                                     afa_at_inference=False)),
    ("fedseg.strategies.fedefm:FedEFMStrategy", dict(mode="dfl", topology="full", overseas=False, gossip_self_weight=0.25,
                                                     weighting="uniform", aggregation="median", trim=0)),
    ("fedseg.strategies.fedopt:FedOptStrategy", dict(server_optimizer="sgd", server_lr=0.5, beta1=0.8,
                                                     beta2=0.95, tau=0.01, momentum=0.6, weighting="uniform")),
])
def test_a_strategy_config_is_its_name_then_each_option_as_given(path, args):
    """``report.json['config']`` of a strategy built with every option off its default: the strategy's name, then
    the options in their dataclass's order with the values given (``ServerStrategy.config``); each is an attribute."""
    import importlib

    module, name = path.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert cls.options_class.names() == tuple(args)
    strategy = cls(**args)
    config = strategy.config()
    assert list(config) == ["strategy", *args]
    assert config == {"strategy": cls.name, **args}
    assert {k: getattr(strategy, k) for k in args} == args


def test_an_unknown_strategy_option_names_the_nearest_one():
    from fedseg.strategies.fedevi import FedEviStrategy

    with pytest.raises(TypeError, match=r"FedEviStrategy got unknown options 'delt' \(did you mean 'delta'\?\)"):
        FedEviStrategy(delt=0.5)
