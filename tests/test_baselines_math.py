"""The papers' baselines against independent references: hand computations, closed forms, torch's own
optimiser, NVFlare's own aggregator, and hypothesis properties of the new aggregators. No engine, no data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_opt.pt.fedce import FedCEModelAggregator
from torch import nn

from fedseg.fl.nvflare_internals import fedce_contribution_weights
from fedseg.networks import FeatureUNet
from fedseg.networks.partition import head_state_keys, normalisation_state_keys
from fedseg.objectives.base import BatchOutput, RoundContext
from fedseg.objectives.fedce import FedCEObjective
from fedseg.objectives.feddyn import FedDynObjective
from fedseg.objectives.moon import MOONObjective, model_contrastive_loss
from fedseg.objectives.scaffold import CONTROL_DELTA, CONTROL_GLOBAL, ScaffoldObjective
from fedseg.strategies.base import ClientUpdate
from fedseg.strategies.fedce import FedCEStrategy
from fedseg.strategies.feddyn import FedDynStrategy, feddyn_server_update
from fedseg.strategies.fedopt import FedOptStrategy
from fedseg.strategies.local_layers import FedBNStrategy, FedRepStrategy
from fedseg.strategies.scaffold import ScaffoldStrategy, control_update

JOBS = Path(__file__).resolve().parents[1] / "jobs"


def _ctx(round_=0, **kw):
    return RoundContext(site="site-a", round=round_, total_rounds=10, **kw)


def _start(strategy, factory, clients=("a", "b", "c")):
    strategy.network_factory = factory
    strategy.start(list(clients), factory().state_dict())
    return strategy


# -------------------------------------------------------------------------------------------- SCAFFOLD
def _two_layer():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 1, bias=False))


def _grads_by_hand(W1, W2, X, y):
    """Gradients of 0.5 mean_n (x_n W1^T W2^T - y_n)^2 for the two-layer linear model, by hand."""
    hidden = X @ W1.T  # (n, 4)
    r = (hidden @ W2.T - y) / X.shape[0]  # (n, 1)
    return W2.T @ r.T @ X, r.T @ hidden  # dW1 (4, 3), dW2 (1, 4)


def test_scaffold_site_matches_a_hand_computation_on_a_two_layer_model():
    model = _two_layer()
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 1))
    names = [n for n, _ in model.named_parameters()]
    c = {n: torch.as_tensor(rng.normal(size=p.shape), dtype=torch.float32) for n, p in model.named_parameters()}
    c_i = {n: torch.as_tensor(rng.normal(size=p.shape), dtype=torch.float32) for n, p in model.named_parameters()}
    x0 = [p.detach().double().numpy().copy() for p in model.parameters()]
    lr, steps = 0.05, 4

    objective = ScaffoldObjective()
    ctx = _ctx(2, models={CONTROL_GLOBAL: c})
    objective.site_records(ctx).save(1, {"c_local": c_i})  # the site's control after its previous round
    objective.begin_round(ctx, model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    Xt, yt = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    for _ in range(steps):
        optimizer.zero_grad()
        (0.5 * ((model(Xt) - yt) ** 2).mean()).backward()
        optimizer.step()
        objective.after_step(model, optimizer)
    objective.end_round(ctx, model, None)
    delta = objective.outgoing_models(ctx)[CONTROL_DELTA]

    # by hand: y <- y - lr (g(y) + c - c_i); c_i+ = c_i - c + (x - y_K) / (K lr)
    W1, W2 = x0
    cc = [c[n].double().numpy() for n in names]
    ci = [c_i[n].double().numpy() for n in names]
    for _ in range(steps):
        g1, g2 = _grads_by_hand(W1, W2, X, y)
        W1, W2 = W1 - lr * (g1 + cc[0] - ci[0]), W2 - lr * (g2 + cc[1] - ci[1])
    for p, expected in zip(model.parameters(), (W1, W2)):
        assert np.allclose(p.detach().double().numpy(), expected, atol=1e-5)
    for k, (n, final) in enumerate(zip(names, (W1, W2))):
        new_ci = ci[k] - cc[k] + (x0[k] - final) / (steps * lr)
        assert np.allclose(delta[n].double().numpy(), new_ci - ci[k], atol=1e-4)
        # the new c_i is the site's state for the next round
        assert np.allclose(objective.site_records(ctx).before(3)[1]["c_local"][n].double().numpy(), new_ci, atol=1e-4)


def test_scaffold_refuses_a_task_without_the_global_control():
    with pytest.raises(ValueError, match="scaffold_c_global"):
        ScaffoldObjective().begin_round(_ctx(0), _two_layer())


def test_scaffold_server_control_update_by_hand():
    strategy = _start(ScaffoldStrategy(), _two_layer, clients=("a", "b", "c"))
    glob = strategy.global_params()
    rng = np.random.default_rng(2)
    updates, deltas = {}, {}
    for site, n in (("a", 10), ("b", 30)):  # site "c" missed the round: |S| / N = 2 / 3
        params = {k: v + torch.as_tensor(rng.normal(size=v.shape), dtype=v.dtype) for k, v in glob.items()}
        deltas[site] = {k: torch.as_tensor(rng.normal(size=v.shape), dtype=torch.float32) for k, v in strategy.control.items()}
        updates[site] = ClientUpdate(site, params, n_samples=n, models={CONTROL_DELTA: deltas[site]})
    before = {k: v.clone() for k, v in strategy.control.items()}
    fields = strategy.aggregate(0, updates, None)
    for k in before:
        expected = before[k] + (2 / 3) * (0.25 * deltas["a"][k] + 0.75 * deltas["b"][k])
        assert torch.allclose(strategy.control[k], expected, atol=1e-6)
        assert torch.allclose(strategy.global_params()[k], 0.25 * updates["a"].params[k] + 0.75 * updates["b"].params[k], atol=1e-6)
    assert fields["aggregation_weight"] == {"a": 0.25, "b": 0.75}
    # the next payload carries the new control next to the model (one object for every site)
    assert strategy.payload("a", 1).params is strategy.payload("b", 1).params
    with pytest.raises(ValueError, match="scaffold_c_delta"):
        strategy.aggregate(1, {"a": ClientUpdate("a", glob, n_samples=1)}, None)


# -------------------------------------------------------------------------------------------- FedAdam
def _bn_net():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))


def test_fedadam_equals_torch_adam_on_the_negated_average_update():
    strategy = _start(FedOptStrategy(server_optimizer="adam", server_lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3), _bn_net, ("a", "b"))
    reference = {k: v.clone().requires_grad_(True) for k, v in strategy.global_params().items() if k in dict(_bn_net().named_parameters())}
    adam = torch.optim.Adam(list(reference.values()), lr=0.05, betas=(0.9, 0.99), eps=1e-3)
    rng = np.random.default_rng(4)
    for round_ in range(3):
        glob = strategy.global_params()
        updates = {}
        for site, n in (("a", 1), ("b", 3)):
            params = {k: (v + torch.as_tensor(rng.normal(size=v.shape), dtype=v.dtype) if v.is_floating_point() else v + n)
                      for k, v in glob.items()}
            updates[site] = ClientUpdate(site, params, n_samples=n)
        average = {k: 0.25 * updates["a"].params[k] + 0.75 * updates["b"].params[k] for k in glob}
        strategy.aggregate(round_, updates, None)
        adam.zero_grad()
        for k, p in reference.items():
            p.grad = -(average[k] - glob[k])  # the negated average update as the gradient
        adam.step()
        new = strategy.global_params()
        for k, p in reference.items():
            assert torch.allclose(new[k], p.detach(), atol=1e-6), (round_, k)
        # buffers take the averaged update; the counter comes from the first site, as FedAvg's average
        for k in ("1.running_mean", "1.running_var"):
            assert torch.allclose(new[k], average[k], atol=1e-6)
        assert new["1.num_batches_tracked"] == updates["a"].params["1.num_batches_tracked"]


def test_fedadam_server_state_survives_a_server_restart():
    first = _start(FedOptStrategy(), _bn_net, ("a", "b"))
    glob = first.global_params()
    step = {s: ClientUpdate(s, {k: v + 0.1 if v.is_floating_point() else v for k, v in glob.items()}, n_samples=1) for s in "ab"}
    first.aggregate(0, step, None)
    restarted = _start(FedOptStrategy(), _bn_net, ("a", "b"))
    restarted.load_state_dict(first.state_dict())
    glob = first.global_params()
    step = {s: ClientUpdate(s, {k: v - 0.05 if v.is_floating_point() else v for k, v in glob.items()}, n_samples=1) for s in "ab"}
    first.aggregate(1, step, None)
    restarted.aggregate(1, step, None)
    assert all(torch.equal(first.global_params()[k], restarted.global_params()[k]) for k in glob)



# -------------------------------------------------------------------------------------------- FedAvgM
def _random_updates(glob, rng, scale=1.0):
    return {site: ClientUpdate(site, {k: (v + scale * torch.as_tensor(rng.normal(size=v.shape), dtype=v.dtype)
                                          if v.is_floating_point() else v) for k, v in glob.items()}, n_samples=n)
            for site, n in (("a", 1), ("b", 3))}


def test_fedavgm_is_heavy_ball_momentum_on_the_average_update_by_hand():
    # the job's server step, as exported
    server = json.loads((JOBS / "fedavgm" / "app" / "config" / "config_fed_server.json").read_text())
    (controller,) = [w["args"] for w in server["workflows"] if w["path"].endswith("FedSegController")]
    args = controller["strategy_args"]
    assert (args["server_optimizer"], args["server_lr"], args["momentum"]) == ("sgd", 1.0, 0.6)
    strategy = _start(FedOptStrategy(**args), _bn_net, ("a", "b"))
    names = dict(_bn_net().named_parameters())
    # Hsu et al.'s FedAvgM by hand: v <- beta v + Delta_t, w <- w + lr v, Delta_t = weighted average - w
    w = {k: v.clone().double() for k, v in strategy.global_params().items() if k in names}
    velocity = {k: torch.zeros_like(v) for k, v in w.items()}
    rng = np.random.default_rng(7)
    for round_ in range(4):
        glob = strategy.global_params()
        updates = _random_updates(glob, rng)
        strategy.aggregate(round_, updates, None)
        for k in w:
            delta = 0.25 * updates["a"].params[k].double() + 0.75 * updates["b"].params[k].double() - w[k]
            velocity[k] = 0.6 * velocity[k] + delta
            w[k] = w[k] + 1.0 * velocity[k]
            assert torch.allclose(strategy.global_params()[k].double(), w[k], atol=1e-5), (round_, k)
    # after the first round the momentum makes the global model leave the plain average
    assert not torch.allclose(strategy.global_params()["0.weight"],
                              0.25 * updates["a"].params["0.weight"] + 0.75 * updates["b"].params["0.weight"])


def test_fedavgm_without_momentum_is_fedavg():
    strategy = _start(FedOptStrategy(server_optimizer="sgd", server_lr=1.0, momentum=0.0), _bn_net, ("a", "b"))
    rng = np.random.default_rng(8)
    for round_ in range(3):
        updates = _random_updates(strategy.global_params(), rng)
        strategy.aggregate(round_, updates, None)
        for k, v in strategy.global_params().items():
            if v.is_floating_point():
                assert torch.allclose(v, 0.25 * updates["a"].params[k] + 0.75 * updates["b"].params[k], atol=1e-6), k


# -------------------------------------------------------------------------------------------- FedBN / FedRep
def _unet(norm):
    return lambda: FeatureUNet(channels=[4, 8, 16], norm=norm, init_seed=0)


@pytest.mark.parametrize(
    "norm, kept",
    [
        # batch norm: affine parameters and running statistics of every norm layer
        ("batch", ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")),
        # instance norm with affine: its scale and shift (no running statistics)
        ("instance_affine", ("weight", "bias")),
    ],
)
def test_fedbn_keeps_exactly_the_normalisation_entries_local(norm, kept):
    net = _unet(norm)()
    state = net.state_dict()
    # by name: every entry of a MONAI conv unit's norm "adn.N", and nothing else
    expected = sorted(k for k in state if ".adn.N." in k)
    assert sorted(normalisation_state_keys(net)) == expected
    assert {k.rsplit(".", 1)[1] for k in expected} == set(kept)
    assert len(expected) == len(kept) * 2 * 5  # two conv units per block, 2 encoders + bottleneck + 2 decoders

    strategy = _start(FedBNStrategy(), _unet(norm), ("a", "b"))
    assert not set(strategy.shared_keys()) & set(expected)
    sent = strategy.payload("a", 0).params
    assert set(sent) == set(state) - set(expected)
    rng = np.random.default_rng(5)
    updates = {s: ClientUpdate(s, {k: v + float(rng.normal()) if v.is_floating_point() else v for k, v in sent.items()}, n_samples=2)
               for s in "ab"}
    strategy.aggregate(0, updates, None)

    def keys(node):
        if isinstance(node, dict):
            return set(map(str, node)) | set().union(*(keys(v) for v in node.values()))
        return set()

    assert not keys(strategy.state_dict()) & set(expected), "the server state holds a normalisation entry"
    # FL_global_model.pt: shared entries + the network's initial norm values (no site's)
    full = strategy.global_params()
    assert set(full) == set(state)
    assert all(torch.equal(full[k], state[k]) for k in expected)


def test_fedbn_refuses_a_network_without_normalisation_entries():
    assert normalisation_state_keys(_unet("instance")()) == []  # MONAI's instance norm: not affine, no statistics
    with pytest.raises(ValueError, match="instance_affine"):
        _start(FedBNStrategy(), _unet("instance"), ("a", "b"))


def test_fedrep_head_is_the_classifier_or_the_last_block():
    net = _unet("batch")()
    assert head_state_keys(net) == ["head.weight", "head.bias"]
    last = head_state_keys(net, "last_block")
    assert last[-2:] == ["head.weight", "head.bias"] and all(k.startswith("decoders.1.") for k in last[:-2])
    strategy = _start(FedRepStrategy(head="last_block"), _unet("instance"), ("a", "b"))
    assert not set(strategy.shared_keys()) & set(last) and strategy.config()["head"] == "last_block"
    with pytest.raises(ValueError, match="head"):
        FedRepStrategy(head="decoder")


# -------------------------------------------------------------------------------------------- MOON
def test_moon_loss_is_a_hand_written_infonce():
    z = torch.tensor([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0]])
    z_glob = torch.tensor([[0.8, 0.1, 1.5], [0.0, -1.0, 1.0]])
    z_prev = torch.tensor([[-1.0, 0.0, 0.5], [0.5, -0.9, 0.1]])
    tau = 0.5

    def cos(a, b):
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    terms = []
    for a, g, p in zip(z.numpy(), z_glob.numpy(), z_prev.numpy()):
        pos, neg = math.exp(cos(a, g) / tau), math.exp(cos(a, p) / tau)
        terms.append(-math.log(pos / (pos + neg)))
    assert float(model_contrastive_loss(z, z_glob, z_prev, tau)) == pytest.approx(np.mean(terms), rel=1e-6)


def test_moon_objective_adds_mu_times_the_contrastive_term_of_the_pooled_bottlenecks():
    torch.manual_seed(0)
    model = FeatureUNet(in_channels=1, channels=[4, 8], init_seed=0)
    objective = MOONObjective(mu=2.0, temperature=0.5, seg_loss=lambda logits, labels: torch.tensor(0.25))
    ctx = _ctx(1)
    objective.begin_round(ctx, model)  # no previous model yet: the global one stands in
    x = torch.rand(2, 1, 8, 8)
    logits, feats = model.forward_features(x)
    out = BatchOutput(x, torch.zeros(2, 1, 8, 8), logits, feats)
    assert float(objective.loss(out).detach()) == pytest.approx(0.25 + 2.0 * math.log(2), rel=1e-5)

    previous = FeatureUNet(in_channels=1, channels=[4, 8], init_seed=7)
    objective.site_records(ctx).save(1, {"model": previous.state_dict()})
    objective.begin_round(_ctx(2), model)
    with torch.no_grad():
        model.bottleneck[0].conv.weight.mul_(1.5)  # the trained model moves away from the global one
    logits, feats = model.forward_features(x)
    pooled = lambda m: m.forward_features(x)[1]["bottleneck"].mean(dim=(2, 3))  # noqa: E731
    with torch.no_grad():
        z, z_glob, z_prev = pooled(model), pooled(objective._global), pooled(previous.eval())
    terms = []
    for a, g, p in zip(z.numpy(), z_glob.numpy(), z_prev.numpy()):
        s_g = np.dot(a, g) / (np.linalg.norm(a) * np.linalg.norm(g)) / 0.5
        s_p = np.dot(a, p) / (np.linalg.norm(a) * np.linalg.norm(p)) / 0.5
        terms.append(-(s_g - np.logaddexp(s_g, s_p)))
    loss = objective.loss(BatchOutput(x, torch.zeros(2, 1, 8, 8), logits, feats))
    assert float(loss.detach()) == pytest.approx(0.25 + 2.0 * float(np.mean(terms)), rel=1e-4)
    with pytest.raises(ValueError, match="representation"):
        MOONObjective(representation="nowhere").begin_round(_ctx(0), model)


# -------------------------------------------------------------------------------------------- FedDyn
class _Vector(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.theta = nn.Parameter(torch.zeros(d, dtype=torch.float64))


def test_feddyn_matches_its_closed_form_on_quadratics_and_reaches_the_global_optimum():
    """Sites with L_k(w) = c_k / 2 ||w - a_k||^2 (different curvatures). With exact local minimisation FedDyn's
    local solution, state and server update have closed forms; its fixed point is the global optimum
    sum c_k a_k / sum c_k, where FedAvg's is the plain mean of the a_k."""
    rng = np.random.default_rng(6)
    d, alpha = 3, 0.5
    a = rng.normal(size=(3, d))
    c = np.array([1.0, 3.0, 0.5])
    sites = ["s0", "s1", "s2"]
    strategy = _start(FedDynStrategy(alpha=alpha), lambda: _Vector(d), sites)
    objectives = {s: FedDynObjective(alpha=alpha) for s in sites}
    theta, h, g = np.zeros(d), np.zeros(d), np.zeros((3, d))
    for round_ in range(60):
        glob = strategy.global_params()
        assert strategy.payload("s0", round_).meta["feddyn"]["alpha"] == alpha
        updates = {}
        for k, s in enumerate(sites):
            model = _Vector(d)
            model.load_state_dict(glob)
            ctx = RoundContext(site=s, round=round_, total_rounds=60, server_meta={"feddyn": {"alpha": alpha}})
            objectives[s].begin_round(ctx, model)
            # the local objective is a quadratic of curvature c_k + alpha: one gradient step of 1 / (c_k + alpha)
            # lands on its minimiser
            local = 0.5 * c[k] * ((model.theta - torch.as_tensor(a[k])) ** 2).sum() + objectives[s].parameter_loss(None)
            local.backward()
            with torch.no_grad():
                model.theta -= model.theta.grad / (c[k] + alpha)
            objectives[s].end_round(ctx, model, None)
            updates[s] = ClientUpdate(s, {"theta": model.theta.detach().clone()}, n_samples=1)
        strategy.aggregate(round_, updates, None)
        # closed form (Algorithm 1)
        local = (c[:, None] * a + g + alpha * theta) / (c[:, None] + alpha)
        g = g - alpha * (local - theta)
        assert np.allclose(g, c[:, None] * (local - a))  # the state is the gradient of L_k at the local model
        for k, s in enumerate(sites):
            kept = objectives[s].site_records(RoundContext(site=s, round=round_, total_rounds=60)).before(round_ + 1)
            assert np.allclose(kept[1]["grad"]["theta"].numpy(), g[k])
        h = h - alpha / 3 * (local - theta).sum(axis=0)
        theta = local.mean(axis=0) - h / alpha
        assert np.allclose(strategy.global_params()["theta"].numpy(), theta, atol=1e-10)
        assert np.allclose(strategy.h["theta"].numpy(), h, atol=1e-10)
    optimum = (c[:, None] * a).sum(axis=0) / c.sum()
    assert np.allclose(theta, optimum, atol=1e-8)
    assert np.abs(a.mean(axis=0) - optimum).max() > 0.1  # FedAvg's fixed point is elsewhere


