#!/usr/bin/env python
"""Run one exported fedseg job end to end in NVFlare POC mode: server + 3 sites as separate processes on loopback.

    python poc_workspace/run_poc.py --job jobs/fedavg --out runs/poc/report.json

Steps (every one logged with a timestamp):
  1. prepare  ``nvflare poc prepare -i <project.yml> --force`` into the POC workspace
              (--workspace / $NVFLARE_POC_WORKSPACE / a fresh temp dir; never inside the repository),
              with free loopback ports patched into a copy of ``poc_workspace/project.yml``;
  2. start    ``nvflare poc start --no-wait`` (server + clients, no admin console), then wait through the
              Flare API until the server answers and every site is connected (retried with new ports on a
              port clash);
  3. submit   the job folder with the Flare API (the same as ``nvflare job submit -j <job>``);
  4. wait     until the job is finished (``--timeout``), printing the server's round summaries;
  5. fetch    ``download_job_result`` (= ``nvflare job download``), copy ``report.json`` to ``--out``
              (and the whole downloaded result to ``--result-dir`` if given);
  6. verify   the report: the expected clients, metrics of every site in every round, final.global per site;
  7. stop     ALWAYS, also on failure or Ctrl-C: ``nvflare poc stop``, then any process still tagged with
              this POC workspace is killed;
  8. clean    ``nvflare poc clean`` and removal of the temp dirs (skipped with --keep-workspace).

The nvflare CLI runs with a private $HOME (so ~/.nvflare of the user and of parallel runs is never touched)
and the started processes get OMP_NUM_THREADS=1 / FEDSEG_NUM_THREADS=1 so four torch processes share a
small machine. Exit status: 0 on success, 1 on any failure (with the reason and the tails of the logs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from fedseg.processes import StopOnSignal

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_PROJECT = HERE / "project.yml"
DEFAULT_JOB = REPO / "jobs" / "fedavg"
DEFAULT_OUT = REPO / "runs" / "poc" / "report.json"

WORKSPACE_ENV = "NVFLARE_POC_WORKSPACE"
RUN_TAG_ENV = "FEDSEG_POC_RUN"
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "FEDSEG_NUM_THREADS": "1",
}
PORT_RANGE = (20000, 31999)  # below the usual ephemeral range (32768-60999): outgoing sockets don't take them
BIND_ERRORS = ("address already in use", "errno 98", "failed to bind", "port is not available")


class PocError(RuntimeError):
    """A step of the POC cycle failed; the message says which and why."""


class PortClash(PocError):
    """The server could not bind its ports (another process took them): retry with new ones."""


def log(msg: str) -> None:
    print(f"[run_poc {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------- ports


def _port_free(port: int) -> bool:
    """True if ``port`` can be bound on every address the NVFlare server listens on (0.0.0.0 and ::)."""
    families = [(socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, host in families:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((host, port))
        except OSError as e:
            if family == socket.AF_INET6 and e.errno in (getattr(os, "EAFNOSUPPORT", 97), 99):
                continue  # no IPv6 on this machine
            return False
    return True


def pick_free_ports(count: int = 2, port_range=PORT_RANGE, exclude: Iterable[int] = ()) -> List[int]:
    """``count`` distinct ports, random in ``port_range`` (so parallel runs rarely pick the same), all free now."""
    rng = random.Random(uuid.uuid4().int)
    excluded = set(exclude)
    ports: List[int] = []
    for _ in range(2000):
        port = rng.randint(*port_range)
        if port in excluded or port in ports:
            continue
        if _port_free(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise PocError(f"could not find {count} free loopback ports in {port_range}")


# ------------------------------------------------------------------------------------------------ project


def load_project(path: os.PathLike) -> Dict[str, Any]:
    import yaml

    project = yaml.safe_load(Path(path).read_text())
    if not isinstance(project, dict) or not isinstance(project.get("participants"), list):
        raise PocError(f"{path} is not an NVFlare project file (no participants list)")
    return project


def project_roles(project: Dict[str, Any]) -> Dict[str, Any]:
    parts = project["participants"]
    servers = [p["name"] for p in parts if p.get("type") == "server"]
    clients = [p["name"] for p in parts if p.get("type") == "client"]
    admins = [p["name"] for p in parts if p.get("type") == "admin" and p.get("role") == "project_admin"]
    if len(servers) != 1 or len(admins) != 1 or not clients:
        raise PocError("the project file needs exactly one server, one project_admin and at least one client")
    name = project.get("name", "example_project")
    return {"name": name, "server": servers[0], "clients": clients, "admin": admins[0]}


def write_project_with_ports(
    src: os.PathLike, dst: os.PathLike, fed_learn_port: int, admin_port: int
) -> Dict[str, Any]:
    import yaml

    project = load_project(src)
    for p in project["participants"]:
        if p.get("type") == "server":
            p["fed_learn_port"] = int(fed_learn_port)
            p["admin_port"] = int(admin_port)
    Path(dst).write_text(yaml.safe_dump(project, sort_keys=False))
    return project


def prod_dir(workspace: Path, project_name: str) -> Path:
    """``<workspace>/<project>/prod_NN`` with the highest NN (what ``nvflare poc`` uses)."""
    base = workspace / project_name
    prods = sorted(
        (p for p in base.glob("prod_*") if p.name.split("_")[-1].isdigit()), key=lambda p: int(p.name.split("_")[-1])
    )
    return prods[-1] if prods else base / "prod_00"


# ---------------------------------------------------------------------------------------------- processes


def _proc_entries() -> Iterable[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _protected_pids() -> set:
    """This process and its ancestors (never killed, even if their environment matches)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
        try:
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            break
    return pids


