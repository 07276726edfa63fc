"""NVFlare's private internals fedseg relies on (fedseg.fl.nvflare_internals): all still there in the installed
NVFlare, each one that goes missing named by the guard, FedCE's private state carried across a restart through
the accessors, and no other fedseg module touching NVFlare's private API."""

from __future__ import annotations

import re
from pathlib import Path

import nvflare
import numpy as np
import pytest
import torch
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_opt.pt.fedce import FedCEModelAggregator
from nvflare.private.defs import SpecialTaskName
from nvflare.private.fed.server.server_runner import ServerRunner
from nvflare.private.fed.simulator.simulator_server import SimulatorServer
from torch import nn

from fedseg.fl import nvflare_internals
from fedseg.fl.nvflare_internals import (check_internals, fedce_contribution_weights, fedce_cosine_means,
                                         fedce_state, replace_process_task_request, restore_fedce_state,
                                         restore_process_task_request, task_request_runner)
from fedseg.strategies.base import ClientUpdate
from fedseg.strategies.fedce import FedCEStrategy

PACKAGE = Path(__file__).resolve().parents[1] / "custom" / "fedseg"


def test_every_internal_fedseg_relies_on_is_in_the_installed_nvflare():
    assert check_internals() == []


def _without_cosine_means(monkeypatch):
    built = FedCEModelAggregator.__init__

    def init(self, *args, **kwargs):
        built(self, *args, **kwargs)
        del self._cosine_means

    monkeypatch.setattr(FedCEModelAggregator, "__init__", init)


def _not_keeping_cosine_counts(monkeypatch):
    aggregate = FedCEModelAggregator.aggregate_model

    def aggregate_model(self):
        result = aggregate(self)
        self._cosine_counts = {}  # as an NVFlare that kept the counts elsewhere would leave it
        return result

    monkeypatch.setattr(FedCEModelAggregator, "aggregate_model", aggregate_model)


def _process_task_request_renamed_parameter(monkeypatch):
    monkeypatch.setattr(ServerRunner, "process_task_request", lambda self, client, ctx: None)


def _simulator_calling_something_else(monkeypatch):
    def handler(self, client, fl_ctx, shared_fl_ctx):
        return fl_ctx.get_prop(FLContextKey.RUNNER).answer(client)

    monkeypatch.setattr(SimulatorServer, "_process_task_request", handler)


BROKEN = {
    "SpecialTaskName.TRY_AGAIN": lambda mp: mp.delattr(SpecialTaskName, "TRY_AGAIN"),
    "ServerRunner.process_task_request: missing": lambda mp: mp.delattr(ServerRunner, "process_task_request"),
    "ServerRunner.process_task_request: parameters": _process_task_request_renamed_parameter,
    "SimulatorServer._process_task_request": _simulator_calling_something_else,
    "FedCEModelAggregator._cosine_means": _without_cosine_means,
    "FedCEModelAggregator._cosine_counts": _not_keeping_cosine_counts,
}


@pytest.mark.parametrize("internal", sorted(BROKEN))
def test_a_missing_internal_is_named_with_the_nvflare_version(internal, monkeypatch):
    BROKEN[internal](monkeypatch)
    problems = check_internals()
    assert len(problems) == 1, problems
    assert internal in problems[0]
    assert f"NVFlare {nvflare.__version__}" in problems[0]


# -------------------------------------------------------------------------------------------- server runner
class Runner:
    """A server runner's task-request answer: always "try again"."""

    def process_task_request(self, client, fl_ctx):
        return (nvflare_internals.TRY_AGAIN_TASK, "", None)


def test_the_task_request_handler_is_replaced_and_put_back_only_while_it_is_installed():
    runner = Runner()
    first = replace_process_task_request(runner, lambda client, fl_ctx: ("train", "t1", client))
    assert runner.process_task_request("site-1", None) == ("train", "t1", "site-1")
    assert first("site-1", None)[0] == SpecialTaskName.TRY_AGAIN  # the runner's own answer, to delegate to

    def later(client, fl_ctx):
        return ("evaluate", "t2", client)

    replace_process_task_request(runner, later)
    restore_process_task_request(runner, lambda client, fl_ctx: None, first)  # not the installed handler
    assert runner.process_task_request == later
    restore_process_task_request(runner, later, first)
    assert runner.process_task_request == first


