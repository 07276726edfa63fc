"""Differential privacy in the shared engine (Opacus DP-SGD) and the data / parameter-only loss split."""

from __future__ import annotations

import copy
import math
import shutil

import pytest
import torch
from monai.losses import DiceCELoss
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers import DPOptimizer

from fedseg.config import resolve_profile
from fedseg.engine import SegEngine
from fedseg.engine.privacy import ACCOUNTANT
from fedseg.networks.unet import FeatureUNet
from fedseg.objectives.base import BatchOutput, ClientObjective, RoundContext
from fedseg.objectives.registry import build_objective
from fedseg.strategies.collaboration_graph import similarity_regulariser

TARGET_EPSILON = 5.0

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _direction(model: torch.nn.Module, seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(p.shape, generator=g) for k, p in model.named_parameters()}


def _graph_meta(direction: dict, lambda1: float) -> dict:
    return {"graphfedseg": {"lambda1": lambda1, "direction": direction}}


def _flat(model: torch.nn.Module, keys) -> torch.Tensor:
    named = dict(model.named_parameters())
    return torch.cat([named[k].detach().reshape(-1) for k in keys])


def _cos(model: torch.nn.Module, direction: dict) -> float:
    d = torch.cat([v.reshape(-1) for v in direction.values()])
    return float(torch.nn.functional.cosine_similarity(_flat(model, direction), d, dim=0))


# ---------------------------------------------------------------------------------------------------
# DP on
# ---------------------------------------------------------------------------------------------------


def test_dp_epsilon_grows_stays_within_budget_and_model_stays_plain(tiny_datalist, tmp_path):
    profile = resolve_profile("tiny", dp_target_epsilon=TARGET_EPSILON)
    cfg, rounds = profile["train_config"], profile["num_rounds"]
    engine = SegEngine("site-a", tiny_datalist, cfg, dp_seed=0)
    model = engine.build_network()
    plain_keys = list(engine.build_network().state_dict())
    initial = copy.deepcopy(model.state_dict())
    state_dir, restart_dir = tmp_path / "state", tmp_path / "restart"

    eps = []
    for r in range(rounds):
        if r == 1:
            shutil.copytree(state_dir, restart_dir)  # what a site restarted after round 0 would find
            # the client loads the server's weights into the plain model: Opacus must train those tensors
            model.load_state_dict(initial)
        metrics = engine.train(model, ClientObjective(), RoundContext("site-a", r, rounds, state_dir=str(state_dir)))
        assert metrics["dp_delta"] == cfg["dp_delta"] == 1e-5
        assert math.isfinite(metrics["dp_epsilon"]) and math.isfinite(metrics["train_loss"])
        eps.append(metrics["dp_epsilon"])
    assert 0.0 < eps[0] < eps[1]
    # the noise was calibrated for exactly these rounds: the budget is (almost) all spent, never exceeded
    assert TARGET_EPSILON - 0.05 <= eps[-1] <= TARGET_EPSILON + 1e-9

    private = engine.private_training(model, RoundContext("site-a", rounds - 1, rounds))
    batches = math.ceil(engine.n_train / cfg["batch_size"])
    assert isinstance(private.optimizer, DPOptimizer)
    assert private.sample_rate == pytest.approx(1.0 / batches)
    assert private.noise_multiplier == get_noise_multiplier(
        target_epsilon=TARGET_EPSILON,
        target_delta=1e-5,
        sample_rate=1.0 / batches,
        epochs=rounds * cfg["local_epochs"],
        accountant=ACCOUNTANT,
    )
    assert private.steps_taken == private.planned_steps == rounds * cfg["local_epochs"] * batches
    assert private.optimizer.max_grad_norm == cfg["dp_max_grad_norm"]

    # the model is the plain network: same keys, same tensors as the DP optimiser's, no Opacus residue
    assert type(model) is FeatureUNet
    assert list(model.state_dict()) == plain_keys and not any(k.startswith("_module.") for k in plain_keys)
    assert {id(p) for p in private.optimizer.params} == {id(p) for p in model.parameters()}
    assert not any(hasattr(p, a) for p in model.parameters() for a in ("grad_sample", "summed_grad", "_forward_counter"))
    assert not any(m._forward_hooks or m._backward_hooks for m in model.modules())

    # a restarted site resumes the job's accountant from its state folder
    restarted = SegEngine("site-a", tiny_datalist, cfg, dp_seed=0)
    again = restarted.train(
        restarted.build_network(), ClientObjective(), RoundContext("site-a", 1, rounds, state_dir=str(restart_dir))
    )
    assert again["dp_epsilon"] == pytest.approx(eps[1], rel=1e-9)


