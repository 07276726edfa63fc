"""GraphFedSegStrategy rounds (fake clients) and GraphFedSegObjective (tiny U-Net, fake engine)."""

from __future__ import annotations

import math
from typing import Dict, List

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from monai.losses import DiceCELoss

from fedseg.networks.unet import FeatureUNet
from fedseg.objectives import BatchOutput, RoundContext, build_objective
from fedseg.strategies import ClientUpdate, build_strategy
from fedseg.strategies.aggregation import weighted_average
from fedseg.strategies.collaboration_graph import graph_rows_closed_form

SITES = ["site-a", "site-b", "site-c"]
TRAINABLE = ["conv.weight", "conv.bias", "head.weight"]


def _no_exchange(task, payloads):  # GraphFedSeg runs no second task
    raise AssertionError("GraphFedSeg must not call exchange")


def _model(gen: torch.Generator, scale: float = 1.0) -> Dict[str, torch.Tensor]:
    return {
        "conv.weight": scale * torch.randn(4, 3, 3, 3, generator=gen),
        "conv.bias": scale * torch.randn(4, generator=gen),
        "bn.running_mean": torch.randn(4, generator=gen),  # a buffer: not part of the similarity
        "bn.num_batches_tracked": torch.tensor(5),
        "head.weight": scale * torch.randn(2, 4, 1, 1, generator=gen),
    }


def _flat(params, keys=TRAINABLE) -> torch.Tensor:
    return torch.cat([params[k].reshape(-1).double() for k in keys])


def _updates(models, n_samples, uncertainty, sites=SITES) -> Dict[str, ClientUpdate]:
    return {
        s: ClientUpdate(site=s, params=m, n_samples=n, meta={"uncertainty": u})
        for s, m, n, u in zip(sites, models, n_samples, uncertainty)
    }


@pytest.fixture()
def round_one():
    gen = torch.Generator().manual_seed(0)
    initial = _model(gen)
    strategy = build_strategy("graphfedseg")
    strategy.start(list(reversed(SITES)), initial)  # order given by the controller must not matter
    # local models: the initial one plus site-specific updates, two of them similar
    shared = _model(gen, 0.05)
    models = []
    for s in range(3):
        own = _model(gen, 0.05)
        models.append({k: initial[k] + (shared[k] if s < 2 else 0) + own[k] if k in TRAINABLE else own[k] for k in initial})
    n_samples, uncertainty = [20, 30, 50], [0.3, 0.1, 0.6]
    report = strategy.aggregate(0, _updates(models, n_samples, uncertainty), _no_exchange)
    return strategy, initial, models, n_samples, uncertainty, report


def test_config_reports_the_alpha_used():
    strategy = build_strategy("graphfedseg")
    strategy.start(SITES, _model(torch.Generator().manual_seed(0)))
    assert strategy.config()["alpha"] == pytest.approx(0.24)
    fixed = build_strategy("graphfedseg", alpha=1.5)
    fixed.start(SITES, _model(torch.Generator().manual_seed(0)))
    assert fixed.config()["alpha"] == 1.5 and fixed.alpha == 1.5


