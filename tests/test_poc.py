"""The tiny FedAvg recipe in NVFlare's PocEnv: server + site-1..site-3 as separate processes on loopback.

Runs ``python jobs/job.py fedavg --env poc`` (the recipe's ``run(PocEnv)``: NVFlare prepares the POC from a copy of
``poc_workspace/project.yml`` with free ports — its ``SitePolicyBuilder`` gives every kit fedseg's allow list —, starts
it, submits the job through the FLARE API, waits, downloads the result and stops the POC), then checks the report it
downloaded and what ``fedseg summarise`` printed for it. About 1.5 minutes on 2 cores, in the background: the run is
the shared run ``poc`` (tests/sim_utils.py), the one POC of the suite, whose kits tests/test_deploy.py reads too.
Everything is written under the run's folder (the POC workspace included, with a private HOME); every process started
for that workspace is killed at the end, also when the run fails or times out. ``poc_workspace/run_poc.py`` (a job
folder through the same POC) shares its port, process and report helpers with this test.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "poc_workspace" / "run_poc.py"
JOB_PY = REPO / "jobs" / "job.py"
SITES = ["site-1", "site-2", "site-3"]
RUN_TIMEOUT = 420  # seconds for the whole POC cycle (it normally takes ~90 s); generous for a loaded CI machine


def _load_run_poc():
    """Import poc_workspace/run_poc.py without writing __pycache__ into the repository."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec = importlib.util.spec_from_file_location("fedseg_run_poc", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.dont_write_bytecode = before


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class PocRun:
    """What ``job.py fedavg --env poc`` left: its exit status and output, the POC workspace PocEnv prepared (the kits
    under ``fedseg_poc/prod_00``), the folder the result was copied to, and whether the POC's processes were gone."""

    returncode: Optional[int]
    output: str
    workspace: Path
    result_dir: Path
    timed_out: bool
    stopped: bool
    leftovers: List[int]


def poc_run(root: Path):
    """Shared run ``poc`` (tests/sim_utils.py), the one POC of the suite: ``job.py fedavg --env poc`` with
    poc_workspace/project.yml on free loopback ports, everything under ``root`` (a private HOME included); every process
    started for its workspace is killed at the end, also after a failure or a timeout."""
    run_poc = _load_run_poc()
    project = root / "project.yml"  # poc_workspace/project.yml on free loopback ports
    run_poc.write_project_with_ports(REPO / "poc_workspace" / "project.yml", project, *run_poc.pick_free_ports(2))
    workspace = root / "poc"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", FEDSEG_NUM_THREADS="1",
               HOME=str(root / "home"), NVFLARE_POC_WORKSPACE=str(workspace))  # NVFlare's POC workspace setting
    (root / "home").mkdir()
    cmd = [sys.executable, str(JOB_PY), "fedavg", "--env", "poc", "--project", str(project), "--profile", "tiny",
           "--timeout", "300", "--result-dir", str(root / "result")]
    log = root / "job_py.log"

    def run() -> PocRun:
        timed_out = False
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                try:
                    proc.wait(timeout=RUN_TIMEOUT)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                # PocEnv stops the POC once the result is in (processes may take a few seconds to exit); whatever is
                # left after that (server, sites, job processes of this workspace) is killed
                stopped = run_poc.wait_processes_gone(workspace, None, 30.0)
                leftovers = run_poc.kill_poc_processes(workspace)
        return PocRun(proc.returncode, log.read_text(), workspace, root / "result", timed_out, stopped, leftovers)

    return run


@pytest.mark.slow
@pytest.mark.shared_runs("poc")
def test_recipe_runs_in_poc_env_across_processes(shared_runs):
    poc = shared_runs("poc")
    run_poc = _load_run_poc()
    output = poc.output
    assert not poc.timed_out, f"job.py --env poc did not finish in {RUN_TIMEOUT}s:\n{output[-8000:]}"
    assert poc.returncode == 0, f"job.py --env poc failed (exit {poc.returncode}):\n{output[-8000:]}"
    # every kit PocEnv prepared allows fedseg's components: the project file's SitePolicyBuilder wrote the list
    from fedseg.fl.component_policy import class_allow_list

    kits = poc.workspace / "fedseg_poc" / "prod_00"
    for participant in ("server", *SITES):
        resources = json.loads((kits / participant / "local" / "resources.json.default").read_text())
        assert resources["class_allow_list"] == class_allow_list()

    # the result folder the Run object downloaded (copied by --result-dir), and the report fedseg summarise printed
    (result,) = [p for p in poc.result_dir.iterdir() if p.is_dir()]
    assert f"job result: {result}" in output
    reports = list(result.rglob("report.json"))
    assert len(reports) == 1, reports
    assert "fedavg — final global model (test split)" in output and f"report:  {reports[0]}" in output
    report = json.loads(reports[0].read_text())
    assert run_poc.verify_report(report, SITES, "fedavg", 2) == []
    assert report["clients"] == SITES
    for entry in report["rounds"]:
        assert sorted(entry["metrics"]) == SITES, entry
    final = report["final"]["global"]
    for site in SITES:
        assert all(_finite(final[site][key]) for key in ("dice", "hd95", "assd")), final[site]
    assert poc.stopped and not poc.leftovers, f"processes left running 30 s after PocEnv stopped the POC: {poc.leftovers}"


def test_verify_report_flags_missing_sites():
    """The report check run_poc.py applies (fast, no processes)."""
    run_poc = _load_run_poc()
    good = {
        "method": "fedavg",
        "clients": SITES,
        "rounds": [{"round": r, "metrics": {s: {"train_loss": 0.5, "val_dice": 0.6} for s in SITES}} for r in range(2)],
        "final": {"global": {s: {"dice": 0.7, "hd95": 3.0, "assd": 1.0} for s in SITES}},
    }
    assert run_poc.verify_report(good, SITES, "fedavg", 2) == []
    bad = json.loads(json.dumps(good))
    del bad["rounds"][1]["metrics"]["site-2"]
    bad["final"]["global"]["site-3"]["dice"] = None
    problems = run_poc.verify_report(bad, SITES, "fedavg", 2)
    assert any("round 1: no metrics from site-2" in p for p in problems)
    assert any("site-3" in p and "dice" in p for p in problems)
    assert run_poc.verify_report(good, SITES + ["site-4"]) != []
