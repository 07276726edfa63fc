"""GraphFedSeg as its authors' code runs it (the ``paper`` profile): every option against an independent reference.

References: the table of differences read off the authors' code (``graph+double.py`` and its utils), their QP as they
write it solved by cvxpy, NumPy for their Dice on raw logits and their prior, ``torch.nn.functional.cosine_similarity``
over explicit neighbour models for their similarity term, brute-force sums for the aggregation with last round's graph,
the closed-form condition of the two-site identity (and hypothesis over random models), and the site's own engine for
the local-model evaluation.
"""

from __future__ import annotations

import json
import math

import cvxpy as cp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fedseg.bundle import load_bundle
from fedseg.config import LOCAL_PROTOCOL_KEYS, resolve_profile
from fedseg.networks.unet import FeatureUNet
from fedseg.objectives import BatchOutput, RoundContext, build_objective
from fedseg.strategies import ClientUpdate, build_strategy
from fedseg.strategies.aggregation import weighted_average
from fedseg.strategies.collaboration_graph import (
    graph_rows_closed_form,
    initial_graph,
    restrict_graph,
    snap_cosine,
    top_k_neighbours,
    top_k_regulariser,
    two_site_identity_holds,
    uncertainty_prior,
)

from inprocess import builtin_sites, run_in_process

SITES = ["site-a", "site-b", "site-c"]

#: the issue's table, "their code" column, as train_config values (+ what the table implies: their U-Net's widths,
#: instance norm without affine, the Adam state kept, no learning-rate decay: their scheduler is never stepped)
AUTHORS_PROTOCOL = {
    "network_variant": "three_conv_nearest", "network_init": None, "norm": "instance", "channels": [16, 32, 64, 128, 256],
    "optimizer_name": "Adam", "learning_rate": 5e-4, "adam_betas": [0.9, 0.99], "weight_decay": 1e-5,
    "optimizer_state": "keep", "lr_decay_per_round": 1.0,
    "batch_size": 4, "drop_last": True, "local_epochs": 2,
    "augment": True, "augment_level": "flip", "intensity": "image_max",
    "seg_loss": "logit_dice", "lambda_dice": 1.0, "lambda_ce": 0.0,
    "eval_local_models": True, "eval_largest_component": True, "eval_best_val_round": False,
    "image_size": 384,
}
#: the method rows of the table
AUTHORS_METHOD = {
    "regulariser": "top_k", "top_k": 3, "lambda1": 0.01,
    "uncertainty_pass": "training_batches", "gamma": 0.0, "prior": "samples_over_uncertainty",
    "similarity": "update_global", "alpha": 1 / 0.7, "similarity_snap": 0.9,
    "graph_in_aggregation": "previous", "lam": 0.2, "initial_graph": "uniform_others",
}


def _controller_args(tmp_path, method="graphfedseg", **kw):
    from fedseg.bench.inprocess import controller_args

    return controller_args(method, tmp_path, **kw)


# -------------------------------------------------------------------------------------- the paper profile
def test_the_paper_profile_trains_as_the_authors_code_field_by_field(tmp_path):
    args = _controller_args(tmp_path, profile="paper")
    cfg = args["train_config"]
    for key, value in AUTHORS_PROTOCOL.items():
        assert cfg[key] == value, key
    assert args["num_rounds"] == 250
    # the network the variant builds is initialised like theirs (Kaiming fan-out): the weights' std
    net = FeatureUNet(channels=cfg["channels"], variant=cfg["network_variant"], init=cfg["network_init"], init_seed=0)
    conv = net.encoders[1][1].conv  # a 3x3 conv 32 -> 32: fan_out = 32 * 9
    assert float(conv.weight.detach().std()) == pytest.approx(math.sqrt(2 / (32 * 9)), rel=0.05)
    strategy, objective = args["strategy_args"], args["objective_args"]
    for key, value in AUTHORS_METHOD.items():
        got = strategy[key] if key in strategy else objective[key]
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, key
    assert objective["uncertainty_pass"] == "training_batches" and objective["uncertainty_loss_weight"] == 0.4
    # the default profile stays the paper's equations
    default = _controller_args(tmp_path / "d")
    assert (default["strategy_args"]["similarity"], default["strategy_args"]["graph_in_aggregation"],
            default["strategy_args"]["gamma"], default["train_config"]["seg_loss"]) == ("update", "current", 0.4, "dice_ce")
    # a keyword overrides the profile's value
    chosen = _controller_args(tmp_path / "c", profile="paper", regulariser="paper", gamma=0.4)
    assert chosen["strategy_args"]["regulariser"] == "paper" and chosen["strategy_args"]["gamma"] == 0.4