def test_round_report_is_consistent(round_one):
    strategy, initial, models, n_samples, uncertainty, report = round_one
    assert strategy.clients == SITES and report["graph_sites"] == SITES and report["dropped"] == []
    p = np.array(n_samples) / sum(n_samples)
    np.testing.assert_allclose(report["p"], p)
    assert report["uncertainty"] == dict(zip(SITES, uncertainty))

    # cos: cosine of the updates theta - theta_0 over trainable keys, by torch
    updates = [_flat(m) - _flat(initial) for m in models]
    for i in range(3):
        for j in range(3):
            expected = F.cosine_similarity(updates[i], updates[j], dim=0).item()
            assert report["cos"][i][j] == pytest.approx(expected, abs=1e-6)
    assert report["cos"][0][1] > report["cos"][0][2]  # the two sites sharing a component are closer

    # W recomputable from the reported p, cos and U
    W = np.array(report["graph"])
    np.testing.assert_allclose(W, graph_rows_closed_form(report["p"], report["cos"], uncertainty, 0.24, 0.4), atol=1e-6)
    assert np.all(W >= 0) and np.allclose(W.sum(axis=1), 1.0)
    assert report["graph_solver_gap"] <= 1e-6

    # personalised models = W-weighted sums; global = lam * base + (1 - lam) * graph
    personal = strategy.personalized_params()
    assert sorted(personal) == SITES
    for i, s in enumerate(SITES):
        want = weighted_average(models, W[i].tolist())
        for k in TRAINABLE + ["bn.running_mean"]:
            torch.testing.assert_close(personal[s][k], want[k], atol=1e-6, rtol=0)
    base = weighted_average(models, p.tolist())
    graph = weighted_average(models, W.mean(axis=0).tolist())
    for k in TRAINABLE:
        torch.testing.assert_close(strategy.global_params()[k], 0.2 * base[k] + 0.8 * graph[k], atol=1e-6, rtol=0)
    eff = 0.2 * p + 0.8 * W.mean(axis=0)
    assert report["effective_weight"] == pytest.approx(dict(zip(SITES, eff)))


def test_similarity_weights_uses_raw_parameters():
    gen = torch.Generator().manual_seed(1)
    initial = _model(gen)
    models = [_model(gen) for _ in SITES]
    strategy = build_strategy("graphfedseg", similarity="weights", solver="closed_form")
    strategy.start(SITES, initial)
    report = strategy.aggregate(0, _updates(models, [1, 1, 1], [0.2, 0.2, 0.2]), _no_exchange)
    expected = F.cosine_similarity(_flat(models[0]), _flat(models[2]), dim=0).item()
    assert report["cos"][0][2] == pytest.approx(expected, abs=1e-6)
    assert report["graph_solver_gap"] is None


def test_payload_round_zero_has_no_direction():
    strategy = build_strategy("graphfedseg", uncertainty="mc_dropout", mc_samples=10)
    initial = _model(torch.Generator().manual_seed(0))
    strategy.start(SITES, initial)
    payload = strategy.payload("site-a", 0)
    meta = payload.meta["graphfedseg"]
    assert meta == {
        "lambda1": 0.01,
        "uncertainty": "mc_dropout",
        "mc_samples": 10,
        "uncertainty_pass": "after_training",
        "regulariser": "paper",
        "direction": None,
    }
    torch.testing.assert_close(payload.params["conv.weight"], initial["conv.weight"])


def test_payload_direction_is_the_weighted_sum_of_normalised_neighbours(round_one):
    strategy, _, models, _, _, report = round_one
    W = np.array(report["graph"])
    for i, s in enumerate(SITES):
        direction = strategy.payload(s, 1).meta["graphfedseg"]["direction"]
        assert list(direction) == TRAINABLE  # trainable keys only, state-dict order
        assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in direction.values())
        flat = torch.cat([torch.from_numpy(direction[k]).reshape(-1).double() for k in TRAINABLE])
        want = sum(W[i, j] * _flat(models[j]) / _flat(models[j]).norm() for j in range(3) if j != i)
        torch.testing.assert_close(flat, want, atol=1e-6, rtol=1e-5)


def test_site_specific_payloads_do_not_share_a_params_object(round_one):
    """The controller groups sites by params object and compares their metas; arrays cannot be compared."""
    strategy, _, _, _, _, _ = round_one
    payloads = [strategy.payload(s, 1) for s in SITES]
    assert len({id(pl.params) for pl in payloads}) == len(SITES)
    for pl in payloads:  # same tensors as theta_global, no copy
        assert all(pl.params[k] is strategy.global_params()[k] for k in pl.params)


