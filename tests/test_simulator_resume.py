"""Server restart in NVFlare's simulator: kill the whole simulator after round 1 of 4, run the same job again.

The second run starts in a fresh workspace (as a re-submitted job gets a fresh run directory) with the
same ``checkpoint_dir``; it must continue at the round after the checkpoint's, and its report must hold
every round once, the first ones exactly as the checkpoint recorded them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch

from fedseg.cli import export_job
from fedseg.fl.checkpoint import CHECKPOINT_NAME
from fedseg.fl.component_policy import prepare_simulator_workspace
from sim_utils import SIMULATOR_ENV, exclusive, run_simulator

pytestmark = [pytest.mark.slow, pytest.mark.exclusive]

SITES = ["site-1", "site-2"]
ROUNDS = 4


def _checkpoint(folder):
    path = folder / CHECKPOINT_NAME
    return torch.load(path, weights_only=True) if path.is_file() else None


def _run_until_checkpoint(job, workspace, folder, stop_after: int, timeout: float = 300.0) -> None:
    """Start the simulator and SIGKILL it (server, sites, everything) once round ``stop_after`` is checkpointed."""
    prepare_simulator_workspace(workspace)
    cmd = ["nvflare", "simulator", str(job), "-w", str(workspace), "-n", str(len(SITES)), "-t", str(len(SITES))]
    proc = subprocess.Popen(
        cmd, env={**os.environ, **SIMULATOR_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                state = _checkpoint(folder)
            except Exception:  # a reader may meet the file between two replaces on some filesystems
                state = None
            if state is not None and state["completed_round"] >= stop_after:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"no checkpoint of round {stop_after} within {timeout}s (simulator rc={proc.poll()})")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_killed_simulator_resumes_from_its_checkpoint(tmp_path):
    folder = tmp_path / "persistent"
    job = export_job("fedevi", tmp_path / "jobs", profile="tiny", num_rounds=ROUNDS, checkpoint_dir=str(folder), local_epochs=1)

    with exclusive():  # this simulator is started (and killed) here, not by run_simulator
        _run_until_checkpoint(job, tmp_path / "ws1", folder, stop_after=1)
    before = _checkpoint(folder)
    done = before["completed_round"]
    assert 1 <= done < ROUNDS - 1, f"killed too late (checkpoint after round {done}): nothing left to resume"

    report = run_simulator(job, tmp_path / "ws2", n_clients=len(SITES))
    assert report["resumed_at"] == [done + 1]
    assert [r["round"] for r in report["rounds"]] == list(range(ROUNDS))
    # the rounds before the crash are the checkpoint's, unchanged
    assert report["rounds"][: done + 1] == before["report"]["rounds"]
    # FedEvi's weights carried over: the first resumed round starts from the checkpoint's beta
    beta = before["strategy"]["beta"]
    assert report["rounds"][done + 1]["beta_prev"] == pytest.approx({s: beta[s] / sum(beta.values()) for s in SITES})
    for r in report["rounds"][done + 1 :]:
        assert r["missing"] == [] and set(r["metrics"]) == set(SITES)
    assert "resuming from" in report["_log"]

    # the model the job ends with is the last checkpoint's, and the persistor saved that one
    after = _checkpoint(folder)
    assert after["completed_round"] == ROUNDS - 1 and after["report"]["resumed_at"] == [done + 1]
    saved = next((tmp_path / "ws2").rglob("FL_global_model.pt"))
    model = torch.load(saved, map_location="cpu", weights_only=False)["model"]
    for key, value in after["global"].items():
        assert torch.equal(torch.as_tensor(model[key]), value), key
    assert set(report["final"]["global"]) == set(SITES)