def test_feddyn_alpha_must_agree_between_server_and_site():
    with pytest.raises(ValueError, match="differs"):
        FedDynObjective(alpha=0.01).begin_round(_ctx(0, server_meta={"feddyn": {"alpha": 0.1}}), _Vector(2))


# -------------------------------------------------------------------------------------------- FedCE
def _small():
    torch.manual_seed(8)
    return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))


def test_fedce_wrapper_equals_nvflares_aggregator_on_the_same_inputs():
    sites = ["a", "b", "c"]
    strategy = _start(FedCEStrategy(mode="plus"), _small, sites)
    names = [n for n, _ in _small().named_parameters()]
    reference = FedCEModelAggregator(mode="plus", trainable_param_names=names)
    glob_ref = {k: v.clone().numpy() for k, v in strategy.global_params().items()}
    rng = np.random.default_rng(9)
    for round_ in range(3):
        glob = strategy.global_params()
        updates, fl_models = {}, []
        prior = fedce_contribution_weights(reference)
        for s in sites:
            params = {k: v + torch.as_tensor(rng.normal(scale=0.1, size=v.shape), dtype=v.dtype) for k, v in glob.items()}
            score = float(rng.uniform(0.1, 0.9))
            updates[s] = ClientUpdate(s, params, n_samples=4, meta={"fedce_minus_val": score})
            fl_models.append(FLModel(params={k: params[k].numpy() - glob_ref[k] for k in glob_ref}, params_type=ParamsType.DIFF,
                                     meta={"client_name": s, "fedce_minus_val": score, "props": {"fedce_coef": prior}}))
        assert strategy.payload("a", round_).meta["fedce_coef"] == prior
        fields = strategy.aggregate(round_, updates, None)
        reference.reset_stats()
        for m in fl_models:
            reference.accept_model(m)
        result = reference.aggregate_model()
        glob_ref = {k: glob_ref[k] + result.params[k] for k in glob_ref}
        for k in glob_ref:
            assert np.allclose(strategy.global_params()[k].numpy(), glob_ref[k], atol=1e-6)
        assert fields["aggregation_weight"] == pytest.approx(result.meta["fedce_coef"])
    # the server's state survives a restart
    restarted = _start(FedCEStrategy(mode="plus"), _small, sites)
    restarted.load_state_dict(strategy.state_dict())
    assert restarted.contribution_weights == strategy.contribution_weights


