"""A server step for every method (``fedseg.strategies.server_step``).

References, each independent of the code under test: the method run through its own ``aggregate`` (the step off is
the method as it was, bit for bit); Hsu et al.'s FedAvgM heavy-ball recursion written out by hand in float64 (every
method on identical sites aggregates to the sites' model, so with the step it must follow that recursion); torch's
Adam on the negated update; the same strategy run without interruption (checkpoint resume).
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch

from fedseg.fl.protocol import unpack_models
from fedseg.networks.unet import FeatureUNet
from fedseg.strategies import ClientUpdate
from fedseg.strategies.server_step import ServerStep, ServerStepConfig, server_step_config

from test_checkpoint import CASES, SITES, TINY, FakeSites, _new, _through_file, assert_same

#: the five methods (FedEFM in its CFL mode: DFL has no global model), and FedRep (the step on the shared entries only)
#: the cases of the checkpoint tests (FedRep's global_params draws its head afresh: not comparable bit for bit)
CHECKPOINT_CASES = sorted(CASES)
STEPPED = ["fedavg", "fedevi", "graphfedseg", "pathfl", "fedefm-cfl", "fedrep"]
CASES = {**CASES, "fedrep": lambda: ("fedrep", {}, lambda seed: FeatureUNet(**TINY, init_seed=seed, feature_alignment=True).state_dict())}


def _network():
    return FeatureUNet(**TINY, feature_alignment=True)


def _attach(strategy, config: ServerStepConfig, initial) -> None:
    """The controller's wiring: the step on the job's network, after ``start`` (the small test model is no
    network: a module with its parameters stands in)."""
    network = _network()
    if set(network.state_dict()) != set(initial):
        network = _ParamsModule(initial)
    strategy.attach_server_step(ServerStep(config, network))


class _ParamsModule(torch.nn.Module):
    """A module whose parameters are ``params``' float entries named as in the state dict, buffers the rest."""

    def __init__(self, params: Dict[str, torch.Tensor]):
        super().__init__()
        self._names = {}
        for i, (k, v) in enumerate(params.items()):
            if v.is_floating_point() and "running" not in k:
                self.register_parameter(f"p{i}", torch.nn.Parameter(v.clone()))
                self._names[f"p{i}"] = k

    def named_parameters(self, *args, **kwargs):  # the state dict's names
        for name, p in super().named_parameters(*args, **kwargs):
            yield self._names[name], p

    def state_dict(self, *args, **kwargs):
        return {self._names[k]: v for k, v in super().state_dict(*args, **kwargs).items()}


def _round(strategy, sites: FakeSites, round_: int, step: bool, log: List[Any]) -> None:
    sites.round = round_
    payloads = {s: strategy.payload(s, round_) for s in SITES}
    updates = sites.train(payloads)
    fields = strategy.aggregate_round(round_, updates, sites) if step else strategy.aggregate(round_, updates, sites)
    log.append((payloads, fields, {k: v.clone() for k, v in strategy.global_params().items()}))


# ------------------------------------------------------------------------------- step off: as before
@pytest.mark.parametrize("case", CHECKPOINT_CASES)
def test_without_a_step_every_method_is_bit_for_bit_its_own_aggregation(case):
    name, options, make_model = CASES[case]()
    logs = []
    for step in (False, True):  # aggregate_round without a step attached vs the method's aggregate
        strategy, log = _new(name, options, make_model(0)), []
        assert strategy.server_step is None
        sites = FakeSites(name)
        for r in range(3):
            _round(strategy, sites, r, step, log)
        logs.append((log, strategy.finish(), strategy.state_dict()))
    assert_same(logs[1], logs[0], case)
    assert "server_step" not in logs[0][2]


# ----------------------------------------------------------------- heavy ball on identical sites, by hand
def _identical_updates(strategy, sites: FakeSites, round_: int, shift: float) -> Dict[str, ClientUpdate]:
    """Every site returns the model it was sent plus the same ``shift`` on every float entry (with the method's
    declared statistics from ``FakeSites``)."""
    sites.round = round_
    payloads = {s: strategy.payload(s, round_) for s in SITES}
    updates = sites.train(payloads)
    for s in SITES:
        main, _ = unpack_models(payloads[s].params)
        updates[s].params = {k: (v + shift if v.is_floating_point() else v.clone()) for k, v in main.items()}
        updates[s].n_samples = 10
    return updates


