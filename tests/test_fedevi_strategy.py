"""FedEvi server strategy (fake rounds, fake exchange) and client objective (tiny U-Net, stand-in engine)."""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
from scipy.special import digamma as sp_digamma

from fedseg.networks.unet import FeatureUNet
from fedseg.objectives.base import BatchOutput, RoundContext
from fedseg.objectives.evidential_losses import kl_annealing_weight
from fedseg.objectives.fedevi import FedEviObjective
from fedseg.strategies.base import ClientUpdate, SitePayload
from fedseg.strategies.fedevi import FedEviStrategy

# ------------------------------------------------------------------------------------------------
# strategy

SITES = ["a", "b", "c"]
N_SAMPLES = {"a": 60, "b": 30, "c": 10}
LEVEL = {"a": 1.0, "b": 2.0, "c": 4.0}  # theta_k is filled with LEVEL[k], so averages are easy to read


def _params(level: float) -> Dict[str, torch.Tensor]:
    return {
        "conv.weight": torch.full((2, 3), level),
        "conv.bias": torch.full((2,), level),
        "norm.num_batches_tracked": torch.tensor(7, dtype=torch.long),
    }


def _updates(sites=SITES) -> Dict[str, ClientUpdate]:
    return {s: ClientUpdate(site=s, params=_params(LEVEL[s]), n_samples=N_SAMPLES[s]) for s in sites}


class FakeExchange:
    """Answers the surrogate task with fixed statistics; records what it was sent."""

    def __init__(self, stats: Dict[str, Dict[str, float]], answer=None):
        self.stats = stats
        self.answer = answer  # sites that reply; None = all that were asked
        self.calls: List[Tuple[str, Dict[str, SitePayload]]] = []

    def __call__(self, task_name: str, payloads: Dict[str, SitePayload]) -> Dict[str, ClientUpdate]:
        self.calls.append((task_name, payloads))
        sites = [s for s in payloads if self.answer is None or s in self.answer]
        return {s: ClientUpdate(site=s, params={}, meta=dict(self.stats[s])) for s in sites}


STATS = {
    "a": {"G": 0.05, "A": 0.5, "R_paper": 2.5},
    "b": {"G": 0.20, "A": 0.4, "R_paper": 3.0},
    "c": {"G": 0.10, "A": 0.1, "R_paper": 12.0},
}


def _started(**options) -> FedEviStrategy:
    strategy = FedEviStrategy(**options)
    strategy.start(SITES, _params(0.0))
    return strategy


def test_one_round_code_form_by_hand():
    strategy = _started()
    exchange = FakeExchange(STATS)
    report = strategy.aggregate(0, _updates(), exchange)

    # beta0 = (0.6, 0.3, 0.1): surrogate level = 0.6*1 + 0.3*2 + 0.1*4 = 1.6
    task, payloads = exchange.calls[0]
    assert task == "evaluate_surrogate"
    assert sorted(payloads) == SITES
    for p in payloads.values():
        torch.testing.assert_close(p.params["conv.weight"], torch.full((2, 3), 1.6))
    # G / A = (0.1, 0.5, 1.0); beta0 + G/A = (0.7, 0.8, 1.1), sum 2.6
    expected = {"a": 0.7 / 2.6, "b": 0.8 / 2.6, "c": 1.1 / 2.6}
    assert report["beta"] == pytest.approx(expected)
    assert report["G"] == pytest.approx({s: STATS[s]["G"] for s in SITES})
    assert report["A"] == pytest.approx({s: STATS[s]["A"] for s in SITES})
    assert report["R"] == pytest.approx({"a": 2.0, "b": 2.5, "c": 10.0})
    assert report["dropped"] == []
    # theta = sum beta theta = (0.7*1 + 0.8*2 + 1.1*4) / 2.6; the integer counter is copied, not averaged
    level = (0.7 + 1.6 + 4.4) / 2.6
    torch.testing.assert_close(strategy.global_params()["conv.bias"], torch.full((2,), level))
    assert strategy.global_params()["norm.num_batches_tracked"].item() == 7