def test_fedce_site_minus_model_by_hand():
    model = _small()
    previous = {k: v + 1.0 for k, v in model.state_dict().items()}
    objective = FedCEObjective()
    ctx = _ctx(3, server_meta={"fedce_coef": {"site-a": 0.2, "site-b": 0.8}})
    objective.site_records(ctx).save(2, {"model": previous})
    minus = objective.minus_model(ctx, model)
    for k, v in model.state_dict().items():
        assert torch.allclose(minus.state_dict()[k], (v - 0.2 * previous[k]) / 0.8, atol=1e-6)
    # round 0: no previous model and no weights: the minus model is the global model
    first = objective.minus_model(_ctx(0), model)
    assert all(torch.equal(first.state_dict()[k], v) for k, v in model.state_dict().items())


# -------------------------------------------------------------------------------------------- properties
site_counts = st.integers(2, 5)


def _random_models(rng, glob, k):
    return [{n: v + torch.as_tensor(rng.normal(scale=0.1, size=v.shape), dtype=v.dtype) for n, v in glob.items()} for _ in range(k)]


@settings(max_examples=25, deadline=None)
@given(site_counts, st.integers(0, 10_000))
def test_fedce_properties(k, seed):
    rng = np.random.default_rng(seed)
    sites = [f"s{i}" for i in range(k)]
    strategy = _start(FedCEStrategy(), _small, sites)
    glob = strategy.global_params()
    models = _random_models(rng, glob, k)
    scores = rng.uniform(0, 1, size=k).tolist()
    fields = strategy.aggregate(0, {s: ClientUpdate(s, m, n_samples=3, meta={"fedce_minus_val": v})
                                    for s, m, v in zip(sites, models, scores)}, None)
    w = np.array([fields["aggregation_weight"][s] for s in sites])
    assert np.all(w >= 0) and w.sum() == pytest.approx(1.0)  # a convex combination ...
    for n in glob:  # ... of the sites' models
        assert torch.allclose(strategy.global_params()[n], sum(float(wi) * m[n] for wi, m in zip(w, models)), atol=1e-5)
    # permutation invariance: relabel the sites; each model keeps its weight
    perm = rng.permutation(k)
    again = _start(FedCEStrategy(), _small, sites)
    fields2 = again.aggregate(0, {sites[perm[i]]: ClientUpdate(sites[perm[i]], models[i], n_samples=3, meta={"fedce_minus_val": scores[i]})
                                  for i in range(k)}, None)
    assert [fields2["aggregation_weight"][sites[perm[i]]] for i in range(k)] == pytest.approx(w.tolist(), abs=1e-6)  # float32 cosines
    assert all(torch.allclose(again.global_params()[n], strategy.global_params()[n], atol=1e-6) for n in glob)
    # identical clients: plain averaging (equal weights, the common model)
    same = _start(FedCEStrategy(), _small, sites)
    fields3 = same.aggregate(0, {s: ClientUpdate(s, models[0], n_samples=3, meta={"fedce_minus_val": 0.5}) for s in sites}, None)
    assert list(fields3["aggregation_weight"].values()) == pytest.approx([1 / k] * k)
    assert all(torch.allclose(same.global_params()[n], models[0][n], atol=1e-6) for n in glob)