def test_dropped_site_keeps_its_personalised_model(round_one):
    strategy, _, models, _, _, _ = round_one
    before = {k: v.clone() for k, v in strategy.personalized_params()["site-b"].items()}
    gen = torch.Generator().manual_seed(5)
    new_models = [_model(gen) for _ in range(2)]
    present = ["site-a", "site-c"]
    report = strategy.aggregate(1, _updates(new_models, [10, 30], [0.2, 0.4], sites=present), _no_exchange)

    assert report["graph_sites"] == present and report["dropped"] == ["site-b"]
    assert len(report["graph"]) == 2 and sorted(report["effective_weight"]) == present
    np.testing.assert_allclose(report["p"], [0.25, 0.75])
    W = np.array(report["graph"])
    personal = strategy.personalized_params()
    for k, v in before.items():
        assert torch.equal(personal["site-b"][k], v)
    for i, s in enumerate(present):
        want = weighted_average(new_models, W[i].tolist())
        torch.testing.assert_close(personal[s]["conv.weight"], want["conv.weight"], atol=1e-6, rtol=0)
    # theta_global only mixes the sites present this round
    eff = 0.2 * np.array([0.25, 0.75]) + 0.8 * W.mean(axis=0)
    torch.testing.assert_close(
        strategy.global_params()["conv.weight"], weighted_average(new_models, eff.tolist())["conv.weight"], atol=1e-6, rtol=0
    )
    # the dropped site has no row in the latest graph: it trains without the regulariser next round
    assert strategy.payload("site-b", 2).meta["graphfedseg"]["direction"] is None
    assert strategy.payload("site-a", 2).meta["graphfedseg"]["direction"] is not None


def test_aggregate_rejects_missing_uncertainty_and_unknown_sites():
    gen = torch.Generator().manual_seed(0)
    strategy = build_strategy("graphfedseg")
    strategy.start(SITES, _model(gen))
    models = [_model(gen) for _ in SITES]
    updates = _updates(models, [1, 1, 1], [0.1, 0.1, 0.1])
    del updates["site-b"].meta["uncertainty"]
    with pytest.raises(ValueError, match="site-b"):
        strategy.aggregate(0, updates, _no_exchange)
    with pytest.raises(ValueError, match="site-x"):
        strategy.aggregate(0, _updates(models, [1, 1, 1], [0.1] * 3, sites=["site-a", "site-b", "site-x"]), _no_exchange)
    assert strategy.personalized_params() is None


def test_lambda1_zero_sends_no_direction(round_one):
    _, initial, models, n_samples, uncertainty, _ = round_one
    strategy = build_strategy("graphfedseg", lambda1=0.0)
    strategy.start(SITES, initial)
    strategy.aggregate(0, _updates(models, n_samples, uncertainty), _no_exchange)
    assert strategy.payload("site-a", 1).meta["graphfedseg"]["direction"] is None


# ---------------------------------------------------------------------------------------------------
# client objective
# ---------------------------------------------------------------------------------------------------


class FakeEngine:
    """The SegEngine methods the objective uses, over fixed in-memory training images."""

    device = torch.device("cpu")
    spatial_mode = "resize"  # whole images: no window sample (tests/test_window_sample.py covers patch mode)
    window_sample_available = False

    def __init__(self, images: List[torch.Tensor]):
        self.images = images

    def loader(self, split, shuffle=False, train=False):
        assert split == "training" and not shuffle and not train  # whole images, evaluation pipeline
        return [{"image": x, "label": torch.zeros(x.shape[0], 1, *x.shape[2:])} for x in self.images]

    def predictor(self, model, x):  # the engine's whole-image forward (resize mode: one pass)
        return model(x)

    def iterate_logits(self, model, split, with_features=False):
        assert split == "training"
        model.eval()
        with torch.no_grad():
            for x in self.images:
                yield x, torch.zeros(x.shape[0], 1, *x.shape[2:]), model(x), {}