def find_poc_processes(workspace: os.PathLike, run_tag: Optional[str] = None) -> List[int]:
    """PIDs of processes started for this POC workspace.

    Every process ``nvflare poc start`` launches (daemon shell loops, server, clients, and the job processes
    they spawn in their own sessions) inherits the environment we gave it, so they carry
    ``NVFLARE_POC_WORKSPACE=<workspace>`` (and ``FEDSEG_POC_RUN=<tag>``); processes whose command line names
    the workspace are matched too. Linux /proc only; elsewhere returns [].
    """
    if not os.path.isdir("/proc"):
        return []
    ws = str(Path(workspace).resolve())
    needles = [f"{WORKSPACE_ENV}={ws}".encode()]
    if run_tag:
        needles.append(f"{RUN_TAG_ENV}={run_tag}".encode())
    ws_bytes = (ws.rstrip("/") + "/").encode()
    protected = _protected_pids()
    found = []
    for pid in _proc_entries():
        if pid in protected:
            continue
        env = _read(f"/proc/{pid}/environ").split(b"\0")
        cmdline = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ") + b" "
        if any(n in env for n in needles) or ws_bytes in cmdline or ws.encode() + b" " in cmdline:
            found.append(pid)
    return found


def kill_poc_processes(workspace: os.PathLike, run_tag: Optional[str] = None, grace: float = 5.0) -> List[int]:
    """SIGTERM, then SIGKILL after ``grace`` s, every process of this POC workspace; returns the PIDs hit.

    Daemon loops (``sub_start.sh``) restart a killed server/client, so every round signals the whole set at once
    and rescans until nothing is left."""
    hit: List[int] = []
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    for _ in range(50):
        pids = find_poc_processes(workspace, run_tag)
        if not pids:
            break
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        for pid in pids:
            try:
                os.kill(pid, sig)
                hit.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.5 if sig == signal.SIGTERM else 0.2)
    return sorted(set(hit))


