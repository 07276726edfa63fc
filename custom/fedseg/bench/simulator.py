"""Run an exported NVFlare job in the simulator and read what it wrote (shared by ``fedseg bench`` and
``benchmarks/cost/framework_overhead.py``)."""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fedseg.fl.component_policy import prepare_simulator_workspace
from fedseg.processes import name_process, raise_if_stopping

logger = logging.getLogger(__name__)


def patch_job(job_dir: Path, task_request_interval: Optional[float] = None,
              task_fetch_interval: Optional[float] = None) -> None:
    """Add NVFlare server/client timing settings to an exported job (in place).

    Args:
        job_dir: exported job folder.
        task_request_interval: the server's ``task_request_interval`` (seconds), or None to keep the job's.
        task_fetch_interval: the clients' ``default_task_fetch_interval`` (seconds), or None to keep it.
    """
    if task_request_interval is not None:
        for cfg in Path(job_dir).rglob("config_fed_server.json"):
            data = json.loads(cfg.read_text())
            data.setdefault("server", {})["task_request_interval"] = float(task_request_interval)
            cfg.write_text(json.dumps(data, indent=4))
    if task_fetch_interval is not None:
        for cfg in Path(job_dir).rglob("config_fed_client.json"):
            data = json.loads(cfg.read_text())
            data["default_task_fetch_interval"] = float(task_fetch_interval)
            cfg.write_text(json.dumps(data, indent=4))

#: what a site process that could not start writes to its log: NVFlare's simulator picks a free port for each site's
#: connection to its parent and binds it later, so another process can take it in between (seen on busy machines)
SITE_START_FAILURE = "Address already in use"


def failed_site_start(workspace: Path) -> Optional[str]:
    """The first site of a running simulator whose process died at start on a taken port (its log says
    :data:`SITE_START_FAILURE`), else None."""
    for log in sorted(Path(workspace).glob("*/log.txt")):
        if log.parent.name == "server":
            continue
        try:
            if SITE_START_FAILURE in log.read_text(errors="replace"):
                return log.parent.name
        except OSError:
            continue
    return None