def _unet_round(dropout: float = 0.0):
    """A strategy round over three tiny U-Nets; returns the strategy, the local state dicts and a fresh net."""
    torch.manual_seed(0)
    nets = [FeatureUNet(channels=(4, 8), dropout=dropout) for _ in range(4)]
    initial = nets[0].state_dict()
    strategy = build_strategy("graphfedseg", lambda1=0.5)
    strategy.start(SITES, initial)
    locals_ = [n.state_dict() for n in nets[1:]]
    strategy.aggregate(0, _updates(locals_, [10, 20, 30], [0.3, 0.2, 0.1]), _no_exchange)
    return strategy, locals_, nets[0]


def test_objective_loss_adds_the_paper_regulariser():
    strategy, locals_, net = _unet_round()
    W = strategy.graph
    objective = build_objective("graphfedseg", seg_loss=DiceCELoss(to_onehot_y=True, softmax=True))
    payload = strategy.payload("site-b", 1)
    net.load_state_dict(payload.params)
    objective.begin_round(RoundContext("site-b", 1, 3, server_meta=payload.meta), net)
    assert objective.regulariser_active

    x = torch.randn(2, 3, 16, 16)
    labels = (torch.rand(2, 1, 16, 16) > 0.5).float()
    logits = net(x)
    loss = objective.loss(BatchOutput(inputs=x, labels=labels, logits=logits, features={}))

    keys = [k for k, _ in net.named_parameters()]
    theta = torch.cat([p.reshape(-1) for p in net.parameters()])
    reg = sum(
        W[1, j] * F.cosine_similarity(theta, torch.cat([locals_[j][k].reshape(-1) for k in keys]), dim=0)
        for j in (0, 2)
    )
    expected = DiceCELoss(to_onehot_y=True, softmax=True)(logits, labels) - 0.5 * 0.5 * reg
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())


def test_objective_round_zero_is_plain_segmentation_loss():
    net = FeatureUNet(channels=(4, 8))
    seg = DiceCELoss(to_onehot_y=True, softmax=True)
    objective = build_objective("graphfedseg", seg_loss=seg)
    strategy = build_strategy("graphfedseg")
    strategy.start(SITES, net.state_dict())
    objective.begin_round(RoundContext("site-a", 0, 3, server_meta=strategy.payload("site-a", 0).meta), net)
    assert not objective.regulariser_active
    x, labels = torch.randn(1, 3, 16, 16), torch.ones(1, 1, 16, 16)
    logits = net(x)
    out = BatchOutput(inputs=x, labels=labels, logits=logits, features={})
    assert objective.loss(out).item() == pytest.approx(seg(logits, labels).item())


def test_objective_end_round_evidential_uncertainty():
    torch.manual_seed(1)
    net = FeatureUNet(channels=(4, 8))
    images = [torch.randn(3, 3, 16, 16), torch.randn(1, 3, 16, 16)]
    objective = build_objective("graphfedseg")
    ctx = RoundContext("site-a", 0, 3, server_meta={"graphfedseg": {"lambda1": 0.01, "uncertainty": "evidential"}})
    objective.begin_round(ctx, net)
    stats = objective.end_round(ctx, net, FakeEngine(images))
    assert set(stats) == set(objective.declared_statistics)

    # independent formula: u = C / (sum_c exp(z_c) + C), mean over pixels, then over the 4 images
    net.eval()
    with torch.no_grad():
        z = torch.cat([net(x) for x in images]).double()
    per_image = (2.0 / (z.exp().sum(dim=1) + 2.0)).flatten(1).mean(dim=1)
    assert stats["uncertainty"] == pytest.approx(per_image.mean().item(), rel=1e-6)