@settings(max_examples=25, deadline=None)
@given(site_counts, st.integers(1, 3), st.integers(0, 10_000))
def test_scaffold_and_feddyn_aggregation_properties(k, missing, seed):
    rng = np.random.default_rng(seed)
    glob = {n: v.detach().clone() for n, v in _small().state_dict().items()}
    models = _random_models(rng, glob, k)
    sites = [f"s{i}" for i in range(k)]
    n_sites = k + missing
    # SCAFFOLD's control: weights convex, order of the sites irrelevant, identical deltas move c by (|S|/N) delta
    deltas = {s: {n: torch.as_tensor(rng.normal(size=v.shape), dtype=v.dtype) for n, v in glob.items()} for s in sites}
    raw = rng.uniform(0.1, 1, size=k)
    weights = dict(zip(sites, (raw / raw.sum()).tolist()))
    out = control_update(glob, deltas, weights, n_sites)
    shuffled = control_update(glob, dict(reversed(list(deltas.items()))), weights, n_sites)
    assert all(torch.allclose(out[n], shuffled[n], atol=1e-6) for n in glob)
    same = control_update(glob, {s: deltas[sites[0]] for s in sites}, weights, n_sites)
    assert all(torch.allclose(same[n], glob[n] + k / n_sites * deltas[sites[0]][n], atol=1e-5) for n in glob)
    # FedDyn's server update: order irrelevant; identical clients w give theta = w - h'/alpha, h' = h - alpha k/N (w - theta)
    h = {n: torch.as_tensor(rng.normal(size=v.shape), dtype=v.dtype) for n, v in glob.items()}
    th1, h1 = feddyn_server_update(glob, dict(zip(sites, models)), h, 0.1, n_sites)
    th3, h3 = feddyn_server_update(glob, {s: models[0] for s in sites}, h, 0.1, n_sites)
    for n in glob:
        expected_h = h[n] - 0.1 * k / n_sites * (models[0][n] - glob[n])
        assert torch.allclose(h3[n], expected_h, atol=1e-5)
        assert torch.allclose(th3[n], models[0][n] - expected_h / 0.1, atol=1e-4)
    relabelled = {sites[(i + 1) % k]: models[i] for i in range(k)}
    th4, h4 = feddyn_server_update(glob, relabelled, h, 0.1, n_sites)
    assert all(torch.allclose(th1[n], th4[n], atol=1e-5) and torch.allclose(h1[n], h4[n], atol=1e-5) for n in glob)