def test_second_round_starts_from_previous_beta():
    strategy = _started()
    first = strategy.aggregate(0, _updates(), FakeExchange(STATS))["beta"]
    stats2 = {s: {"G": 0.1, "A": 0.2 * (i + 1), "R_paper": 1.0} for i, s in enumerate(SITES)}
    exchange = FakeExchange(stats2)
    report = strategy.aggregate(1, _updates(), exchange)
    # surrogate of round 1 uses round 0's beta
    surrogate_level = sum(first[s] * LEVEL[s] for s in SITES)
    torch.testing.assert_close(exchange.calls[0][1]["a"].params["conv.bias"], torch.full((2,), surrogate_level))
    raw = np.array([first[s] + 0.1 / (0.2 * (i + 1)) for i, s in enumerate(SITES)])
    assert [report["beta"][s] for s in SITES] == pytest.approx(list(raw / raw.sum()))


def test_paper_form_and_uniform_start():
    strategy = _started(weight_form="paper", beta0="uniform", delta=0.5)
    report = strategy.aggregate(0, _updates(), FakeExchange(STATS))
    gr = np.array([STATS[s]["G"] * STATS[s]["R_paper"] for s in SITES])  # (0.125, 0.6, 1.2)
    raw = 1.0 / 3.0 + 0.5 * gr
    assert [report["beta"][s] for s in SITES] == pytest.approx(list(raw / raw.sum()))
    assert report["R"] == pytest.approx({s: STATS[s]["R_paper"] for s in SITES})
    assert strategy.config() == {
        "strategy": "fedevi", "delta": 0.5, "weight_form": "paper", "beta0": "uniform", "clip": 1e-3,
        "use_gap": True, "use_reliability": True, "accumulate": True,
    }


def test_a_strategy_that_does_not_accumulate_weights_each_round_by_its_own_evidence():
    """``accumulate=False``: beta^r = normalise(delta * G * R) whatever beta^{r-1} was (the repository's other main
    loop), by hand from the stand-in sites' statistics."""
    strategy = _started(accumulate=False)
    report = strategy.aggregate(0, _updates(), FakeExchange(STATS))
    gr = np.array([STATS[s]["G"] / STATS[s]["A"] for s in SITES])
    assert [report["beta"][s] for s in SITES] == pytest.approx(list(gr / gr.sum()))
    assert strategy.config()["accumulate"] is False


def test_surrogate_payload_carries_only_params_and_small_meta():
    strategy = _started()
    exchange = FakeExchange(STATS)
    strategy.aggregate(4, _updates(), exchange)
    _, payloads = exchange.calls[0]
    first = payloads["a"].params
    for site, p in payloads.items():
        assert isinstance(p, SitePayload)
        assert set(vars(p)) == {"params", "meta"}
        assert set(p.params) == set(_params(0.0))
        for key in first:  # one surrogate, the same for everyone
            assert torch.equal(p.params[key], first[key])
        assert p.meta == {"fedevi": {"round": 4}}