def test_a_paper_bench_with_graphfedsegs_protocol_gives_it_to_every_arm(tmp_path):
    from fedseg.bench.runs import Budget
    from fedseg.recipes import paper_protocol
    from fedseg.recipes.export import export_job

    protocol = paper_protocol("graphfedseg")["train_config"]
    assert set(protocol) == set(LOCAL_PROTOCOL_KEYS)
    budget = Budget(profile="paper", rounds=2, local_epochs=1, sets={"image_size": 64}, protocol="graphfedseg")
    for method in ("fedavg", "graphfedseg", "fedevi"):
        job = export_job(method, tmp_path / method, "paper", num_rounds=budget.num_rounds(), **budget.overrides(0))
        config = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
        (args,) = [w["args"] for w in config["workflows"] if w["path"].endswith("FedSegController")]
        cfg = args["train_config"]
        expected = {**AUTHORS_PROTOCOL, "image_size": 64, "local_epochs": 1}
        assert {k: cfg[k] for k in expected} == expected, method


def test_unknown_loss_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="seg_loss.*dice_ce"):
        resolve_profile("default", seg_loss="dice")


# ------------------------------------------------------------------------------------------ the loss
def _their_dice(logits: np.ndarray, labels: np.ndarray) -> float:
    """Dice on raw logits as their code writes it: per class, sums over the batch and pixels, squared logits."""
    loss = 0.0
    classes = logits.shape[1]
    for c in range(classes):
        y = (labels[:, 0] == c).astype(np.float64)
        x = logits[:, c].astype(np.float64)
        loss += (2 * (x * y).sum() + 1e-5) / ((x ** 2).sum() + y.sum() + 1e-5)
    return 1.0 - loss / classes


@pytest.mark.parametrize("lambda_ce", [0.0, 1.0])
def test_logit_dice_is_their_dice_on_raw_logits(lambda_ce):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 2, 8, 8, generator=gen) * 2
    labels = (torch.rand(3, 1, 8, 8, generator=gen) > 0.6).float()
    loss = load_bundle(None, {"seg_loss": "logit_dice", "lambda_ce": lambda_ce}).get_parsed_content("loss", instantiate=True)
    x, y = logits.numpy().astype(np.float64), labels.numpy()
    log_softmax = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    ce = -np.take_along_axis(log_softmax, y.astype(int), axis=1).mean()
    assert float(loss(logits, labels)) == pytest.approx(_their_dice(x, y) + lambda_ce * ce, rel=1e-5)
    # the suite's loss is another one (softmax, foreground, per image)
    suite = load_bundle(None, {"lambda_ce": 0.0}).get_parsed_content("loss", instantiate=True)
    assert abs(float(suite(logits, labels)) - _their_dice(x, y)) > 1e-3


