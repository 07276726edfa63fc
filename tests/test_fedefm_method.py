"""FedEFM's federated pieces: topology and gossip, several models per task, the silo objective and the
server strategy (CFL averaging, DFL relay without averaging, overseas experts routed to their owners)."""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch
from nvflare.app_common.abstract.fl_model import FLModel

from fedseg.fl.controller import FedSegController
from fedseg.fl.protocol import pack_models, unpack_models
from fedseg.fl.validation import InvalidUpdateError
from fedseg.foundation import build_vit
from fedseg.foundation.topology import gossip_mix, in_neighbours, mixing_matrix, out_neighbours
from fedseg.objectives.base import BatchOutput, RoundContext
from fedseg.objectives.fedefm import FedEFMObjective
from fedseg.strategies import fedefm as fedefm_strategy
from fedseg.strategies.base import ClientUpdate
from fedseg.strategies.fedefm import FedEFMStrategy

SITES = ["a", "b", "c"]


# ------------------------------------------------------------------------------------------ topology
def test_ring_and_full_neighbours():
    assert out_neighbours(SITES, "ring") == {"a": ["b"], "b": ["c"], "c": ["a"]}
    assert in_neighbours(SITES, "ring") == {"a": ["c"], "b": ["a"], "c": ["b"]}
    assert out_neighbours(SITES, "full") == {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]}
    with pytest.raises(ValueError, match="topology"):
        out_neighbours(SITES, "star")
    with pytest.raises(ValueError, match="two distinct"):
        out_neighbours(["a"], "ring")


def test_ring_gossip_step_by_hand():
    """theta_a' = 1/2 theta_a + 1/2 theta_c on the ring a -> b -> c -> a (a's in-neighbour is c)."""
    w = mixing_matrix(SITES, "ring", 0.5)
    expected = torch.tensor([[0.5, 0.0, 0.5], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], dtype=torch.float64)
    assert torch.equal(w, expected)
    thetas = {s: {"w": torch.tensor([float(i), 10.0 * i]), "count": torch.tensor(i)} for i, s in enumerate(SITES)}
    mixed_a = gossip_mix(thetas["a"], [thetas["c"]], 0.5)
    assert torch.allclose(mixed_a["w"], torch.tensor([1.0, 10.0]))
    assert int(mixed_a["count"]) == 0  # integer buffers stay the silo's own
    full = mixing_matrix(SITES, "full", 0.4)
    assert torch.allclose(full.sum(1), torch.ones(3, dtype=torch.float64))
    assert full[0, 1] == pytest.approx(0.3) and full[0, 0] == pytest.approx(0.4)


# --------------------------------------------------------------------------------- packed models
def test_pack_unpack_round_trip():
    main = {"x": torch.ones(2)}
    models = {"expert@b": {"x": torch.zeros(2)}, "expert@c": {"x": torch.full((2,), 3.0)}}
    flat = pack_models(models, main=main)
    back_main, back_models = unpack_models(flat)
    assert torch.equal(back_main["x"], main["x"])
    assert set(back_models) == set(models)
    assert torch.equal(back_models["expert@c"]["x"], models["expert@c"]["x"])
    with pytest.raises(ValueError, match="no '/'"):
        pack_models({"a/b": {"x": torch.ones(1)}})


def test_controller_validates_every_packed_model():
    controller = FedSegController(method="fedefm", strategy="fedefm", objective="fedefm")
    controller._reference = {"x": torch.zeros(3)}
    good = FLModel(params=pack_models({"guest@a": {"x": torch.ones(3)}}), meta={"n_samples": 4})
    update = controller._to_update("b", good, require_params=True)
    assert update.params == {} and torch.equal(update.models["guest@a"]["x"], torch.ones(3))
    bad = FLModel(params=pack_models({"guest@a": {"x": torch.tensor([1.0, float("nan"), 0.0])}}), meta={"n_samples": 4})
    with pytest.raises(InvalidUpdateError, match=r"guest@a.*NaN"):
        controller._to_update("b", bad, require_params=True)
    wrong = FLModel(params=pack_models({"guest@a": {"x": torch.ones(4)}}), meta={"n_samples": 4})
    with pytest.raises(InvalidUpdateError, match="shape"):
        controller._to_update("b", wrong, require_params=True)