def test_objective_end_round_mc_dropout_follows_server_meta():
    torch.manual_seed(2)
    net = FeatureUNet(channels=(4, 8), dropout=0.2)
    images = [torch.randn(2, 3, 16, 16)]
    objective = build_objective("graphfedseg")  # evidential by default; the server asks for MC-dropout
    ctx = RoundContext("site-a", 0, 3, server_meta={"graphfedseg": {"uncertainty": "mc_dropout", "mc_samples": 4}})
    objective.begin_round(ctx, net)
    net.train()
    u = objective.end_round(ctx, net, FakeEngine(images))["uncertainty"]
    assert 0 < u <= 1 and math.isfinite(u)
    assert net.training  # modes restored

    deterministic = FeatureUNet(channels=(4, 8), dropout=0.0)
    objective.begin_round(ctx, deterministic)
    assert objective.end_round(ctx, deterministic, FakeEngine(images))["uncertainty"] == pytest.approx(0.0, abs=1e-9)


def test_objective_rejects_a_direction_for_another_architecture():
    strategy, _, _ = _unet_round()
    payload = strategy.payload("site-a", 1)
    other = FeatureUNet(channels=(4, 8, 16))
    objective = build_objective("graphfedseg")
    with pytest.raises(ValueError):
        objective.begin_round(RoundContext("site-a", 1, 3, server_meta=payload.meta), other)


def test_last_epoch_uncertainty_equals_the_extra_pass_when_the_model_does_not_change(tiny_datalist, tiny_train_config):
    """Real engine, learning rate 0 and no augmentation: the model is the same in every step, and the
    U-Net has instance norm and no dropout (train and eval forward agree), so U from the last epoch's
    training logits must equal U from the after-training pass. With learning rate > 0 they differ."""
    from fedseg.engine import SegEngine

    cfg = dict(tiny_train_config, learning_rate=0.0, augment=False, local_epochs=2)
    engine = SegEngine("site-a", tiny_datalist, cfg)
    results = {}
    for mode in ("after_training", "last_epoch"):
        torch.manual_seed(0)
        model = engine.build_network()
        objective = build_objective("graphfedseg", uncertainty_pass=mode)
        ctx = RoundContext("site-a", 0, 3, server_meta={}, train_config=cfg)
        objective.begin_round(ctx, model)
        engine.train(model, objective, ctx)
        if mode == "last_epoch":  # one image value per training image, from the last epoch only
            assert sum(v.numel() for v in objective._training_values) == len(engine._dataset("training", False))
        results[mode] = objective.end_round(ctx, model, engine)["uncertainty"]
    assert results["last_epoch"] == pytest.approx(results["after_training"], rel=1e-6)

    cfg_learning = dict(cfg, learning_rate=1e-2)
    torch.manual_seed(0)
    model = engine.build_network()
    objective = build_objective("graphfedseg", uncertainty_pass="last_epoch")
    ctx = RoundContext("site-a", 0, 3, server_meta={}, train_config=cfg_learning)
    objective.begin_round(ctx, model)
    SegEngine("site-a", tiny_datalist, cfg_learning).train(model, objective, ctx)
    during = objective.end_round(ctx, model, engine)["uncertainty"]
    objective.begin_round(RoundContext("site-a", 0, 3, server_meta={}, train_config=cfg), model)
    after = objective.end_round(ctx, model, engine)["uncertainty"]  # nothing collected: the extra pass
    assert during != pytest.approx(after, rel=1e-6)


def test_uncertainty_pass_is_sent_and_reported_and_validated():
    strategy = build_strategy("graphfedseg", uncertainty_pass="last_epoch")
    strategy.start(SITES, FeatureUNet(channels=(4, 8)).state_dict())
    assert strategy.config()["uncertainty_pass"] == "last_epoch"
    assert strategy.payload("site-a", 0).meta["graphfedseg"]["uncertainty_pass"] == "last_epoch"
    for bad in ({"uncertainty_pass": "sometimes"}, {"uncertainty_pass": "last_epoch", "uncertainty": "mc_dropout"}):
        with pytest.raises(ValueError):
            build_strategy("graphfedseg", **bad)
        with pytest.raises(ValueError):
            build_objective("graphfedseg", **bad)