def test_dropped_site_keeps_its_weight_and_is_left_out():
    strategy = _started()
    strategy.aggregate(0, _updates(), FakeExchange(STATS))
    stored = dict(strategy.beta)

    stats2 = {s: {"G": 0.3, "A": 0.3, "R_paper": 1.0} for s in SITES}  # G/A = 1 for everyone
    report = strategy.aggregate(1, _updates(), FakeExchange(stats2, answer={"a", "b"}))
    assert report["dropped"] == ["c"]
    assert set(report["beta"]) == {"a", "b"}
    # a and b: previous weights renormalised over them, plus 1, renormalised
    pa, pb = stored["a"] / (stored["a"] + stored["b"]), stored["b"] / (stored["a"] + stored["b"])
    ba, bb = (pa + 1.0) / (pa + pb + 2.0), (pb + 1.0) / (pa + pb + 2.0)
    assert report["beta"] == pytest.approx({"a": ba, "b": bb})
    # c's local model is not in theta; c's stored weight is unchanged; stored weights still sum to 1
    torch.testing.assert_close(strategy.global_params()["conv.bias"], torch.full((2,), ba * 1.0 + bb * 2.0))
    assert strategy.beta["c"] == pytest.approx(stored["c"])
    assert sum(strategy.beta.values()) == pytest.approx(1.0)

    # next round c is back and its surrogate weight is its kept one
    exchange = FakeExchange(STATS)
    strategy.aggregate(2, _updates(), exchange)
    level = exchange.calls[0][1]["c"].params["conv.bias"][0].item()
    # a and b hold the mass they had before round 1, split as (ba, bb); c holds its kept weight
    mass_ab = 1.0 - stored["c"]
    assert level == pytest.approx(mass_ab * (ba * 1.0 + bb * 2.0) + stored["c"] * 4.0, rel=1e-6)


def test_site_with_unusable_statistics_is_dropped():
    strategy = _started()
    bad = {**STATS, "b": {"G": float("nan"), "A": 0.4, "R_paper": 3.0}, "c": {"G": 0.1, "A": 0.0, "R_paper": 1.0}}
    report = strategy.aggregate(0, _updates(), FakeExchange(bad))
    assert report["dropped"] == ["b", "c"]
    assert report["beta"] == pytest.approx({"a": 1.0})


def test_no_answers_keeps_the_surrogate():
    strategy = _started()
    report = strategy.aggregate(0, _updates(), FakeExchange(STATS, answer=set()))
    assert report["dropped"] == SITES
    torch.testing.assert_close(strategy.global_params()["conv.bias"], torch.full((2,), 1.6))
    assert strategy.beta == pytest.approx({"a": 0.6, "b": 0.3, "c": 0.1})


def test_reference_log_round_one_through_the_strategy():
    # FedEvi reference log (polyp): n = 700/138/267/429, beta0 -> beta1 as printed. The implied
    # G/A = beta1 (1 + D) - beta0 for any D > 0.199 (see test_fedevi_math); D = 0.43 here.
    n = {"s0": 700, "s1": 138, "s2": 267, "s3": 429}
    beta1 = np.array([0.38058908, 0.13825581, 0.19505428, 0.28610083])
    beta0 = np.array(list(n.values())) / sum(n.values())
    ratio = beta1 * 1.43 - beta0
    stats = {s: {"G": 0.05 * r, "A": 0.05, "R_paper": 1.0} for s, r in zip(n, ratio)}  # G/A = ratio
    strategy = FedEviStrategy()
    strategy.start(list(n), _params(0.0))
    updates = {s: ClientUpdate(site=s, params=_params(1.0), n_samples=k) for s, k in n.items()}
    report = strategy.aggregate(0, updates, FakeExchange(stats))
    assert [report["beta"][s] for s in n] == pytest.approx([0.381, 0.138, 0.195, 0.286], abs=5e-4)


def test_invalid_options():
    with pytest.raises(ValueError):
        FedEviStrategy(weight_form="mean")
    with pytest.raises(ValueError):
        FedEviStrategy(beta0="size")
    with pytest.raises(ValueError):
        FedEviStrategy(clip=1.5)


# ------------------------------------------------------------------------------------------------
# objective