# ------------------------------------------------------------------------------------- objective
def _vit(seed: int):
    return build_vit("tiny", in_channels=1, num_classes=5, init_seed=seed)


def _numpy_emd(u: np.ndarray, v: np.ndarray) -> float:
    """DeepEMD marginals + 1 - cos cost, solved by POT on numpy arrays (independent of fedseg.foundation)."""
    a = np.maximum(u @ v.mean(0), 0) + 1e-3
    b = np.maximum(v @ u.mean(0), 0) + 1e-3
    un = u / np.linalg.norm(u, axis=1, keepdims=True)
    vn = v / np.linalg.norm(v, axis=1, keepdims=True)
    return float(ot.emd2(a / a.sum(), b / b.sum(), 1.0 - un @ vn.T))


def _log_softmax(z):
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def _round_ctx(teachers, models, round_=1, **cfg):
    return RoundContext(site="a", round=round_, total_rounds=3, server_meta={"fedefm_teachers": teachers}, train_config=cfg, models=models)


def test_distillation_loss_matches_a_hand_assembly():
    torch.manual_seed(0)
    student, teachers = _vit(0), {"b": _vit(1), "c": _vit(2)}
    objective = FedEFMObjective(alpha=0.3, temperature=2.0, tau=0.5, mu=0.2)
    ctx = _round_ctx(["b", "c"], {f"expert@{k}": t.state_dict() for k, t in teachers.items()})
    objective.begin_round(ctx, student)
    assert objective.needs_features
    x = torch.randn(2, 1, 96, 96)
    y = torch.tensor([1, 4])
    logits, tokens = student.forward_features(x)
    loss = objective.loss(BatchOutput(x, y, logits, {"tokens": tokens}))

    zs, fs = logits.detach().numpy().astype(np.float64), tokens.detach().numpy().astype(np.float64)
    ce = -_log_softmax(zs)[np.arange(2), y.numpy()].mean()
    kls, emds = [], []
    for t in teachers.values():
        zt, ft = (v.detach().numpy().astype(np.float64) for v in t.forward_features(x))
        lpt, lps = _log_softmax(zt / 2.0), _log_softmax(zs / 2.0)
        kls.append((np.exp(lpt) * (lpt - lps)).sum(1).mean())
        emds.append(np.mean([_numpy_emd(fs[i], ft[i]) for i in range(2)]))
    kls, emds = np.array(kls), np.array(emds)
    omega = np.exp(-emds / 0.5) / np.exp(-emds / 0.5).sum()
    expected = 0.7 * ce + (omega * (0.3 * 4.0 * kls + 0.2 * emds)).sum()
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-4)
    stats = objective.end_round(ctx, student, engine=None)
    assert stats["teacher_emd"] == pytest.approx(emds.tolist(), rel=1e-4)
    assert stats["teacher_weights"] == pytest.approx(omega.tolist(), rel=1e-4)
    loss.backward()  # differentiable end to end (through POT's torch backend)
    assert student.vit.patch_embedding.patch_embeddings.weight.grad is not None


def test_without_emd_weights_are_uniform_and_round_zero_is_cross_entropy():
    student = _vit(0)
    objective = FedEFMObjective(use_emd=False)
    ctx = _round_ctx(["b", "c", "d"], {f"expert@{k}": _vit(i).state_dict() for i, k in enumerate("bcd", 1)})
    objective.begin_round(ctx, student)
    assert not objective.needs_features
    x, y = torch.randn(2, 1, 96, 96), torch.tensor([0, 3])
    objective.loss(BatchOutput(x, y, student(x), {}))
    stats = objective.end_round(ctx, student, None)
    assert stats["teacher_weights"] == pytest.approx([1 / 3] * 3) and "teacher_emd" not in stats

    objective.begin_round(_round_ctx([], {}, round_=0), student)
    logits = student(x)
    assert float(objective.loss(BatchOutput(x, y, logits, {}))) == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)))
    assert objective.end_round(ctx, student, None) == {}