@pytest.mark.parametrize("case", STEPPED)
def test_momentum_on_identical_sites_is_fedavgm_heavy_ball_by_hand(case):
    name, options, make_model = CASES[case]()
    initial = make_model(0)
    strategy = _new(name, options, initial)
    _attach(strategy, ServerStepConfig("sgd-momentum", lr=0.8, momentum=0.6), initial)
    stepped = dict(strategy.server_step.generator.model.named_parameters())
    shared = strategy.shared_keys() or list(strategy.global_params())  # FedRep: its head never reaches the server
    w = {k: v.double().clone() for k, v in strategy.global_params().items() if k in stepped and k in shared}
    velocity = {k: torch.zeros_like(v) for k, v in w.items()}
    sites = FakeSites(name)
    for round_, shift in enumerate((0.05, -0.02, 0.03, 0.01)):
        updates = _identical_updates(strategy, sites, round_, shift)
        sent = {k: v.double() for k, v in unpack_models(strategy.payload(SITES[0], round_).params)[0].items()}
        fields = strategy.aggregate_round(round_, updates, sites)
        glob = strategy.global_params()
        for k in w:
            # the sites train from the stepped model; each returns it + shift, and any convex aggregation of
            # identical models is that model: the round's update is ``shift``
            assert torch.allclose(sent[k], w[k], atol=1e-5), (case, round_, k)
            delta = torch.full_like(w[k], shift)
            velocity[k] = 0.6 * velocity[k] + delta
            w[k] = w[k] + 0.8 * velocity[k]
            assert torch.allclose(glob[k].double(), w[k], atol=1e-5), (case, round_, k)
        assert fields["server_lr"] == 0.8 and fields["server_update_norm"] > 0
        # buffers are not stepped: the aggregation's own values
        for k, v in glob.items():
            if k not in stepped and v.is_floating_point() and "running" in k:
                assert torch.allclose(v.double(), sent[k] + shift, atol=1e-5), (case, k)
    # after two rounds the momentum has moved the model off the sites' model
    assert not torch.allclose(glob[next(iter(w))].double(), sent[next(iter(w))] + 0.01, atol=1e-4)


def test_adam_step_is_torch_adam_on_the_negated_update_of_the_method():
    name, options, make_model = CASES["graphfedseg"]()
    initial = make_model(0)
    strategy = _new(name, options, initial)
    _attach(strategy, ServerStepConfig("adam", lr=0.05, betas=(0.9, 0.99), eps=1e-3), initial)
    names = dict(strategy.server_step.generator.model.named_parameters())
    reference = {k: v.clone().requires_grad_(True) for k, v in strategy.global_params().items() if k in names}
    adam = torch.optim.Adam(list(reference.values()), lr=0.05, betas=(0.9, 0.99), eps=1e-3)
    twin = _new(name, options, initial)  # the same method without the step: its proposed model each round
    sites, twin_sites = FakeSites(name), FakeSites(name)
    for round_ in range(3):
        previous = {k: v.clone() for k, v in strategy.global_params().items()}
        sites.round = twin_sites.round = round_
        updates = sites.train({s: strategy.payload(s, round_) for s in SITES})
        # the twin aggregates the same updates from the same previous model: the method's proposal
        twin.load_state_dict(_without_step(strategy.state_dict()))
        twin.aggregate(round_, updates, twin_sites)
        proposed = twin.global_params()
        strategy.aggregate_round(round_, updates, sites)
        adam.zero_grad()
        for k, p in reference.items():
            p.grad = -(proposed[k] - previous[k])
        adam.step()
        for k, p in reference.items():
            assert torch.allclose(strategy.global_params()[k], p.detach(), atol=1e-6), (round_, k)
        # GraphFedSeg's personalised models are the aggregation's, untouched by the step
        assert_same(strategy.personalized_params(), twin.personalized_params(), "personal")


def _without_step(state: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in state.items() if k != "server_step"}