# ------------------------------------------------------------------------------------------ the graph
def test_the_authors_qp_is_the_papers_with_alpha_one_over_lambda():
    """Their row: min 0.7 ||x||^2 + (d - 2 * 0.7 p).x, d = -cos, on the simplex (cvxpy, written as they write it) =
    the closed form with alpha = 1 / 0.7, gamma = 0."""
    rng = np.random.default_rng(0)
    for k in (2, 3, 4, 6):
        p = rng.dirichlet(np.ones(k))
        cos = np.clip(rng.normal(size=(k, k)), -1, 1)
        cos = (cos + cos.T) / 2
        np.fill_diagonal(cos, 1.0)
        ours = graph_rows_closed_form(p, cos, np.zeros(k), 1 / 0.7, 0.0)
        for i in range(k):
            x = cp.Variable(k)
            q = -cos[i] - 2 * 0.7 * p
            cp.Problem(cp.Minimize(0.7 * cp.sum_squares(x) + q @ x), [x >= 0, cp.sum(x) == 1]).solve(solver=cp.CLARABEL)
            np.testing.assert_allclose(ours[i], x.value, atol=1e-6)


def test_prior_snap_initial_graph_and_neighbours_by_hand():
    n, U = np.array([698.0, 411.0]), np.array([0.25, 0.1])
    raw = np.array([698 / 0.250001, 411 / 0.100001])
    np.testing.assert_allclose(uncertainty_prior(n, U), raw / raw.sum())
    with pytest.raises(ValueError):
        uncertainty_prior([1.0], [-0.1])
    np.testing.assert_array_equal(snap_cosine([[1.0, 0.95], [0.9, -1.0]], 0.9), [[1.0, 1.0], [0.9, -1.0]])
    np.testing.assert_array_equal(snap_cosine([[0.95]], None), [[0.95]])
    np.testing.assert_allclose(initial_graph(3, "uniform_others"), [[0, .5, .5], [.5, 0, .5], [.5, .5, 0]])
    np.testing.assert_allclose(initial_graph(3), np.full((3, 3), 1 / 3))
    assert initial_graph(1, "uniform_others").tolist() == [[1.0]]
    assert top_k_neighbours([0.1, 0.4, 0.1, 0.4], 3).tolist() == [1, 3, 0]  # ties in index order
    W = np.array([[0.6, 0.4], [0.3, 0.7]])
    np.testing.assert_allclose(restrict_graph(W, ["a", "b"], ["b", "c", "a"], "uniform_others"),
                               [[0.7 / 1.5, 0.5 / 1.5, 0.3 / 1.5], [0.5, 0.0, 0.5], [0.4 / 1.5, 0.5 / 1.5, 0.6 / 1.5]])


def _model(gen, scale=1.0):
    return {"conv.weight": scale * torch.randn(4, 3, 3, 3, generator=gen, dtype=torch.float64),
            "conv.bias": scale * torch.randn(4, generator=gen, dtype=torch.float64),
            "head.weight": scale * torch.randn(2, 4, 1, 1, generator=gen, dtype=torch.float64)}


def _flat(params):
    return torch.cat([params[k].reshape(-1) for k in ("conv.weight", "conv.bias", "head.weight")])


def _updates(models, n, U, sites=SITES):
    return {s: ClientUpdate(site=s, params=m, n_samples=c, meta={"uncertainty": u}) for s, m, c, u in zip(sites, models, n, U)}


def _authors_strategy(**kw):
    args = {k: v for k, v in AUTHORS_METHOD.items()}
    args.update(kw)
    return build_strategy("graphfedseg", solver="cvxpy", **args)


def _no_exchange(task, payloads):
    raise AssertionError("GraphFedSeg runs no second task")