def test_dp_clips_per_sample_gradients_and_adds_the_parameter_term_unclipped(tiny_datalist, monkeypatch):
    clip = 1e-3
    cfg = resolve_profile("tiny", dp_target_epsilon=TARGET_EPSILON, dp_max_grad_norm=clip, local_epochs=1)["train_config"]
    engine = SegEngine("site-a", tiny_datalist, cfg, dp_seed=0)
    model = engine.build_network()
    objective = build_objective("graphfedseg")
    ctx = RoundContext("site-a", 0, 1, server_meta=_graph_meta(_direction(model), lambda1=2.0))
    objective.begin_round(ctx, model)
    private = engine.private_training(model, ctx)
    assert private.noise_multiplier > 0
    private.optimizer.noise_multiplier = 0.0  # isolate clipping: the step is then exact
    params = list(private.optimizer.params)
    records = []
    original_step = private.optimizer.original_optimizer.step

    def recording_step(*args, **kwargs):
        g_reg = torch.autograd.grad(objective.parameter_loss(model), params)
        privatised = torch.cat([(p.grad - gr).reshape(-1) for p, gr in zip(params, g_reg)])
        per_sample = torch.stack([p.grad_sample.reshape(len(p.grad_sample), -1).norm(dim=1) for p in params]).norm(dim=0)
        records.append((privatised.norm().item(), torch.cat([g.reshape(-1) for g in g_reg]).norm().item(), per_sample))
        return original_step(*args, **kwargs)

    monkeypatch.setattr(private.optimizer.original_optimizer, "step", recording_step)
    metrics = engine.train(model, objective, ctx)
    assert len(records) == metrics["steps"] > 0
    assert metrics["dp_epsilon"] == math.inf  # noiseless steps are reported as such
    expected_batch = private.optimizer.expected_batch_size
    for privatised, reg, per_sample in records:
        # sum of per-sample gradients each clipped to C, divided by the expected batch size
        assert privatised <= clip * len(per_sample) / expected_batch * (1 + 1e-4) + 1e-12
        assert torch.all(per_sample > 10 * clip)  # raw per-sample norms: clipping was active
        assert reg > 100 * clip  # the regulariser's gradient went in whole, not clipped
    assert any(len(per_sample) > 0 for _, _, per_sample in records)


def test_graphfedseg_regulariser_still_acts_under_dp(tiny_datalist):
    cfg = resolve_profile("tiny", dp_target_epsilon=TARGET_EPSILON, local_epochs=1)["train_config"]
    results = {}
    for run, lambda1 in (("off", 0.0), ("off-again", 0.0), ("on", 50.0)):
        engine = SegEngine("site-a", tiny_datalist, cfg, dp_seed=0)  # same sampling and noise
        model = engine.build_network()
        direction = _direction(model)
        objective = build_objective("graphfedseg")
        ctx = RoundContext("site-a", 0, 1, server_meta=_graph_meta(direction, lambda1))
        objective.begin_round(ctx, model)
        assert objective.regulariser_active == (lambda1 > 0)
        before = _cos(model, direction)
        metrics = engine.train(model, objective, ctx)
        results[run] = (model.state_dict(), _cos(model, direction) - before, metrics["dp_epsilon"])
    off, off_again, on = results["off"], results["off-again"], results["on"]
    assert all(torch.equal(off[0][k], off_again[0][k]) for k in off[0])  # seeded: runs are reproducible
    assert any(not torch.equal(off[0][k], on[0][k]) for k in off[0])  # so the difference is the regulariser
    assert on[1] > off[1]  # and it pulls the weights towards the neighbours' direction
    assert on[2] == off[2]  # at no privacy cost