class StandInEngine:
    """Implements only ``iterate_logits``: two fixed random validation batches."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.batches = [
            (torch.randn(2, 3, 8, 8, generator=g), (torch.rand(2, 1, 8, 8, generator=g) > 0.7).float()),
            (torch.randn(1, 3, 8, 8, generator=g), (torch.rand(1, 1, 8, 8, generator=g) > 0.7).float()),
        ]
        self.splits: List[str] = []
        self.device = torch.device("cpu")
        self.spatial_mode = "resize"  # whole images: no window sample (tests/test_window_sample.py covers patch mode)
        self.window_sample_available = False

    def iterate_logits(self, model, split, with_features=False, network_grid=False):
        self.splits.append(split)
        model.eval()
        with torch.no_grad():
            for x, y in self.batches:
                yield x, y, model(x), {}


def _net(seed: int) -> FeatureUNet:
    torch.manual_seed(seed)
    return FeatureUNet(channels=(4, 8))


def _per_image_uncertainties(model, engine) -> Tuple[np.ndarray, np.ndarray]:
    """(epistemic, aleatoric) pixel-mean per image, via numpy/scipy from the model's logits."""
    epi, ale = [], []
    model.eval()
    with torch.no_grad():
        for x, _ in engine.batches:
            alpha = np.exp(np.minimum(model(x).double().numpy(), 80.0)) + 1.0  # (B, C, H, W)
            s = alpha.sum(axis=1)
            rho = alpha / s[:, None]
            u_ale = sp_digamma(s + 1.0) - (rho * sp_digamma(alpha + 1.0)).sum(axis=1)
            u_tot = -(rho * np.log(rho)).sum(axis=1)
            epi.extend((u_tot - u_ale).reshape(len(x), -1).mean(axis=1))
            ale.extend(u_ale.reshape(len(x), -1).mean(axis=1))
    return np.array(epi), np.array(ale)


