"""Server restart in NVFlare's simulator: kill the whole simulator after round 1 of 4, run the same job again.

The second run starts in a fresh workspace (as a re-submitted job gets a fresh run directory) with the
same ``checkpoint_dir``; it must continue at the round after the checkpoint's, and its report must hold
every round once, the first ones exactly as the checkpoint recorded them. Both simulators run in the background as
the shared run ``resume`` (tests/sim_utils.py); the test reads what they left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch

from fedseg.fl.checkpoint import CHECKPOINT_NAME
from fedseg.fl.component_policy import prepare_simulator_workspace

import sim_fork
from sim_utils import run_simulator, simulator_args, simulator_env

pytestmark = [pytest.mark.slow, pytest.mark.shared_runs("resume")]

SITES = ["site-1", "site-2"]
ROUNDS = 4


def _checkpoint(folder):
    path = folder / CHECKPOINT_NAME
    return torch.load(path, weights_only=True) if path.is_file() else None


def _run_until_checkpoint(job, workspace, folder, stop_after: int, timeout: float = 300.0) -> None:
    """Start the simulator and SIGKILL it (server, sites, everything) once round ``stop_after`` is checkpointed."""
    prepare_simulator_workspace(workspace)
    sim = sim_fork.Simulator(simulator_args(job, workspace, len(SITES)), workspace.with_name(workspace.name + ".log"),
                             simulator_env())
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and sim.poll() is None:
            try:
                state = _checkpoint(folder)
            except Exception:  # a reader may meet the file between two replaces on some filesystems
                state = None
            if state is not None and state["completed_round"] >= stop_after:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"no checkpoint of round {stop_after} within {timeout}s (simulator rc={sim.poll()})")
    finally:
        sim.kill()


@dataclass
class Resumed:
    """What the killed run and the resumed one left: the checkpoint at the kill, the resumed run's report, the last
    checkpoint and the model the resumed run's persistor saved."""

    before: Dict
    report: Dict
    after: Optional[Dict]
    saved_model: Dict


def resume_run(root: Path):
    """Shared run ``resume`` (tests/sim_utils.py): FedEvi, 2 sites, 4 rounds, a persistent checkpoint folder; the
    simulator is killed once round 1 is checkpointed, then the same job runs again in a fresh workspace."""
    from fedseg.recipes.export import export_job

    folder = root / "persistent"
    job = export_job("fedevi", root / "jobs", profile="tiny", num_rounds=ROUNDS, checkpoint_dir=str(folder), local_epochs=1)

    def run() -> Resumed:
        _run_until_checkpoint(job, root / "ws1", folder, stop_after=1)
        before = _checkpoint(folder)
        report = run_simulator(job, root / "ws2", n_clients=len(SITES))
        saved = next((root / "ws2").rglob("FL_global_model.pt"))
        return Resumed(before, report, _checkpoint(folder), torch.load(saved, map_location="cpu", weights_only=False))

    return run


def test_killed_simulator_resumes_from_its_checkpoint(shared_runs):
    run = shared_runs("resume")
    before, report = run.before, run.report
    done = before["completed_round"]
    assert 1 <= done < ROUNDS - 1, f"killed too late (checkpoint after round {done}): nothing left to resume"

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
    after = run.after
    assert after["completed_round"] == ROUNDS - 1 and after["report"]["resumed_at"] == [done + 1]
    model = run.saved_model["model"]
    for key, value in after["global"].items():
        assert torch.equal(torch.as_tensor(model[key]), value), key
    assert set(report["final"]["global"]) == set(SITES)