# -------------------------------------------------------------------------------------------- server restart
@pytest.mark.parametrize(
    "make, factory, extra",
    [
        (lambda: ScaffoldStrategy(), _two_layer, "scaffold"),
        (lambda: FedOptStrategy(), _bn_net, None),
        (lambda: FedDynStrategy(alpha=0.1), _small, None),
        (lambda: FedCEStrategy(), _small, "fedce"),
        (lambda: FedBNStrategy(), _unet("batch"), None),
    ],
    ids=["scaffold", "fedadam", "feddyn", "fedce", "fedbn"],
)
def test_strategy_state_survives_the_server_checkpoint(tmp_path, make, factory, extra):
    """What a restarted server loads (``torch.load(weights_only=True)`` of ``state_dict``) continues the run
    exactly: the next round's model equals the uninterrupted server's."""
    rng = np.random.default_rng(10)

    def updates(strategy):
        out = {}
        for s, n in (("a", 2), ("b", 5)):
            sent = strategy.payload(s, 0).params
            main = {k: v for k, v in sent.items() if not k.startswith("__model__/")}
            params = {k: v + float(rng.normal(scale=0.1)) if v.is_floating_point() else v for k, v in main.items()}
            meta = {"fedce_minus_val": float(rng.uniform())} if extra == "fedce" else {}
            models = {CONTROL_DELTA: {k: torch.full_like(v, float(rng.normal())) for k, v in strategy.control.items()}} if extra == "scaffold" else {}
            out[s] = ClientUpdate(s, params, n_samples=n, meta=meta, models=models)
        return out

    first = _start(make(), factory, ("a", "b"))
    first.aggregate(0, updates(first), None)
    torch.save(first.state_dict(), tmp_path / "state.pt")
    restarted = _start(make(), factory, ("a", "b"))
    restarted.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    step = updates(first)
    first.aggregate(1, step, None)
    restarted.aggregate(1, step, None)
    a, b = first.global_params(), restarted.global_params()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