def test_objective_refuses_dp_and_missing_teachers():
    objective = FedEFMObjective()
    with pytest.raises(ValueError, match="DP-SGD"):
        objective.begin_round(_round_ctx([], {}, dp_target_epsilon=8.0), _vit(0))
    with pytest.raises(ValueError, match="did not carry"):
        objective.begin_round(_round_ctx(["b"], {}), _vit(0))
    with pytest.raises(ValueError):
        FedEFMObjective(alpha=1.5)


def test_gossip_task_mixes_with_neighbours():
    objective = FedEFMObjective(gossip_self_weight=0.5)
    own, other = _vit(0), _vit(1)
    ctx = _round_ctx([], {"neighbour@c": other.state_dict()})
    main, models, stats = objective.handle_weight_task("gossip", ctx, own, engine=None)
    key = "vit.classification_head.weight"
    assert torch.allclose(main[key], 0.5 * own.state_dict()[key] + 0.5 * other.state_dict()[key], atol=1e-6)
    assert models == {} and stats == {}


# -------------------------------------------------------------------------------------- strategy
def _params(value: float):
    return {"w": torch.full((2,), value), "steps": torch.tensor(0)}


def _train_updates(values, n=None):
    n = n or {s: 1 for s in values}
    return {s: ClientUpdate(site=s, params=_params(v), n_samples=n[s], metrics={"val_accuracy": 0.5}) for s, v in values.items()}


class FakeSites:
    """What the silos would answer: overseas copies shifted by +100 * host index; gossip via gossip_mix."""

    def __init__(self):
        self.calls = []

    def __call__(self, task, payloads):
        self.calls.append((task, {s: unpack_models(p.params) for s, p in payloads.items()}))
        out = {}
        for host, payload in payloads.items():
            main, models = unpack_models(payload.params)
            if task == "overseas_train":
                shift = 100.0 * (SITES.index(host) + 1)
                trained = {n: {"w": m["w"] + shift, "steps": m["steps"]} for n, m in models.items()}
                out[host] = ClientUpdate(site=host, params={}, n_samples=1, models=trained)
            else:
                out[host] = ClientUpdate(site=host, params=gossip_mix(main, list(models.values()), 0.5), n_samples=1)
        return out


def test_cfl_averages_and_routes_experts_to_their_owners():
    strategy = FedEFMStrategy(mode="cfl", topology="ring")
    strategy.total_rounds = 3
    strategy.start(SITES, _params(0.0))
    assert strategy.payload("a", 0).meta == {"fedefm_teachers": []}
    sites = FakeSites()
    fields = strategy.aggregate(0, _train_updates({"a": 1.0, "b": 2.0, "c": 6.0}, {"a": 1, "b": 1, "c": 2}), sites)
    # sample-weighted mean: (1 + 2 + 2 * 6) / 4
    assert torch.allclose(strategy.global_params()["w"], torch.full((2,), 3.75))
    assert fields["aggregation_weight"] == {"a": 0.25, "b": 0.25, "c": 0.5}
    # overseas: host b trains a's model (ring a -> b); a's expert comes back from b (+200)
    task, sent = sites.calls[0]
    assert task == "overseas_train" and set(sent["b"][1]) == {"guest@a"} and sent["b"][0] == {}
    payload = strategy.payload("a", 1)
    main, models = unpack_models(payload.params)
    assert payload.meta == {"fedefm_teachers": ["b"]} and set(models) == {"expert@b"}
    assert torch.allclose(models["expert@b"]["w"], torch.full((2,), 203.75))
    assert torch.allclose(main["w"], torch.full((2,), 3.75))
    # no overseas round after the last round's training
    strategy.aggregate(2, _train_updates({"a": 1.0, "b": 1.0, "c": 1.0}), sites)
    assert [t for t, _ in sites.calls] == ["overseas_train"]