def wait_processes_gone(workspace: Path, run_tag: Optional[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not find_poc_processes(workspace, run_tag):
            return True
        time.sleep(1.0)
    return not find_poc_processes(workspace, run_tag)


# ------------------------------------------------------------------------------------------------ report


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def verify_report(
    report: Dict[str, Any],
    clients: List[str],
    method: Optional[str] = None,
    rounds: Optional[int] = None,
) -> List[str]:
    """Problems found in ``report`` (empty list = valid): clients, per-round metrics of every site, final.global."""
    problems = []
    if method is not None and report.get("method") != method:
        problems.append(f"method is {report.get('method')!r}, expected {method!r}")
    if sorted(report.get("clients") or []) != sorted(clients):
        problems.append(f"clients are {report.get('clients')}, expected {sorted(clients)}")
    report_rounds = report.get("rounds") or []
    if not report_rounds:
        problems.append("no rounds in the report")
    if rounds is not None and len(report_rounds) != rounds:
        problems.append(f"{len(report_rounds)} rounds, expected {rounds}")
    for entry in report_rounds:
        metrics = entry.get("metrics") or {}
        for site in clients:
            m = metrics.get(site)
            if not m:
                problems.append(f"round {entry.get('round')}: no metrics from {site}")
                continue
            for key in ("train_loss", "val_dice"):
                if not _finite(m.get(key)):
                    problems.append(f"round {entry.get('round')}: {site} {key}={m.get(key)!r} is not a finite number")
    final = (report.get("final") or {}).get("global") or {}
    for site in clients:
        m = final.get(site)
        if not m:
            problems.append(f"final.global has no results for {site}")
            continue
        for key in ("dice", "hd95", "assd"):
            if key not in m:
                problems.append(f"final.global[{site}] lacks {key}")
        if not _finite(m.get("dice")):
            problems.append(f"final.global[{site}].dice={m.get('dice')!r} is not a finite number")
    return problems


# --------------------------------------------------------------------------------------------------- POC


class PocRun:
    """One prepare -> start -> submit -> wait -> download -> stop -> clean cycle (use as a context manager)."""

    def __init__(
        self,
        workspace: Optional[os.PathLike] = None,
        project: os.PathLike = DEFAULT_PROJECT,
        keep_workspace: bool = False,
        start_timeout: float = 180.0,
        stop_timeout: float = 60.0,
        port_attempts: int = 3,
        logger: Callable[[str], None] = log,
    ):
        self.log = logger
        self.project_src = Path(project).resolve()
        self.keep_workspace = keep_workspace
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port_attempts = port_attempts
        self.run_tag = uuid.uuid4().hex
        self.roles = project_roles(load_project(self.project_src))
        if workspace:
            self.workspace = Path(workspace).resolve()
            self._check_workspace()
        self.aux = Path(tempfile.mkdtemp(prefix="fedseg_poc_"))  # private HOME, project copy, CLI logs, download
        if not workspace:
            self.workspace = self.aux / "poc"
        self.home = self.aux / "home"
        self.home.mkdir()
        self.cli_logs = self.aux / "cli_logs"
        self.cli_logs.mkdir()
        self.ports: List[int] = []
        self.started = False
        self.session = None
        self._cli_count = 0

    # ---- environment / CLI

    def _check_workspace(self) -> None:
        ws = self.workspace
        try:
            ws.relative_to(REPO)
            inside = True
        except ValueError:
            inside = False
        if inside:
            raise PocError(f"POC workspace {ws} is inside the repository {REPO}; choose a directory outside it")
        if ws.exists() and any(ws.iterdir()) and not (ws / "project.yml").is_file():
            raise PocError(
                f"POC workspace {ws} exists, is not empty and is not a POC workspace; "
                "`nvflare poc prepare --force` would delete it, so choose another directory"
            )

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.pop("NVFL_WORKSPACE", None)  # would make every site's start.sh use the same workspace
        env.update(THREAD_ENV)
        env.update(
            {
                "HOME": str(self.home),  # nvflare keeps ~/.nvflare/config.conf (startup-kit registry) in HOME
                WORKSPACE_ENV: str(self.workspace),
                RUN_TAG_ENV: self.run_tag,
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
                "MPLBACKEND": "Agg",
            }
        )
        bindir = os.path.dirname(sys.executable)  # the started processes use this interpreter (python3 on PATH)
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
        return env

    def nvflare(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``nvflare <args>`` with this run's environment; output goes to a log file (tail shown on error)."""
        self._cli_count += 1
        out = self.cli_logs / f"{self._cli_count:02d}_{'_'.join(a.strip('-') for a in args[:2])}.log"
        cmd = [sys.executable, "-m", "nvflare.cli", *args]
        with open(out, "w") as f, open(os.devnull) as devnull:
            try:
                proc = subprocess.run(
                    cmd, env=self.env(), cwd=str(self.aux), stdin=devnull, stdout=f, stderr=subprocess.STDOUT,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                raise PocError(f"`nvflare {' '.join(args)}` did not finish in {timeout:.0f}s (log: {out})")
        if check and proc.returncode != 0:
            tail = "\n".join(out.read_text(errors="replace").splitlines()[-25:])
            raise PocError(f"`nvflare {' '.join(args)}` failed with exit code {proc.returncode}:\n{tail}")
        return proc

    @property
    def prod(self) -> Path:
        return prod_dir(self.workspace, self.roles["name"])

    @property
    def admin_dir(self) -> Path:
        return self.prod / self.roles["admin"]

    # ---- steps

    def prepare(self) -> None:
        exclude = set(self.ports)
        self.ports = pick_free_ports(2, exclude=exclude)
        project = self.aux / "project.yml"  # outside the workspace: prepare --force deletes the workspace
        write_project_with_ports(self.project_src, project, *self.ports)
        self.log(
            f"prepare: POC workspace {self.workspace} (server ports {self.ports[0]} fed-learn, {self.ports[1]} admin; "
            f"sites {', '.join(self.roles['clients'])})"
        )
        self.nvflare("poc", "prepare", "-i", str(project), "--force", timeout=180)
        if not self.admin_dir.is_dir():
            raise PocError(f"prepare did not create the admin startup kit {self.admin_dir}")

    def start(self) -> None:
        for attempt in range(1, self.port_attempts + 1):
            if attempt > 1:
                self.prepare()
            self.log("start: nvflare poc start --no-wait (server + clients, no admin console)")
            self.started = True
            self.nvflare("poc", "start", "--no-wait", timeout=120)
            try:
                self.wait_ready()
                return
            except PortClash as e:
                self.log(f"start: {e}; stopping and retrying with other ports ({attempt}/{self.port_attempts})")
                self._close_session()
                self.kill_all()
                if attempt == self.port_attempts:
                    raise

    def _server_logs_text(self) -> str:
        server = self.prod / self.roles["server"]
        files = [server / "log.txt", server / "poc_console.log"]
        return "\n".join(f.read_text(errors="replace") for f in files if f.is_file()).lower()

    def wait_ready(self) -> None:
        """Block until the server accepts an admin session and lists every site as connected."""
        from nvflare.fuel.flare_api.flare_api import new_secure_session

        expected = set(self.roles["clients"])
        deadline = time.monotonic() + self.start_timeout
        last, connected = "server not reachable yet", set()
        while time.monotonic() < deadline:
            if any(e in self._server_logs_text() for e in BIND_ERRORS):
                raise PortClash(f"the server could not bind port {self.ports[0]} or {self.ports[1]}")
            try:
                if self.session is None:
                    connect_timeout = min(10.0, max(1.0, deadline - time.monotonic()))
                    self.session = new_secure_session(self.roles["admin"], str(self.admin_dir), timeout=connect_timeout)
                connected = {c.name for c in self.session.get_system_info().client_info}
                if expected <= connected:
                    self.log(f"start: server up, sites connected: {', '.join(sorted(connected))}")
                    return
                last = f"sites connected: {sorted(connected)}, waiting for {sorted(expected - connected)}"
            except Exception as e:  # NoConnection while the server boots, or a dropped session
                last = f"{type(e).__name__}: {e}"
                self._close_session()
            time.sleep(2.0)
        raise PocError(f"the POC system was not ready within {self.start_timeout:.0f}s ({last})")

    def submit(self, job: os.PathLike) -> str:
        job = Path(job).resolve()
        if not (job / "meta.json").is_file():
            raise PocError(f"{job} is not an NVFlare job folder (no meta.json); export one with `fedseg export`")
        # the Flare API signs the folder it submits in place (.__nvfl_sig.json / .__nvfl_submitter.crt in every
        # directory): submit a copy, so the caller's job folder (e.g. the committed jobs/) is left untouched
        staged = self.aux / "submit" / job.name
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(job, staged)
        job_id = self.session.submit_job(str(staged))
        self.log(f"submit: {job} (a copy) -> job {job_id}  (= nvflare job submit -j {job})")
        return job_id

    def wait_job(self, job_id: str, timeout: float) -> Dict[str, Any]:
        """Poll the job until it is finished; print the server's per-round summaries as they appear."""
        from nvflare.fuel.flare_api.flare_api import MonitorReturnCode

        seen = {"status": None, "lines": 0}
        job_log = self.prod / self.roles["server"] / job_id / "log.txt"

        def progress(_session, _job_id, meta, *a, **kw) -> bool:
            status = meta.get("status")
            if status != seen["status"]:
                self.log(f"wait: job {job_id} {status}")
                seen["status"] = status
            if job_log.is_file():
                lines = job_log.read_text(errors="replace").splitlines()
                for line in lines[seen["lines"] :]:
                    if ("round " in line and " done:" in line) or "report written" in line:
                        self.log("  server: " + line.split(" - ")[-1].strip())
                seen["lines"] = len(lines)
            return True

        rc, meta = self.session.monitor_job_and_return_job_meta(job_id, timeout=timeout, poll_interval=3.0, cb=progress)
        if rc == MonitorReturnCode.TIMEOUT:
            try:
                self.session.abort_job(job_id)
            except Exception:
                pass
            raise PocError(f"job {job_id} did not finish within {timeout:.0f}s (aborted)")
        status = (meta or {}).get("status")
        self.log(f"wait: job {job_id} finished with status {status}")
        if status != "FINISHED:COMPLETED":
            raise PocError(f"job {job_id} ended with status {status} (see the server and site logs below)")
        return meta

    def run_job(self, job: os.PathLike, timeout: float) -> Tuple[str, Path]:
        """Prepare and start the POC, submit ``job``, wait until it finished and download its result: ``(job id,
        result folder)``."""
        self.prepare()
        self.start()
        job_id = self.submit(job)
        self.wait_job(job_id, timeout)
        return job_id, self.download(job_id)

    def download(self, job_id: str) -> Path:
        dest = self.aux / "result"
        location = self.session.download_job_result(job_id, destination=str(dest))
        if not location or not Path(location).is_dir():
            raise PocError(f"download of job {job_id} returned no folder ({location!r})")
        self.log(f"download: job result in {location}  (= nvflare job download {job_id})")
        return Path(location)

    # ---- teardown

    def _close_session(self) -> None:
        if self.session is not None:
            try:
                self.session.close()
            except Exception:
                pass
            self.session = None

    def kill_all(self) -> None:
        pids = kill_poc_processes(self.workspace, self.run_tag)
        if pids:
            self.log(f"stop: killed leftover processes {pids}")

    def stop(self) -> None:
        """Graceful ``nvflare poc stop``; then kill whatever still runs for this workspace."""
        self._close_session()
        if not self.started:
            self.kill_all()
            return
        t0 = time.monotonic()
        try:
            self.log("stop: nvflare poc stop")
            self.nvflare("poc", "stop", timeout=self.stop_timeout)
            remaining = max(5.0, self.stop_timeout - (time.monotonic() - t0))
            if not wait_processes_gone(self.workspace, self.run_tag, min(remaining, 20.0)):
                self.log("stop: processes still running after the graceful stop")
        except BaseException as e:  # also Ctrl-C / SIGTERM during the graceful stop: fall through to the kill
            why = (str(e) or type(e).__name__).splitlines()[0]
            self.log(f"stop: graceful stop failed ({why}); killing the processes")
        finally:
            self.kill_all()
        self.started = False
        self.log(f"stop: done in {time.monotonic() - t0:.0f}s")

    def clean(self) -> None:
        if self.keep_workspace:
            self.log(f"clean: skipped (--keep-workspace); POC workspace kept at {self.workspace}, aux at {self.aux}")
            return
        if (self.workspace / "project.yml").is_file():
            try:
                self.nvflare("poc", "clean", timeout=60)
            except Exception as e:
                self.log(f"clean: nvflare poc clean failed ({str(e).splitlines()[0]}); removing the folder")
        shutil.rmtree(self.workspace, ignore_errors=True)
        shutil.rmtree(self.aux, ignore_errors=True)
        self.log("clean: POC workspace and temp files removed")

    def log_tails(self, lines: int = 30) -> str:
        """Tails of the server/site logs (and of the server's job log), for failure messages."""
        chunks = []
        participants = [self.roles["server"], *self.roles["clients"]]
        candidates = [self.prod / p / name for p in participants for name in ("log.txt", "poc_console.log")]
        candidates += sorted((self.prod / self.roles["server"]).glob("*/log.txt"))
        candidates += sorted(p for c in self.roles["clients"] for p in (self.prod / c).glob("*/log.txt"))
        candidates += sorted(self.cli_logs.glob("*.log"))
        for path in candidates:
            if path.is_file():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"----- {path} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(chunks)

    def __enter__(self) -> "PocRun":
        return self

    def __exit__(self, *exc) -> None:
        try:  # a second SIGTERM must not cut the teardown short (SIGKILL still does)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass
        try:
            self.stop()
        finally:
            self.clean()


def run(
    job: os.PathLike,
    out: os.PathLike,
    workspace: Optional[os.PathLike] = None,
    project: os.PathLike = DEFAULT_PROJECT,
    timeout: float = 1800.0,
    start_timeout: float = 180.0,
    result_dir: Optional[os.PathLike] = None,
    keep_workspace: bool = False,
    expect_method: Optional[str] = None,
    expect_rounds: Optional[int] = None,
) -> Dict[str, Any]:
    """The whole POC cycle; returns the verified report (raises PocError on failure, always stops and cleans)."""
    t0 = time.monotonic()
    job = Path(job).resolve()
    if not (job / "meta.json").is_file():
        raise PocError(f"{job} is not an NVFlare job folder (no meta.json); export one with `fedseg export`")
    with PocRun(workspace, project, keep_workspace=keep_workspace, start_timeout=start_timeout) as poc:
        try:
            job_id, result = poc.run_job(job, timeout)
            reports = sorted(result.rglob("report.json"), key=lambda p: (p.parent.name != "workspace", len(p.parts)))
            if not reports:
                raise PocError(f"the job result {result} has no report.json")
            out = Path(out).resolve()
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(reports[0], out)
            log(f"fetch: {reports[0].relative_to(result.parent)} -> {out}")
            if result_dir:
                dst = Path(result_dir).resolve() / job_id
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(result, dst)
                log(f"fetch: whole job result copied to {dst}")
            report = json.loads(out.read_text())
            problems = verify_report(report, poc.roles["clients"], expect_method, expect_rounds)
            if problems:
                raise PocError("report.json failed verification:\n  " + "\n  ".join(problems))
            log(
                f"verify: OK - method {report.get('method')}, clients {report.get('clients')}, "
                f"{len(report.get('rounds') or [])} rounds, final.global for every site"
            )
            for site, m in sorted(((report.get("final") or {}).get("global") or {}).items()):
                log(f"  {site}: dice {m.get('dice')}, hd95 {m.get('hd95')}, assd {m.get('assd')}")
        except BaseException as e:
            if not isinstance(e, KeyboardInterrupt):
                print(poc.log_tails(), file=sys.stderr, flush=True)
            raise
    log(f"done in {time.monotonic() - t0:.0f}s")
    return report


# SIGTERM / Ctrl-C: every POC process is ended, then the POC run unwinds (`finally` stops and cleans the POC)
@StopOnSignal("run_poc", unwind_s=120.0)
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default=str(DEFAULT_JOB), help="exported NVFlare job folder (default: jobs/fedavg)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="report.json copied here (default: runs/poc/report.json)")
    parser.add_argument(
        "--workspace", default=os.environ.get(WORKSPACE_ENV),
        help=f"POC workspace dir (default: ${WORKSPACE_ENV}, else a new temp dir); must be outside the repository, "
        "it is wiped by prepare and removed by clean",
    )
    parser.add_argument("--project", default=str(DEFAULT_PROJECT), help="project file (default: poc_workspace/project.yml)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the job may run (default 1800)")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds for server + sites to connect")
    parser.add_argument("--result-dir", default=None, help="also copy the whole downloaded job result here")
    parser.add_argument(
        "--keep-workspace", action="store_true", help="stop the processes but keep the workspace (logs, site data)"
    )
    parser.add_argument("--expect-method", default=None, help="fail unless report.json has this method")
    parser.add_argument("--expect-rounds", type=int, default=None, help="fail unless report.json has this many rounds")
    args = parser.parse_args(argv)

    try:
        run(
            args.job, args.out, workspace=args.workspace, project=args.project, timeout=args.timeout,
            start_timeout=args.start_timeout, result_dir=args.result_dir, keep_workspace=args.keep_workspace,
            expect_method=args.expect_method, expect_rounds=args.expect_rounds,
        )
    except PocError as e:
        print(f"run_poc: FAILED: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:  # Flare API errors etc.
        print(f"run_poc: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