# --------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("case", ["fedevi", "graphfedseg", "fedefm-cfl"])
@pytest.mark.parametrize("optimizer", ["sgd-momentum", "adam"])
def test_restored_strategy_with_a_step_continues_bit_identically(case, optimizer):
    name, options, make_model = CASES[case]()
    config = ServerStepConfig(optimizer, lr=0.9 if optimizer != "adam" else 0.02)
    reference = _new(name, options, make_model(0))
    _attach(reference, config, make_model(0))
    sites, log, state = FakeSites(name), [], None
    for r in range(3):
        _round(reference, sites, r, True, log)
        if r == 1:
            state = _through_file(reference.state_dict())
    restored = _new(name, options, make_model(99))
    _attach(restored, config, make_model(99))
    restored.load_state_dict(state)
    restored_log = log[:2]
    sites = FakeSites(name)
    _round(restored, sites, 2, True, restored_log)
    assert_same(restored_log, log, case)
    assert_same(restored.state_dict(), reference.state_dict(), "state")


def test_checkpoint_of_another_server_step_is_refused():
    name, options, make_model = CASES["fedavg"]()
    with_step = _new(name, options, make_model(0))
    _attach(with_step, ServerStepConfig("sgd-momentum"), make_model(0))
    without = _new(name, options, make_model(0))
    with pytest.raises(ValueError, match="server step"):
        without.load_state_dict(with_step.state_dict())
    with pytest.raises(ValueError, match="server step"):
        with_step.load_state_dict(without.state_dict())
    other = _new(name, options, make_model(0))
    _attach(other, ServerStepConfig("sgd-momentum", momentum=0.9), make_model(0))
    with pytest.raises(ValueError, match="server step"):
        other.load_state_dict(with_step.state_dict())


# ------------------------------------------------------------------------------ options and wiring
def test_options_and_clear_errors():
    assert server_step_config("none") is None
    assert server_step_config("sgd-momentum", 1.0, 0.6).as_dict() == {
        "server_optimizer": "sgd-momentum", "server_lr": 1.0, "server_momentum": 0.6}
    assert server_step_config("adam", 0.01).as_dict()["server_betas"] == [0.9, 0.99]
    for bad, match in (({"server_optimizer": "sgd-nesterov"}, "server_optimizer"),
                       ({"server_optimizer": "adam", "server_lr": 0}, "server_lr"),
                       ({"server_optimizer": "sgd-momentum", "server_momentum": 1.0}, "momentum"),
                       ({"server_optimizer": "adam", "server_betas": (0.9,)}, "betas")):
        with pytest.raises(ValueError, match=match):
            server_step_config(**bad)
    # FedEFM's DFL has no global model to step
    name, options, make_model = CASES["fedefm-dfl"]()
    with pytest.raises(ValueError, match="no global model"):
        _new(name, options, make_model(0)).attach_server_step(ServerStep(ServerStepConfig(), _network()))


def test_recipes_carry_the_step_into_the_job_and_refuse_a_second_one(tmp_path):
    import json

    from fedseg.fl.controller import FedSegController
    from fedseg.recipes.export import export_job

    job = export_job("fedevi", tmp_path, "tiny", server_optimizer="adam", server_lr=0.01)
    server = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    (args,) = [w["args"] for w in server["workflows"] if w["path"].endswith("FedSegController")]
    assert args["server_step"] == {"server_optimizer": "adam", "server_lr": 0.01, "server_betas": [0.9, 0.99],
                                   "server_eps": 0.001}
    plain = export_job("fedevi", tmp_path / "plain", "tiny")
    assert "server_step" not in (plain / "app" / "config" / "config_fed_server.json").read_text()
    with pytest.raises(ValueError, match="its own options"):
        FedSegController(method="fedavgm", strategy="fedopt", strategy_args={"server_optimizer": "sgd"},
                         server_step={"server_optimizer": "sgd-momentum"})
    with pytest.raises(ValueError, match="server_optimizer"):
        export_job("graphfedseg", tmp_path, "tiny", server_optimizer="momentum")


def test_a_job_with_a_step_runs_and_reports_it(tmp_path):
    """The real server workflow in process (tiny built-in polyp, two sites, two rounds): GraphFedSeg with server
    momentum; the report names the step and each round's update norm."""
    from inprocess import builtin_sites, run_in_process

    sites = builtin_sites("polyp", ["site-1", "site-2"], tmp_path / "data")
    report = run_in_process("graphfedseg", sites, tmp_path / "run", num_rounds=2, server_optimizer="sgd-momentum",
                            solver="closed_form")
    assert report["config"]["server_step"] == {"server_optimizer": "sgd-momentum", "server_lr": 1.0, "server_momentum": 0.6}
    assert all(r["server_update_norm"] > 0 and r["server_lr"] == 1.0 for r in report["rounds"])
    assert report["final"]["global"], "the stepped global model is evaluated"