def run_simulator_command(cmd: Sequence[str], workspace: Path, env: Dict[str, str], timeout: float,
                          retries: int = 2, poll_s: float = 1.0) -> subprocess.CompletedProcess:
    """Run an ``nvflare simulator`` command in a fresh ``workspace`` (its component allow list written first).

    A site process that dies at start on a taken port (:func:`failed_site_start`) leaves the job waiting for its
    tasks until the task timeout; the run is stopped at once instead and started again in a fresh workspace, at
    most ``retries`` times. A run that exits with an error saying :data:`SITE_START_FAILURE` (the server's port
    was taken) is started again the same way. Any other failure is the caller's to judge (the completed process
    is returned).

    Raises:
        subprocess.TimeoutExpired: the command ran past ``timeout`` seconds (it is killed).
        RuntimeError: a site failed to start on every try.
    """
    workspace = Path(workspace)
    for attempt in range(retries + 1):
        if workspace.exists():
            shutil.rmtree(workspace)
        prepare_simulator_workspace(workspace)  # jobs carry no code: the simulated sites allow fedseg's components
        raise_if_stopping()  # a thread of a command being stopped starts no simulator
        deadline = time.monotonic() + timeout
        proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        name_process(proc.pid, f"the simulator of {workspace.name}")
        failed = None
        while True:
            try:
                out, err = proc.communicate(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                failed = failed_site_start(workspace)
                if failed or time.monotonic() > deadline:
                    os.killpg(proc.pid, signal.SIGKILL)
                    out, err = proc.communicate()
                    if not failed:
                        raise subprocess.TimeoutExpired(cmd, timeout, out, err)
                    break
        if not failed and proc.returncode != 0 and SITE_START_FAILURE in out + err:
            failed = "server"  # the server's port was taken between its pick and its bind: the run never started
        if not failed:
            return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
        logger.warning("simulator: %s could not start (%s); starting the run again (try %d of %d)",
                       failed, SITE_START_FAILURE, attempt + 2, retries + 1)
    raise RuntimeError(f"simulator: a site could not start on {retries + 1} tries ({SITE_START_FAILURE}): {' '.join(cmd)}")


def run_simulator(job_dir: Path, workspace: Path, sites: Sequence[str], threads: Optional[int] = None,
                  omp_threads: Optional[str] = "1", timeout: int = 3600, log_path: Optional[Path] = None,
                  fedseg_threads: Optional[str] = None, gpu: Optional[str] = None) -> Dict[str, Any]:
    """Run ``nvflare simulator`` on ``job_dir`` with clients ``sites``; returns the report plus timings.

    Args:
        job_dir: exported job folder.
        workspace: simulator workspace (``-w``); removed first. Site ``s`` runs in ``workspace/s``.
        sites: client names (``-c``).
        threads: simulator threads (``-t``); default one per site.
        omp_threads: OMP_NUM_THREADS for the simulator and its site processes, or None / "default"
            to leave it unset.
        timeout: seconds before the simulator is killed.
        log_path: where the simulator's stdout + stderr are written.
        fedseg_threads: FEDSEG_NUM_THREADS (torch threads per site process), or None to inherit.
        gpu: the simulator's ``-gpu`` option (e.g. ``"0"``: every site on GPU 0), or None.

    Returns:
        ``{"report", "report_path", "total_wall_s", "command"}``.

    Raises:
        RuntimeError: the simulator failed or wrote no ``report.json``.
    """
    workspace = Path(workspace)  # emptied and prepared by run_simulator_command
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if omp_threads not in (None, "", "default"):
        env["OMP_NUM_THREADS"] = str(omp_threads)
    if fedseg_threads not in (None, "", "default"):
        env["FEDSEG_NUM_THREADS"] = str(fedseg_threads)
    cmd = ["nvflare", "simulator", str(job_dir), "-w", str(workspace), "-t", str(threads or len(sites)),
           "-c", ",".join(sites)] + (["-gpu", str(gpu)] if gpu is not None else [])
    started = time.perf_counter()
    proc = run_simulator_command(cmd, workspace, env, timeout)
    elapsed = time.perf_counter() - started
    log = proc.stdout + proc.stderr
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(log)
    reports = sorted(workspace.rglob("report.json"))
    if proc.returncode != 0 or not reports:
        raise RuntimeError(f"simulator failed (rc={proc.returncode}, reports={reports}): {' '.join(cmd)}\n{log[-4000:]}")
    report = json.loads(reports[0].read_text())
    return {"report": report, "report_path": str(reports[0]), "total_wall_s": elapsed, "command": " ".join(cmd)}


def round_timings(report: Dict[str, Any]) -> List[Dict[str, float]]:
    """Per round of ``report.json``: ``wall``, ``max_compute`` / ``sum_compute`` over sites of
    ``compute_time`` (the train task's site work), ``overhead = wall - max_compute``, ``tasks`` (task kinds the
    round sent: train plus a method's extra exchanges) and ``bytes_up`` / ``bytes_down`` (all sites)."""
    rows = []
    for r in report.get("rounds", []):
        computes = [float(m["compute_time"]) for m in r.get("metrics", {}).values() if m.get("compute_time") is not None]
        wall = float(r.get("wall_time") or 0.0)
        row = {"round": int(r["round"]), "wall": wall, "tasks": len(r.get("task_times") or {}) or 1,
               "bytes_up": float(r.get("bytes_received") or 0), "bytes_down": float(r.get("bytes_sent") or 0)}
        if computes:
            row.update(max_compute=max(computes), sum_compute=sum(computes), overhead=wall - max(computes))
        rows.append(row)
    return rows


def median_task_breakdown(rounds: List[Dict[str, Any]], skip_first: int = 1) -> Dict[str, Dict[str, float]]:
    """``{task: {deliver, site, return, total, framework}}``: medians over rounds of report.json's per-round
    ``task_breakdown`` (first ``skip_first`` warm-up rounds left out when there are more); framework =
    deliver + return, the framework's fixed cost per task (``fedseg.fl.task_clock``)."""
    use = rounds[skip_first:] if len(rounds) > skip_first else rounds
    out: Dict[str, Dict[str, float]] = {}
    for task in sorted({t for r in use for t in (r.get("task_breakdown") or {})}):
        parts = [r["task_breakdown"][task] for r in use if task in (r.get("task_breakdown") or {})]
        row = {k: statistics.median(p[k] for p in parts if k in p) for k in ("deliver", "site", "return", "total")
               if any(k in p for p in parts)}
        if "deliver" in row and "return" in row:
            row["framework"] = row["deliver"] + row["return"]
        out[task] = row
    return out


def load_average() -> Optional[List[float]]:
    """The machine's 1-, 5- and 15-minute load averages now, or None where the platform keeps none."""
    try:
        return list(os.getloadavg())
    except OSError:  # pragma: no cover
        return None


def machine_info() -> Dict[str, Any]:
    """What a benchmark record names as its machine: platform, CPU count, Python and torch versions, the GPUs torch
    sees (names; empty list on a CPU-only machine) and the load average at the call (:func:`load_average`: call it
    before the timed work, whose load would otherwise be in it). A script adds what only it knows (``device``: the
    device it measured; ``torch_threads``)."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "gpus": gpus, "loadavg_at_start": load_average()}