def test_aggregation_with_last_rounds_graph_and_cosines_against_the_new_global_by_brute_force():
    gen = torch.Generator().manual_seed(1)
    initial = _model(gen)
    strategy = _authors_strategy()
    strategy.start(SITES, initial)
    n, U = [20, 30, 50], [0.3, 0.1, 0.6]
    p = np.array(n) / sum(n)
    W_previous = initial_graph(3, "uniform_others")
    for round_ in range(3):
        models = [{k: initial[k] + _model(gen, 0.1)[k] for k in initial} for _ in SITES]
        report = strategy.aggregate(round_, _updates(models, n, U), _no_exchange)
        # theta_global = 0.2 sum_j p_j theta_j + 0.8 mean_i sum_j W_prev_ij theta_j (W_prev: last round's, or 1/(K-1))
        base = weighted_average(models, p.tolist())
        neigh = [weighted_average(models, W_previous[i].tolist()) for i in range(3)]
        for k in initial:
            want = 0.2 * base[k] + 0.8 * sum(m[k] for m in neigh) / 3
            torch.testing.assert_close(strategy.global_params()[k], want, atol=1e-10, rtol=0)
        np.testing.assert_allclose(report["aggregation_graph"], W_previous, atol=1e-12)
        # cosines of theta_j - the new theta_global, snapped above 0.9
        g = _flat(strategy.global_params())
        changes = [_flat(m) - g for m in models]
        cos = np.array([[F.cosine_similarity(a, b, dim=0).item() for b in changes] for a in changes])
        np.testing.assert_allclose(report["cos"], np.where(cos > 0.9, 1.0, cos), atol=1e-6)
        # W from p ∝ n / U, alpha 1 / 0.7, no U penalty
        prior = np.array(n) / (np.array(U) + 1e-6)
        prior /= prior.sum()
        np.testing.assert_allclose(report["prior"], prior)
        np.testing.assert_allclose(report["graph"], graph_rows_closed_form(prior, report["cos"], U, 1 / 0.7, 0.0), atol=1e-6)
        # the personalised models are this round's graph over this round's models
        W = np.array(report["graph"])
        for i, s in enumerate(SITES):
            want = weighted_average(models, W[i].tolist())
            torch.testing.assert_close(strategy.personalized_params()[s]["conv.weight"], want["conv.weight"], atol=1e-10, rtol=0)
        W_previous = W


def test_update_global_needs_the_previous_graph_in_the_aggregation():
    with pytest.raises(ValueError, match="graph_in_aggregation='previous'"):
        build_strategy("graphfedseg", similarity="update_global")
    with pytest.raises(ValueError, match="prior"):
        build_strategy("graphfedseg", prior="uncertainty")


# --------------------------------------------------------------------------------- the two-site identity
def test_two_site_identity_condition_is_the_closed_form_projection():
    for p1 in np.linspace(0.0, 1.0, 41):
        p = np.array([p1, 1 - p1])
        W = graph_rows_closed_form(p, [[1.0, -1.0], [-1.0, 1.0]], [0.0, 0.0], 1 / 0.7, 0.0)
        assert np.allclose(W, np.eye(2)) == two_site_identity_holds(p, 1 / 0.7), p1
    assert two_site_identity_holds([0.63, 0.37], 1 / 0.7)  # Kvasir / ClinicDB training shares
    assert not two_site_identity_holds([0.85, 0.15], 1 / 0.7)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(5, 200), st.integers(5, 200), st.floats(0.05, 0.9), st.floats(0.05, 0.9))
def test_two_sites_with_cosines_against_the_new_global_give_w_identity(seed, n1, n2, u1, u2):
    """With two sites the new global model is a convex mix of the two local models, so their changes against it are
    opposite (cosine -1) and, whenever the condition holds for p ∝ n / U, W = I in every round."""
    gen = torch.Generator().manual_seed(seed)
    initial = _model(gen)
    strategy = _authors_strategy()
    strategy.start(SITES[:2], initial)
    prior = uncertainty_prior([n1, n2], [u1, u2])
    for round_ in range(2):
        models = [{k: initial[k] + _model(gen, 0.1)[k] for k in initial} for _ in range(2)]
        report = strategy.aggregate(round_, _updates(models, [n1, n2], [u1, u2], SITES[:2]), _no_exchange)
        np.testing.assert_allclose(report["cos"], [[1.0, -1.0], [-1.0, 1.0]], atol=1e-6)
        assert np.allclose(report["graph"], np.eye(2), atol=1e-6) == two_site_identity_holds(prior, 1 / 0.7)


