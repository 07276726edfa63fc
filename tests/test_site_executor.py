"""The native site executor (``fedseg.fl.site_executor.FedSegSiteExecutor``).

* called directly: it answers a task name no method has with a clear error result (not a hang, not an
  exception into NVFlare), and trains like ``SiteRunner`` does;
* in NVFlare's simulator: every task type of every method (train, evaluate, FedEvi's evaluate_surrogate,
  FedEFM's overseas_train and gossip) through the native executor gives the same run as the Client API path
  (``site_executor="client_api"``) for a fixed seed.
"""

from __future__ import annotations

import pytest
import torch
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import ReservedKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from fedseg.fl.protocol import EVALUATE_TASK, META_KEY
from fedseg.fl.site_executor import FedSegSiteExecutor
from fedseg.recipes.base import SiteScript, build_initial_network


def _job_meta(cfg, round_=0, total=2):
    return {META_KEY: {"method": "fedavg", "objective": "fedavg", "objective_args": {}, "train_config": cfg,
                       "round": round_, "total_rounds": total}}


@pytest.fixture()
def started(tmp_path, monkeypatch, tiny_datalist):
    monkeypatch.chdir(tmp_path)  # the site workspace (NVFlare runs a site in its workspace folder)
    executor = FedSegSiteExecutor(f"--datalist {tiny_datalist}")
    ctx = FLContext()
    ctx.set_prop(ReservedKey.IDENTITY_NAME, "site-a", private=False, sticky=True)
    executor.handle_event(EventType.START_RUN, ctx)
    return executor, ctx


def _task(params, meta, round_=0):
    return FLModelUtils.to_shareable(FLModel(params=params, params_type=ParamsType.FULL, meta=meta, current_round=round_))


def test_unknown_task_gets_a_clear_error_result(started, tiny_train_config):
    executor, ctx = started
    reply = executor.execute("no_such_task", _task({}, _job_meta(tiny_train_config)), ctx, Signal())
    assert reply.get_return_code() == ReturnCode.OK  # an answer the server reads, with the reason
    answer = FLModelUtils.from_shareable(reply)
    assert answer.meta["error"] == "UnknownTaskError" and not answer.params and not answer.metrics


def test_unstarted_executor_and_unreadable_task_data_are_refused(tiny_datalist, tiny_train_config):
    executor = FedSegSiteExecutor(f"--datalist {tiny_datalist}")
    reply = executor.execute(EVALUATE_TASK, _task({}, _job_meta(tiny_train_config)), FLContext(), Signal())
    assert reply.get_return_code() == ReturnCode.EXECUTION_EXCEPTION


def test_bad_site_options_fail_when_the_job_is_built():
    with pytest.raises(SystemExit):
        FedSegSiteExecutor("--no_such_option x")
    with pytest.raises(ValueError, match="site_executor"):
        SiteScript("", "grpc_magic")


def test_evaluate_through_the_executor(started, tiny_train_config):
    executor, ctx = started
    params = build_initial_network(tiny_train_config).state_dict()
    reply = executor.execute(EVALUATE_TASK, _task(params, _job_meta(tiny_train_config)), ctx, Signal())
    answer = FLModelUtils.from_shareable(reply)
    assert set(answer.metrics) == {"dice", "hd95", "assd"} and not answer.params


#: every task type some method sends: train + evaluate + evaluate_surrogate (FedEvi; FedAvg's tasks are the first
#: two), overseas_train + gossip (FedEFM DFL); each case is a pair of shared runs (tests/README.md,
#: sim_utils.SHARED_RUNS) that differ only in the executor: fixed seed, no augmentation
TASK_TYPE_CASES = {
    "fedevi": ("fedevi", "fedevi_client_api"),  # 3 sites, 2 rounds, vessel patches
    "fedefm": ("fedefm_dfl", "fedefm_dfl_client_api"),  # 3 sites, 2 rounds, ring gossip with EMD teacher weights
}

#: site timings differ between runs; everything else a site reports must not
_TIMING = {"compute_time", "peak_memory_mb"}


def _numbers(tree):
    """Flatten a report sub-tree to {path: float} for the numbers in it (timings left out)."""
    out = {}

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                if k not in _TIMING:
                    walk(v, f"{path}/{k}")
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            out[path] = float(node)

    walk(tree, "")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.shared_runs(*TASK_TYPE_CASES[m])) for m in sorted(TASK_TYPE_CASES)])
def test_native_and_client_api_paths_give_the_same_run(shared_runs, method):
    """Every task type, both executors, fixed seed, no augmentation: the same site metrics, the same
    method fields in the report and the same saved model, to float tolerance."""
    reports, models = {}, {}
    for executor, name in zip(("native", "client_api"), TASK_TYPE_CASES[method]):
        run = shared_runs(name)
        assert run.spec.method == method and run.spec.options.get("site_executor", "native") == executor
        for r in run.report["rounds"]:
            assert r["missing"] == [] and r["rejected"] == {}, (executor, r)
        reports[executor] = run.report
        models[executor] = run.global_model()["model"]
    native, client_api = reports["native"], reports["client_api"]
    # every task type the method sends was answered on both paths
    assert [sorted(r["task_times"]) for r in native["rounds"]] == [sorted(r["task_times"]) for r in client_api["rounds"]]
    skip = {"wall_time", "server_cpu_time", "task_times", "task_breakdown", "server_peak_memory_mb", "screening"}
    for a, b in zip(native["rounds"], client_api["rounds"]):
        na, nb = (_numbers({k: v for k, v in r.items() if k not in skip}) for r in (a, b))
        assert na.keys() == nb.keys()
        for key in na:
            assert na[key] == pytest.approx(nb[key], rel=1e-4, abs=1e-5), (method, a["round"], key)
    fa, fb = _numbers(native["final"]), _numbers(client_api["final"])
    assert fa.keys() == fb.keys() and all(fa[k] == pytest.approx(fb[k], rel=1e-4, abs=1e-5) for k in fa), method
    initial = build_initial_network(native["config"]["train_config"]).state_dict()
    assert models["native"].keys() == models["client_api"].keys()
    assert any(not torch.allclose(torch.as_tensor(models["native"][k]), initial[k]) for k in initial), "nothing trained"
    for k in models["native"]:
        assert torch.allclose(torch.as_tensor(models["native"][k]), torch.as_tensor(models["client_api"][k]), atol=1e-5), k