def _train_one_step(objective: FedEviObjective, ctx: RoundContext, model, engine) -> None:
    objective.begin_round(ctx, model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = engine.batches[0]
    loss = objective.loss(BatchOutput(inputs=x, labels=y, logits=model(x), features={}))
    loss.backward()
    opt.step()


def test_site_statistics_split_between_the_two_tasks(tmp_path):
    """A and R_paper of the freshly trained local model leave with the weights (end_round); G of the received
    surrogate with the surrogate task; each against a numpy/scipy re-computation."""
    engine = StandInEngine()
    ctx = RoundContext(site="a", round=3, total_rounds=10, state_dir=str(tmp_path))
    objective = FedEviObjective()
    local = _net(0)
    _train_one_step(objective, ctx, local, engine)
    local_before = {k: v.clone() for k, v in local.state_dict().items()}
    with_update = objective.end_round(ctx, local, engine)
    assert set(with_update) == {"A", "R_paper"}
    _, ale_loc = _per_image_uncertainties(local, engine)
    assert with_update["A"] == pytest.approx(ale_loc.mean(), rel=1e-4)
    assert with_update["R_paper"] == pytest.approx((1.0 / ale_loc).mean(), rel=1e-4)
    assert all(torch.equal(v, local_before[k]) for k, v in local.state_dict().items())
    assert not list(tmp_path.iterdir())  # nothing is kept for the second task

    surrogate = _net(1)  # the engine loads the received surrogate weights into its model
    surrogate_before = {k: v.clone() for k, v in surrogate.state_dict().items()}
    ctx2 = RoundContext(site="a", round=3, total_rounds=10, state_dir=str(tmp_path),
                        server_meta={"fedevi": {"round": 3}})
    out = objective.handle_task("evaluate_surrogate", ctx2, surrogate, engine)
    # privacy: exactly one finite, non-negative Python float
    assert set(out) == {"G"} and type(out["G"]) is float and math.isfinite(out["G"]) and out["G"] >= 0
    assert set(engine.splits) == {"validation"}
    epi_sur, _ = _per_image_uncertainties(surrogate, engine)
    assert out["G"] == pytest.approx(epi_sur.mean(), rel=1e-4)
    for k, v in surrogate.state_dict().items():  # the received model is left as it was
        assert torch.equal(v, surrogate_before[k])
    # the three together equal the surrogate and local model scored side by side (surrogate_statistics)
    together = objective.surrogate_statistics(engine, surrogate, local, 3)
    assert together == pytest.approx({**with_update, **out})
    # a restarted site process answers the surrogate task: it needs nothing from the train task
    assert FedEviObjective().handle_task("evaluate_surrogate", ctx2, surrogate, engine) == pytest.approx(out)
    with pytest.raises(ValueError):
        objective.handle_task("some_other_task", ctx, _net(1), engine)


def test_strategy_reads_a_and_r_from_the_updates_and_g_from_the_replies():
    """The sites' split: A and R_paper with the train update, G with the surrogate reply; the same weights as
    replies carrying all three."""
    updates = _updates()
    for s in SITES:
        updates[s].meta = {"A": STATS[s]["A"], "R_paper": STATS[s]["R_paper"]}
    split = _started().aggregate(0, updates, FakeExchange({s: {"G": STATS[s]["G"]} for s in SITES}))
    together = _started().aggregate(0, _updates(), FakeExchange(STATS))
    assert split["beta"] == pytest.approx(together["beta"]) and split["A"] == pytest.approx(together["A"])
    # a reply without G leaves the site out, whatever its update carried
    dropped = _started().aggregate(0, updates, FakeExchange({s: ({} if s == "b" else {"G": 0.1}) for s in SITES}))
    assert dropped["dropped"] == ["b"]


def test_objective_loss_uses_round_plus_one():
    engine = StandInEngine()
    x, y = engine.batches[0]
    model = _net(0)
    logits = model(x)
    objective = FedEviObjective()
    with pytest.raises(RuntimeError):
        objective.loss(BatchOutput(inputs=x, labels=y, logits=logits, features={}))
    losses = {}
    for r in (0, 4):
        objective.begin_round(RoundContext(site="a", round=r, total_rounds=10), model)
        losses[r] = objective.loss(BatchOutput(inputs=x, labels=y, logits=logits, features={})).item()
    terms = objective.evidential_loss.terms(logits, y, 1)
    # round index 0 is FedEvi round 1 (weight lam/10), index 4 is round 5 (lam/2)
    assert kl_annealing_weight(1) == pytest.approx(0.001)
    assert losses[4] - losses[0] == pytest.approx((0.005 - 0.001) * terms["kl"].item(), rel=1e-4)
    assert losses[0] == pytest.approx(terms["dice"].item() + 0.001 * terms["kl"].item(), rel=1e-6)


def test_ablation_switches_replace_factors_by_one():
    """Without G (or R) the update uses 1 for that factor; delta = 0 keeps beta^0 (EMT only)."""
    import torch

    from fedseg.strategies.base import ClientUpdate
    from fedseg.strategies.fedevi import FedEviStrategy

    sites = ["a", "b"]
    stats = {"a": {"G": 0.2, "A": 0.5, "R_paper": 3.0}, "b": {"G": 0.6, "A": 0.25, "R_paper": 5.0}}

    def exchange(task, payloads):
        return {s: ClientUpdate(site=s, params={}, meta=stats[s]) for s in payloads}

    def run(**kw):
        strategy = FedEviStrategy(**kw)
        strategy.start(sites, {"w": torch.zeros(1)})
        updates = {s: ClientUpdate(site=s, params={"w": torch.tensor([float(i)])}, n_samples=n) for i, (s, n) in enumerate(zip(sites, [1, 3]))}
        return strategy.aggregate(0, updates, exchange)["beta"]

    prior = [0.25, 0.75]
    def normalise(x):
        return [v / sum(x) for v in x]
    assert list(run(use_gap=False).values()) == pytest.approx(normalise([prior[0] + 1 / 0.5, prior[1] + 1 / 0.25]))
    assert list(run(use_reliability=False).values()) == pytest.approx(normalise([prior[0] + 0.2, prior[1] + 0.6]))
    assert list(run(delta=0.0).values()) == pytest.approx(prior)