# ------------------------------------------------------------------------------------- the similarity term
def test_top_k_term_matches_cosines_to_explicit_neighbours():
    """Site b's term from the server's payload equals 0.01 (1 - sum_{j in top-3} W_bj cos(theta, theta_j) / (sum W + 1e-6))
    with theta_b's own entry counted as cosine 1 and the others' models those they sent last round; the gradient too."""
    torch.manual_seed(0)
    nets = [FeatureUNet(channels=(4, 8)) for _ in range(5)]
    sites = SITES + ["site-d"]
    strategy = build_strategy("graphfedseg", **{**AUTHORS_METHOD, "top_k": 3})
    strategy.start(sites, nets[0].state_dict())
    locals_ = [n.state_dict() for n in nets[1:]]
    strategy.aggregate(0, _updates(locals_, [10, 20, 30, 40], [0.3, 0.2, 0.1, 0.4], sites), _no_exchange)
    strategy.graph = np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.5, 0.15, 0.25], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0]])
    net = nets[0]
    objective = build_objective("graphfedseg", seg_loss=lambda logits, labels: logits.sum() * 0)
    payload = strategy.payload("site-b", 1)
    objective.begin_round(RoundContext("site-b", 1, 3, server_meta=payload.meta), net)
    term = objective.parameter_loss(net)

    row, chosen = strategy.graph[1], [1, 3, 2]  # site-b: itself 0.5, site-d 0.25, site-c 0.15
    assert top_k_neighbours(row, 3).tolist() == chosen
    theta = torch.cat([p.reshape(-1) for p in net.parameters()])
    keys = [k for k, _ in net.named_parameters()]
    others = {j: torch.cat([locals_[j][k].reshape(-1) for k in keys]) for j in chosen}
    others[1] = theta  # itself: its live parameters
    weighted = sum(row[j] * F.cosine_similarity(theta, others[j], dim=0) for j in chosen)
    expected = 0.01 * (1 - weighted / (row[chosen].sum() + 1e-6))
    assert float(term.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    (grad,) = torch.autograd.grad(term, [next(net.parameters())])
    (want,) = torch.autograd.grad(expected, [next(net.parameters())])
    torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-9)
    # site-d's top 3 hold itself with all the weight: a constant, no term
    objective.begin_round(RoundContext("site-d", 1, 3, server_meta=strategy.payload("site-d", 1).meta), net)
    assert not objective.regulariser_active


def test_top_k_term_in_the_first_round_pulls_to_the_initial_model():
    """Before any local model every neighbour holds the initial model: the term is 0.01 (1 - cos(theta, theta_0)) with the
    initial graph 1/(K-1) off the diagonal (itself weight 0)."""
    torch.manual_seed(1)
    initial, net = FeatureUNet(channels=(4, 8)), FeatureUNet(channels=(4, 8))
    strategy = build_strategy("graphfedseg", **AUTHORS_METHOD)
    strategy.start(SITES, initial.state_dict())
    objective = build_objective("graphfedseg", seg_loss=lambda logits, labels: logits.sum() * 0)
    objective.begin_round(RoundContext("site-a", 0, 3, server_meta=strategy.payload("site-a", 0).meta), net)
    theta = torch.cat([p.reshape(-1) for p in net.parameters()])
    theta0 = torch.cat([p.reshape(-1) for p in initial.parameters()]).detach()
    expected = 0.01 * (1 - F.cosine_similarity(theta, theta0, dim=0) / (1 + 1e-6))
    assert float(objective.parameter_loss(net)) == pytest.approx(float(expected), rel=1e-6)
    assert float(top_k_regulariser([theta], None, 1.0, 1.0, 0.01)) == pytest.approx(0.01 * (1 - 1 / (1 + 1e-6)))