def test_the_task_request_runner_is_the_contexts_runner_with_the_method():
    ctx = FLContext()
    assert task_request_runner(None) is None and task_request_runner(ctx) is None
    ctx.set_prop(FLContextKey.RUNNER, object(), private=True, sticky=False)
    assert task_request_runner(ctx) is None  # a runner without process_task_request
    runner = Runner()
    ctx.set_prop(FLContextKey.RUNNER, runner, private=True, sticky=False)
    assert task_request_runner(ctx) is runner


# -------------------------------------------------------------------------------------------- FedCE state
def _round(aggregator, rng, sites=("a", "b", "c")):
    aggregator.reset_stats()
    prior = fedce_contribution_weights(aggregator)
    for s in sites:
        aggregator.accept_model(FLModel(
            params={"w": rng.normal(size=(4,)).astype(np.float32)}, params_type=ParamsType.DIFF,
            meta={"client_name": s, "fedce_minus_val": float(rng.uniform(0.1, 0.9)), "props": {"fedce_coef": prior}}))
    return aggregator.aggregate_model()


def test_fedce_state_read_back_continues_the_aggregator_as_the_original():
    running = FedCEModelAggregator()
    assert fedce_state(running) == {"contribution_weights": {}, "cosine_means": {}, "cosine_counts": {}}
    _round(running, np.random.default_rng(0))
    state = fedce_state(running)
    assert state["cosine_counts"] == {"a": 1, "b": 1, "c": 1}
    assert fedce_contribution_weights(running) == state["contribution_weights"]
    assert fedce_cosine_means(running) == state["cosine_means"]
    state["cosine_counts"]["a"] = 99  # a copy: the aggregator keeps its own
    assert fedce_state(running)["cosine_counts"]["a"] == 1

    restarted = FedCEModelAggregator()
    restore_fedce_state(restarted, fedce_state(running))
    assert fedce_state(restarted) == fedce_state(running)
    expected, result = _round(running, np.random.default_rng(1)), _round(restarted, np.random.default_rng(1))
    assert result.meta["fedce_coef"] == expected.meta["fedce_coef"]
    assert np.array_equal(result.params["w"], expected.params["w"])
    assert fedce_state(restarted) == fedce_state(running)


def test_fedce_state_is_not_written_where_the_aggregator_has_no_such_attribute():
    with pytest.raises(AttributeError, match="_contribution_weights.*NVFlare"):
        restore_fedce_state(object(), {"contribution_weights": {}, "cosine_means": {}, "cosine_counts": {}})


def test_a_restarted_fedce_server_weighs_the_next_round_as_the_one_that_kept_running():
    def small():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))

    def start():
        strategy = FedCEStrategy()
        strategy.network_factory = small
        strategy.start(["a", "b", "c"], small().state_dict())
        return strategy

    rng = np.random.default_rng(5)

    def updates(glob):
        return {s: ClientUpdate(s, {k: v + torch.as_tensor(rng.normal(scale=0.1, size=v.shape), dtype=v.dtype)
                                    for k, v in glob.items()}, n_samples=4,
                                meta={"fedce_minus_val": float(rng.uniform(0.1, 0.9))}) for s in "abc"}

    running = start()
    running.aggregate(0, updates(running.global_params()), None)
    restarted = start()
    restarted.load_state_dict(running.state_dict())
    second = updates(running.global_params())
    # the cosine running means decide the weights: without them restored the restarted server would differ
    assert restarted.aggregate(1, second, None) == running.aggregate(1, second, None)


# -------------------------------------------------------------------------------------------- one place
def test_only_the_internals_module_uses_nvflares_private_api():
    private_import = re.compile(r"^\s*(from|import)\s+nvflare\.private\b", re.MULTILINE)
    private_fedce_state = re.compile(r"\.(" + "|".join(nvflare_internals.FEDCE_STATE_ATTRIBUTES.values()) + r")\b")
    offenders = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if p.name != "nvflare_internals.py"
                       and (private_import.search(p.read_text()) or private_fedce_state.search(p.read_text())))
    assert offenders == []
