"""The tiny FedAvg job in NVFlare POC mode: server + site-1..site-3 as separate processes on loopback.

Runs ``poc_workspace/run_poc.py`` (prepare -> start -> submit -> wait -> download -> verify -> stop -> clean) on a
job exported into tmp_path, then checks the report it fetched. About 1.5 minutes on 2 cores. Everything is
written under tmp_path (the POC workspace included); every process started for that workspace is killed at
the end, also when the test fails or times out.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sim_utils import exclusive

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "poc_workspace" / "run_poc.py"
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


@pytest.mark.slow
@pytest.mark.exclusive
def test_poc_runs_tiny_fedavg_across_processes(tmp_path):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", FEDSEG_NUM_THREADS="1")
    env.pop("NVFLARE_POC_WORKSPACE", None)  # the test chooses its own workspace
    jobs = tmp_path / "jobs"
    # `fedseg export` in this process (a fresh interpreter would only import torch and MONAI once more)
    from fedseg.cli import main

    main(["export", "--method", "fedavg", "--profile", "tiny", "--out", str(jobs)])
    job = jobs / "fedavg"
    assert (job / "meta.json").is_file()
    job_files = sorted(p.relative_to(job) for p in job.rglob("*"))

    workspace = tmp_path / "poc"
    out = tmp_path / "out" / "report.json"
    cmd = [
        sys.executable, str(SCRIPT),
        "--job", str(job), "--out", str(out), "--workspace", str(workspace),
        "--timeout", "240", "--start-timeout", "120",
        "--expect-method", "fedavg", "--expect-rounds", "2",
    ]
    with exclusive():  # the POC's server and sites: no shared simulator run at the same time
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output, leftovers = "", []
        try:
            try:
                output, _ = proc.communicate(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)  # run_poc.py stops and cleans the POC on SIGTERM
                try:
                    output, _ = proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    output, _ = proc.communicate()
                pytest.fail(f"run_poc.py did not finish in {RUN_TIMEOUT}s:\n{output[-8000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            # whatever run_poc.py left behind (it should be nothing): server, clients, job processes of this workspace
            leftovers = _load_run_poc().kill_poc_processes(workspace)

    assert proc.returncode == 0, f"run_poc.py failed (exit {proc.returncode}):\n{output[-8000:]}"
    assert not leftovers, f"processes left running after run_poc.py: {leftovers}\n{output[-4000:]}"
    assert not workspace.exists(), "run_poc.py did not clean the POC workspace"
    assert "verify: OK" in output
    # submitting signs a job folder in place; run_poc.py submits a copy, so the exported job is unchanged
    assert sorted(p.relative_to(job) for p in job.rglob("*")) == job_files

    report = json.loads(out.read_text())
    assert report["method"] == "fedavg"
    assert report["clients"] == SITES
    assert len(report["rounds"]) == 2
    for entry in report["rounds"]:
        assert sorted(entry["metrics"]) == SITES, entry
        for site in SITES:
            metrics = entry["metrics"][site]
            assert _finite(metrics["train_loss"]), (entry["round"], site, metrics)
            assert _finite(metrics["val_dice"]) and 0.0 <= metrics["val_dice"] <= 1.0, (entry["round"], site, metrics)
    final = report["final"]["global"]
    assert sorted(final) == SITES
    for site in SITES:
        for key in ("dice", "hd95", "assd"):
            assert _finite(final[site][key]), (site, key, final[site])
        assert 0.0 <= final[site]["dice"] <= 1.0


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