# ------------------------------------------------------------------------------------------- the uncertainty
def test_uncertainty_over_training_batches_and_its_constant_loss_term():
    """U = mean over every batch of both epochs of the batch's mean vacuity C / S; 0.4 log(1 + u^2) changes the loss
    by that constant and no gradient."""
    torch.manual_seed(2)
    net = FeatureUNet(channels=(4, 8))
    seg = load_bundle(None, {"seg_loss": "logit_dice", "lambda_ce": 0.0}).get_parsed_content("loss", instantiate=True)
    meta = {"graphfedseg": {"lambda1": 0.0, "uncertainty": "evidential", "uncertainty_pass": "training_batches"}}
    with_term = build_objective("graphfedseg", seg_loss=seg, uncertainty_loss_weight=0.4)
    without = build_objective("graphfedseg", seg_loss=seg)
    ctx = RoundContext("site-a", 0, 3, server_meta=meta, train_config={"local_epochs": 2})
    with_term.begin_round(ctx, net)
    without.begin_round(ctx, net)
    batch_means = []
    for epoch in range(2):
        for b in range(3):
            x, y = torch.randn(2, 3, 16, 16), (torch.rand(2, 1, 16, 16) > 0.5).float()
            logits = net(x)
            z = logits.detach().double()
            u = (2.0 / (z.exp().sum(dim=1) + 2.0)).mean()  # vacuity without the clamp, as their code
            batch_means.append(float(u))
            out = BatchOutput(x, y, logits, {}, epoch=epoch)
            a, b_ = with_term.loss(out), without.loss(BatchOutput(x, y, logits, {}, epoch=epoch))
            assert float(a - b_) == pytest.approx(0.4 * math.log1p(float(u) ** 2), rel=1e-5)
            ga = torch.autograd.grad(a, list(net.parameters()), retain_graph=True)
            gb = torch.autograd.grad(b_, list(net.parameters()))
            assert all(torch.equal(p, q) for p, q in zip(ga, gb))
    stats = with_term.end_round(ctx, net, engine=None)
    assert stats["uncertainty"] == pytest.approx(np.mean(batch_means), rel=1e-6)


def test_training_batches_needs_the_evidential_estimator():
    with pytest.raises(ValueError, match="training_batches"):
        build_objective("graphfedseg", uncertainty="mc_dropout", uncertainty_pass="training_batches")


# ------------------------------------------------------------------------------------ local-model evaluation
def test_local_models_are_scored_on_their_own_test_split(tmp_path):
    """``eval_local_models``: final.local holds each site's last trained model as it sent it, scored by the site's own
    engine on its test split (recomputed here), beside the global model's scores, with per-image rows written."""
    from fedseg.engine.engine import SegEngine

    sites = builtin_sites("polyp", ["site-1", "site-2"], tmp_path / "data")
    report = run_in_process("graphfedseg", sites, tmp_path, profile="paper", num_rounds=2, local_epochs=1, image_size=32,
                            channels=[8, 16, 32, 64], data_profile="tiny")
    controller = report["_controller"]
    assert set(report["final"]) >= {"global", "local"}
    cfg = controller.train_config
    for site, datalist in sites.items():
        engine = SegEngine(site, datalist, cfg)
        model = engine.build_network()
        model.load_state_dict(controller._local_models[site])
        metrics = engine.evaluate(model, "test")
        assert report["final"]["local"][site]["dice"] == pytest.approx(metrics["dice"], abs=1e-6)
        assert "dice_lcc" in report["final"]["local"][site]
        assert (tmp_path / "sites" / site / "fedseg_outputs" / site / "per_image_local.json").is_file()
    # the sent local models are the last round's train results, not the global model
    last = [r for r in controller.received if r["task"] == "train" and r["round"] == 1]
    assert {r["site"] for r in last} == set(sites)
    final_global = controller._strategy.global_params()
    assert any(not torch.equal(controller._local_models["site-1"][k], final_global[k]) for k in final_global)
    # two sites, cosines against the new global model: the graph is the identity from the first round on
    for r in report["rounds"]:
        np.testing.assert_allclose(r["graph"], np.eye(2), atol=1e-6)