def test_dfl_never_averages_during_training(monkeypatch):
    strategy = FedEFMStrategy(mode="dfl", topology="ring")
    strategy.total_rounds = 2
    strategy.start(SITES, _params(0.0))
    assert not strategy.has_global_model

    def forbidden(*args, **kwargs):
        raise AssertionError("the server averaged weights in DFL")

    monkeypatch.setattr(fedefm_strategy, "weighted_average", forbidden)
    sites = FakeSites()
    strategy.aggregate(0, _train_updates({"a": 1.0, "b": 2.0, "c": 6.0}), sites)
    gossip = dict(sites.calls)["gossip"]
    # silo a receives exactly its in-neighbour c's model; the server relays, the silo mixes
    assert set(gossip["a"][1]) == {"neighbour@c"} and torch.allclose(gossip["a"][1]["neighbour@c"]["w"], torch.full((2,), 6.0))
    assert torch.allclose(strategy.personalized_params()["a"]["w"], torch.full((2,), 3.5))  # 1/2 * 1 + 1/2 * 6
    assert torch.allclose(strategy.personalized_params()["b"]["w"], torch.full((2,), 1.5))
    monkeypatch.undo()
    # after the last round the foundation is the average of the silo models (DFL's only averaging)
    fields = strategy.finish()
    assert torch.allclose(strategy.global_params()["w"], torch.full((2,), (3.5 + 1.5 + 4.0) / 3))
    assert sum(fields["foundation_weight"].values()) == pytest.approx(1.0)


def test_strategy_options_are_checked():
    for bad in ({"mode": "p2p"}, {"topology": "star"}, {"weighting": "size"}, {"gossip_self_weight": 2.0}):
        with pytest.raises(ValueError):
            FedEFMStrategy(**bad)


def test_payload_is_weights_and_declared_scalars_only():
    """What a silo may send: weights (validated model by model) plus two short scalar lists."""
    objective = FedEFMObjective()
    assert set(objective.declared_statistics) == {"teacher_emd", "teacher_weights"}
    assert objective.declared_arrays({}) == {}


# ------------------------------------------------------------------------------ overseas training
class OneClassSilo:
    """A host silo whose every image is class ``label``: the ``engine.train`` surface the objective uses,
    a plain Adam loop on fixed random images (the classification engine is tested on its own)."""

    def __init__(self, label: int, n: int = 8, size: int = 96):
        g = torch.Generator().manual_seed(label)
        self.images = torch.rand(n, 1, size, size, generator=g)
        self.labels = torch.full((n,), label)
        self.trained = []

    def train(self, model, objective, ctx, epochs=None):
        self.trained.append(model)
        model.train()
        optimiser = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        for epoch in range(int(epochs)):
            for start in range(0, len(self.images), 4):
                x, y = self.images[start : start + 4], self.labels[start : start + 4]
                loss = objective.loss(BatchOutput(inputs=x, labels=y, logits=model(x), features={}, epoch=epoch))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        return {"train_loss": loss.item()}


def test_overseas_expert_learns_host_data():
    """theta_ij is trained on silo j's data only: at a host whose data is all class 3 it comes back
    predicting 3, while the silo's own model (and the guest as sent) are untouched."""
    torch.manual_seed(0)
    own, guest = _vit(0), _vit(1)
    own_before = {k: v.clone() for k, v in own.state_dict().items()}
    guest_sent = {k: v.clone() for k, v in guest.state_dict().items()}
    host = OneClassSilo(label=3)
    with torch.no_grad():
        before = guest(host.images).argmax(1)
    objective = FedEFMObjective(overseas_epochs=3)
    ctx = _round_ctx([], {"guest@b": {k: v.clone() for k, v in guest_sent.items()}})
    main, trained, stats = objective.handle_weight_task("overseas_train", ctx, own, engine=host)
    assert main == {} and stats == {} and set(trained) == {"guest@b"}
    assert len(host.trained) == 1 and host.trained[0] is not own  # a copy of the guest trained, not the host's model
    expert = _vit(2)
    expert.load_state_dict(trained["guest@b"])
    expert.eval()
    with torch.no_grad():
        after = expert(host.images).argmax(1)
    assert (after == 3).all(), (before.tolist(), after.tolist())
    assert not (before == 3).all()
    for k, v in own.state_dict().items():
        assert torch.equal(v, own_before[k])
    for k, v in guest_sent.items():  # the received state dict was not modified in place
        assert torch.equal(v, ctx.models["guest@b"][k])
