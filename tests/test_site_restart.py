"""A site that dies or hangs: the task timeout ends the round without it; a restarted site resumes its state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedseg.config import BASE_TRAIN_CONFIG, TASK_TIMEOUT_RANGE, default_task_timeout, resolve_profile
from fedseg.fl.controller import FedSegController
from fedseg.recipes import available_methods

JOBS = Path(__file__).resolve().parents[1] / "jobs"


# ------------------------------------------------------------------------------------ task timeout
@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({}, 300),  # 64 px, 1 epoch
        ({"local_epochs": 3, "image_size": 32}, 900),  # smaller images take no less than the 64 px floor
        ({"local_epochs": 2, "image_size": 384}, 300 * 2 * 36),
        ({"image_size": 512, "spatial_mode": "patch", "patch_size": 128}, 300 * 4),  # patches, not images
        ({"local_epochs": 50, "image_size": 1024}, TASK_TIMEOUT_RANGE[1]),  # capped at a day
    ],
)
def test_default_task_timeout_by_hand(overrides, expected):
    assert default_task_timeout({**BASE_TRAIN_CONFIG, **overrides}) == expected


def test_default_task_timeout_of_the_profiles():
    assert default_task_timeout(resolve_profile("tiny")["train_config"]) == 900
    assert default_task_timeout(resolve_profile("default")["train_config"]) == 300


@pytest.mark.parametrize("key, bad", [("local_epochs", 0), ("image_size", "64"), ("patch_size", 2.5), ("local_epochs", True)])
def test_default_task_timeout_names_a_bad_value(key, bad):
    with pytest.raises(ValueError, match=key):
        default_task_timeout({**BASE_TRAIN_CONFIG, key: bad})


def test_controller_never_waits_for_ever_unless_told():
    tiny = resolve_profile("tiny")["train_config"]
    assert FedSegController(train_config=tiny).task_timeout == 900
    assert FedSegController(train_config=tiny, task_timeout=0).task_timeout == 0
    with pytest.raises(ValueError, match="task_timeout"):
        FedSegController(train_config=tiny, task_timeout=-1)
    with pytest.raises(ValueError, match="absolute"):
        FedSegController(train_config=tiny, checkpoint_dir="relative/ckpt")


@pytest.mark.parametrize("method", available_methods())
def test_exported_jobs_carry_the_default_timeout(method):
    config = json.loads((JOBS / method / "app" / "config" / "config_fed_server.json").read_text())
    (controller,) = [w["args"] for w in config["workflows"] if w["path"].endswith("FedSegController")]
    assert controller["task_timeout"] == default_task_timeout(controller["train_config"]) > 0


# ------------------------------------------------------------------------------------ site restart
import argparse  # noqa: E402

import torch  # noqa: E402

from fedseg.engine.site_state import STATE_FILE, SiteState, job_key  # noqa: E402
from fedseg.fl.client import SiteRunner  # noqa: E402
from fedseg.fl.protocol import META_KEY, TRAIN_TASK  # noqa: E402
from fedseg.recipes.base import build_initial_network  # noqa: E402


@pytest.fixture(scope="module")
def site_config(tiny_train_config):
    # no augmentation: a restarted site must then reproduce the uninterrupted site bit for bit
    return {**tiny_train_config, "augment": False, "local_epochs": 1}


def _meta(cfg, round_: int, total: int = 4):
    return {META_KEY: {"method": "fedavg", "objective": "fedavg", "objective_args": {}, "train_config": cfg,
                       "round": round_, "total_rounds": total}}


def _runner(workspace, datalist):
    args = argparse.Namespace(datalist=str(datalist), site_datalists=None, data_root=None, bundle_dir=None)
    return SiteRunner("site-a", args, workspace=str(workspace))


def _train(runner, cfg, round_: int, global_params):
    return runner.handle(TRAIN_TASK, {k: v.clone() for k, v in global_params.items()}, _meta(cfg, round_))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_datalist, site_config):
    """One site process training rounds 0, 1, 2 from the same global model."""
    workspace = tmp_path_factory.mktemp("site_ref")
    global_params = build_initial_network(site_config).state_dict()
    runner = _runner(workspace, tiny_datalist)
    outs = [_train(runner, site_config, r, global_params) for r in range(3)]
    return workspace, global_params, outs, runner


def _same_params(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def test_restarted_site_continues_as_if_it_never_stopped(tmp_path, tiny_datalist, site_config, uninterrupted):
    _, global_params, reference, ref_runner = uninterrupted
    first = _runner(tmp_path, tiny_datalist)
    for r in range(2):
        assert _same_params(_train(first, site_config, r, global_params)["params"], reference[r]["params"])
    del first  # the site process dies after round 1

    restarted = _runner(tmp_path, tiny_datalist)
    out = _train(restarted, site_config, 2, global_params)
    assert out["metrics"]["state_restored_from_round"] == 1.0
    assert _same_params(out["params"], reference[2]["params"])
    # Adam moments and step counts equal the uninterrupted process's
    mine = restarted.engine.make_optimizer(restarted.model).state_dict()["state"]
    theirs = ref_runner.engine.make_optimizer(ref_runner.model).state_dict()["state"]
    assert mine.keys() == theirs.keys()
    for i in mine:
        assert all(torch.equal(mine[i][k], theirs[i][k]) for k in ("step", "exp_avg", "exp_avg_sq")), i


def test_without_the_saved_state_the_restarted_site_would_differ(tmp_path, tiny_datalist, site_config, uninterrupted):
    """The check above can fail: a fresh Adam (what a restart gave before site_state) trains differently."""
    _, global_params, reference, _ = uninterrupted
    first = _runner(tmp_path, tiny_datalist)
    for r in range(2):
        _train(first, site_config, r, global_params)
    for f in (tmp_path / "fedseg_state" / "site-a").glob(STATE_FILE.format(round="*")):
        f.unlink()
    out = _train(_runner(tmp_path, tiny_datalist), site_config, 2, global_params)
    assert "state_restored_from_round" not in out["metrics"]
    assert not _same_params(out["params"], reference[2]["params"])


def test_a_round_trained_before_the_crash_is_not_counted_twice(tiny_datalist, site_config, uninterrupted):
    """The server resends round 2 (it never got the answer): the site trains it from its state after round 1."""
    workspace, global_params, reference, _ = uninterrupted
    again = _train(_runner(workspace, tiny_datalist), site_config, 2, global_params)
    assert again["metrics"]["state_restored_from_round"] == 1.0
    assert _same_params(again["params"], reference[2]["params"])


def test_site_state_is_not_used_by_round_zero_or_another_job(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    generator = torch.Generator().manual_seed(3)
    SiteState(tmp_path, job_key("fedavg", {}, {"seed": 0})).save(4, optimizer, generator)

    def fresh():
        return torch.optim.Adam(torch.nn.Linear(3, 2).parameters()), torch.Generator()

    assert SiteState(tmp_path, job_key("fedavg", {}, {"seed": 0})).restore(0, *fresh()) is None  # a new job
    assert SiteState(tmp_path, job_key("fedavg", {}, {"seed": 1})).restore(5, *fresh()) is None  # another config
    assert SiteState(tmp_path, job_key("fedavg", {}, {"seed": 0})).restore(4, *fresh()) is None  # only rounds < 4
    opt, gen = fresh()
    state = SiteState(tmp_path, job_key("fedavg", {}, {"seed": 0}))
    assert state.restore(5, opt, gen) == 4 and int(opt.state_dict()["state"][0]["step"]) == 1
    assert torch.equal(gen.get_state(), generator.get_state())
    assert state.restore(6, opt, gen) is None  # once per process
    # a damaged file: a warning and a fresh optimiser, not a dead site
    (tmp_path / STATE_FILE.format(round=4)).write_bytes(b"garbage")
    assert SiteState(tmp_path, job_key("fedavg", {}, {"seed": 0})).restore(5, *fresh()) is None


def test_site_state_keeps_the_last_two_rounds(tmp_path):
    optimizer = torch.optim.Adam(torch.nn.Linear(2, 1).parameters())
    state = SiteState(tmp_path, "k")
    for r in (0, 1, 2, 3):
        state.save(r, optimizer, torch.Generator())
    assert state.rounds() == [2, 3]
    assert [torch.load(state.path(r), weights_only=True)["round"] for r in (2, 3)] == [2, 3]
    # a re-run of round 2 drops the after-state of round 3 (it is about to be redone)
    state.save(2, optimizer, torch.Generator())
    assert state.rounds() == [2]


# ------------------------------------------------------------------------- poc_workspace/fault_poc.py
import importlib.util  # noqa: E402
import sys  # noqa: E402


def _fault_poc():
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec = importlib.util.spec_from_file_location("fedseg_fault_poc", JOBS.parent / "poc_workspace" / "fault_poc.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.dont_write_bytecode = before


def test_fault_poc_arguments():
    fault_poc = _fault_poc()
    args = fault_poc.parse_args(["--site-fault", "hang", "--task-timeout", "30"])
    assert (args.site_fault, args.fault_site, args.fault_round, args.rounds, args.hang_seconds) == ("hang", "site-2", 1, 4, 40.0)
    assert fault_poc.parse_args(["--server-fault", "kill", "--fault-round", "2"]).server_fault == "kill"
    for bad in (
        [],  # a fault is required
        ["--site-fault", "hang", "--server-fault", "kill"],  # one at a time
        ["--site-fault", "explode"],
        ["--site-fault", "kill", "--fault-round", "4"],  # no later round to come back in
        ["--site-fault", "kill", "--fault-round", "0"],
        ["--site-fault", "kill", "--fault-site", "site-9"],
        ["--site-fault", "kill", "--task-timeout", "0"],
    ):
        with pytest.raises(SystemExit):
            fault_poc.parse_args(bad)


def test_fault_poc_finds_the_processes_of_a_participant():
    classify = _fault_poc().classify
    site2 = "python3 -u -m nvflare.private.fed.app.client.client_train -m /tmp/poc/fedseg_poc/prod_00/site-2 -s fed_client.json"
    job2 = "python -m nvflare.private.fed.app.client.worker_process -m /tmp/poc/fedseg_poc/prod_00/site-2 -w ..."
    server = "python3 -u -m nvflare.private.fed.app.server.server_train -m /tmp/poc/fedseg_poc/prod_00/server -s fed_server.json"
    assert classify(site2, "site-2") == "site" and classify(job2, "site-2") == "site_job"
    assert classify(site2, "site-1") is None and classify(site2.replace("site-2", "site-20"), "site-2") is None
    assert classify(server, None) == "server" and classify("bash sub_start.sh", None) is None


def test_fault_poc_verdicts():
    fault_poc = _fault_poc()
    sites = ["site-1", "site-2", "site-3"]
    rounds = [
        {"round": 0, "metrics": {s: {} for s in sites}, "missing": []},
        {"round": 1, "metrics": {"site-1": {}, "site-3": {}}, "missing": ["site-2"]},
        {"round": 2, "metrics": {s: ({"state_restored_from_round": 0.0} if s == "site-2" else {}) for s in sites}, "missing": []},
    ]
    ok = fault_poc.check_site_fault({"clients": sites, "rounds": rounds}, "site-2", 1, 3)
    assert all(passed for passed, _ in ok), ok
    never_back = rounds[:2] + [{"round": 2, "metrics": {"site-1": {}, "site-3": {}}, "missing": ["site-2"]}]
    verdict = fault_poc.check_site_fault({"clients": sites, "rounds": never_back}, "site-2", 1, 3)
    assert [what for passed, what in verdict if not passed] == ["site-2 never came back"]
    twice = fault_poc.check_server_fault({"rounds": rounds + [rounds[2]], "resumed_at": [2]}, 1, 3)
    assert [passed for passed, _ in twice] == [False, True]