def test_dp_rejects_an_objective_with_a_parameter_term_in_its_data_loss(tiny_datalist):
    class _Unsplit(ClientObjective):
        name = "unsplit"

        def parameter_loss(self, model):
            return sum(p.sum() for p in model.parameters())

    cfg = resolve_profile("tiny", dp_target_epsilon=TARGET_EPSILON)["train_config"]
    engine = SegEngine("site-a", tiny_datalist, cfg, dp_seed=0)
    with pytest.raises(TypeError, match="data_loss"):
        engine.train(engine.build_network(), _Unsplit(), RoundContext("site-a", 0, 1))


# ---------------------------------------------------------------------------------------------------
# DP off: nothing changes
# ---------------------------------------------------------------------------------------------------


def test_graphfedseg_loss_and_gradients_equal_hand_built_seg_plus_regulariser():
    torch.manual_seed(0)
    net = FeatureUNet(channels=(4, 8))
    direction = _direction(net, seed=5)
    lambda1 = 0.8
    seg = DiceCELoss(to_onehot_y=True, softmax=True)
    objective = build_objective("graphfedseg", seg_loss=seg)
    objective.begin_round(RoundContext("site-a", 1, 3, server_meta=_graph_meta(direction, lambda1)), net)
    x, labels = torch.randn(2, 3, 16, 16), (torch.rand(2, 1, 16, 16) > 0.5).float()
    params = list(net.parameters())

    logits = net(x)
    loss = objective.loss(BatchOutput(inputs=x, labels=labels, logits=logits, features={}))
    grads = torch.autograd.grad(loss, params)

    logits = net(x)
    theta = torch.cat([dict(net.named_parameters())[k].reshape(-1) for k in direction])
    d = torch.cat([v.reshape(-1) for v in direction.values()])
    expected = seg(logits, labels) - 0.5 * lambda1 * torch.dot(theta, d) / theta.norm()
    expected_grads = torch.autograd.grad(expected, params)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-7)

    # the split the DP engine uses adds up to the same loss
    out = BatchOutput(inputs=x, labels=labels, logits=net(x), features={})
    split = objective.data_loss(out) + objective.parameter_loss(net)
    assert split.item() == pytest.approx(objective.loss(out).item(), rel=1e-7)
    assert objective.data_loss(out).item() == pytest.approx(seg(out.logits, labels).item(), rel=1e-7)


def test_engine_without_dp_is_the_previous_training_loop(tiny_datalist, tiny_train_config):
    cfg = {**tiny_train_config, "augment": False}
    assert cfg["dp_target_epsilon"] is None
    engine = SegEngine("site-a", tiny_datalist, cfg)
    model, reference = engine.build_network(), engine.build_network()
    direction = _direction(model)
    ctx = RoundContext("site-a", 0, 1, server_meta=_graph_meta(direction, 0.7))
    objective = build_objective("graphfedseg")
    objective.begin_round(ctx, model)
    order_state = engine.shuffle_generator.get_state()  # the hand loop below replays the round's batches
    metrics = engine.train(model, objective, ctx)
    assert set(metrics) == {"train_loss", "steps"}

    # the loop before the DP feature, by hand: seg loss + similarity regulariser, one Adam step per batch
    seg = engine.build_loss()
    optimizer = engine.make_optimizer(reference)
    named = dict(reference.named_parameters())
    # the regulariser's value and gradient are checked against cosines and the closed form in
    # test_graphfedseg_math.py; here the same function is used so the loops can be compared bit for bit
    d = [torch.as_tensor(v) for v in direction.values()]
    engine.shuffle_generator.set_state(order_state)
    loader = engine.training_batches()  # the same batches in the same order (augment is off in cfg)
    losses = []
    for _ in range(cfg["local_epochs"]):
        for batch in loader:
            reference.train()
            optimizer.zero_grad(set_to_none=True)
            theta = [named[k] for k in direction]
            loss = seg(reference(batch["image"]), batch["label"]) + similarity_regulariser(theta, d, 0.7)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    assert metrics["steps"] == len(losses)
    assert metrics["train_loss"] == sum(losses) / len(losses)
    trained, expected = model.state_dict(), reference.state_dict()
    assert all(torch.equal(trained[k], expected[k]) for k in expected)
