#!/usr/bin/env python
"""Inject a process fault into a real POC job (server + 3 sites as separate processes) and check what happened.

    python poc_workspace/fault_poc.py --site-fault kill            # SIGKILL site-2 while it trains round 1
    python poc_workspace/fault_poc.py --site-fault hang            # SIGSTOP site-2 while it trains round 1
    python poc_workspace/fault_poc.py --server-fault kill          # SIGKILL the server after round 1, restart, re-submit

The job is exported here (``--method``, tiny profile, ``--rounds`` rounds, ``--task-timeout`` seconds, a
``checkpoint_dir`` in the run's temp folder), then run with ``run_poc.PocRun`` (prepare, start, submit; always
stop and clean). The fault is injected when the server's job log says round ``--fault-round - 1`` is done,
i.e. while the sites train round ``--fault-round``:

  * site ``kill``: SIGKILL the site's client process and its job process (a crashed machine). NVFlare's POC
    daemon loop (``sub_start.sh``) starts the client again, as a service manager would. NVFlare 2.9 does
    not start a running job again on a restarted client, so once the round in progress has finished
    without the site, the job is aborted and re-submitted: it resumes from ``round_checkpoint.pt`` with
    every site, and the restarted site continues from its saved state (``fedseg.engine.site_state``);
  * site ``hang``: SIGSTOP the site's job process (a hung GPU driver, a frozen VM); SIGCONT after
    ``--hang-seconds`` (default: the task timeout + 10 s), so it comes back after the server gave up on it;
  * server ``kill``: SIGKILL the server and its job process; start the server again
    (``nvflare poc start -p server``), wait for the sites, re-submit the same job: it resumes from
    ``round_checkpoint.pt``.

Checks (PASS/FAIL per line, exit status 0 only if all pass):
  site faults: the job finishes; the faulty site is ``missing`` in round ``--fault-round`` and the round
  finished with the others; no round is missing in the report; a later round has the site back, with its
  metrics (``state_restored_from_round`` when the process restarted) — or a FAIL saying it never came back.
  server fault: the re-submitted job finishes; report.json has every round exactly once and ``resumed_at``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from fedseg.processes import StopOnSignal

HERE = Path(__file__).resolve().parent
SITE_FAULTS = ("hang", "kill")
SERVER_FAULTS = ("kill",)


def _load_run_poc():
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec = importlib.util.spec_from_file_location("fedseg_run_poc", HERE / "run_poc.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.dont_write_bytecode = before


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    fault = parser.add_mutually_exclusive_group(required=True)
    fault.add_argument("--site-fault", choices=SITE_FAULTS, help="what happens to --fault-site during training")
    fault.add_argument("--server-fault", choices=SERVER_FAULTS, help="kill the server after round --fault-round - 1")
    parser.add_argument("--fault-site", default="site-2", help="the site that fails (default site-2)")
    parser.add_argument("--fault-round", type=int, default=1, help="round during which the fault happens (default 1)")
    parser.add_argument("--method", default="fedavg", help="fedseg method to export (default fedavg)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the job (default 4)")
    parser.add_argument("--task-timeout", type=int, default=60, help="seconds a site may take per task (default 60)")
    parser.add_argument("--hang-seconds", type=float, default=None, help="how long a hung site stays stopped")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds for the whole job (default 1200)")
    parser.add_argument("--workspace", default=None, help="POC workspace (default: a fresh temp dir)")
    parser.add_argument("--keep-workspace", action="store_true", help="keep logs and workspace afterwards")
    parser.add_argument("--out", default=None, help="copy the final report.json here")
    args = parser.parse_args(argv)
    if not 1 <= args.fault_round < args.rounds:
        parser.error(f"--fault-round must be in 1..{args.rounds - 1} (a later round must exist to come back in), got {args.fault_round}")
    if args.task_timeout < 1:
        parser.error(f"--task-timeout must be >= 1 second, got {args.task_timeout}")
    if args.hang_seconds is None:
        args.hang_seconds = args.task_timeout + 10.0
    if args.site_fault and args.fault_site not in ("site-1", "site-2", "site-3"):
        parser.error(f"--fault-site must be one of site-1, site-2, site-3 (poc_workspace/project.yml), got {args.fault_site!r}")
    return args


def classify(cmdline: str, site: Optional[str]) -> Optional[str]:
    """``"site"`` / ``"site_job"`` / ``"server"`` / ``"server_job"`` for a POC process command line, else None.

    NVFlare 2.9 runs a participant as ``client_train`` / ``server_train`` and each job in a child
    ``worker_process`` (site) / ``runner_process`` (server); ``-m <kit folder>`` names the participant."""
    if site is not None and f"/{site} " not in cmdline + " " and f"/{site}/" not in cmdline:
        return None
    if "client_train" in cmdline:
        return "site"
    if "worker_process" in cmdline:
        return "site_job"
    if "server_train" in cmdline:
        return "server"
    if "runner_process" in cmdline:
        return "server_job"
    return None


def processes(run_poc, poc, site: Optional[str]) -> Dict[str, List[int]]:
    found: Dict[str, List[int]] = {}
    for pid in run_poc.find_poc_processes(poc.workspace, poc.run_tag):
        cmd = run_poc._read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
        role = classify(cmd, site)
        if role:
            found.setdefault(role, []).append(pid)
    return found


def _signal(pids: List[int], sig: int) -> List[int]:
    hit = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except ProcessLookupError:
            pass
    return hit


def wait_for_line(path_fn, needle: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = path_fn()
        if path is not None and path.is_file() and needle in path.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return False


def check_site_fault(report: Dict[str, Any], site: str, fault_round: int, rounds: int) -> List[Tuple[bool, str]]:
    """PASS/FAIL lines for a site fault, from the job's report.json."""
    checks: List[Tuple[bool, str]] = []
    got = [r["round"] for r in report.get("rounds", [])]
    checks.append((got == list(range(rounds)), f"every round once: {got}"))
    entry = next((r for r in report.get("rounds", []) if r["round"] == fault_round), {})
    checks.append((site in entry.get("missing", []), f"round {fault_round}: missing {entry.get('missing')}"))
    others = sorted(set(report.get("clients", [])) - {site})
    checks.append((sorted(entry.get("metrics", {})) == others, f"round {fault_round} finished with {sorted(entry.get('metrics', {}))}"))
    back = [r["round"] for r in report.get("rounds", []) if r["round"] > fault_round and site in r.get("metrics", {})]
    checks.append((bool(back), f"{site} trained again in rounds {back}" if back else f"{site} never came back"))
    restored = {
        r["round"]: r["metrics"][site].get("state_restored_from_round")
        for r in report.get("rounds", [])
        if site in r.get("metrics", {}) and r["metrics"][site].get("state_restored_from_round") is not None
    }
    checks.append((True, f"{site} restored its site state: {restored or 'no (same process)'}"))
    return checks


def check_server_fault(report: Dict[str, Any], fault_round: int, rounds: int) -> List[Tuple[bool, str]]:
    got = [r["round"] for r in report.get("rounds", [])]
    return [
        (got == list(range(rounds)), f"every round once: {got}"),
        (report.get("resumed_at", [None])[0] is not None and report["resumed_at"][0] >= fault_round,
         f"resumed_at {report.get('resumed_at')}"),
    ]


def run(args: argparse.Namespace) -> int:
    run_poc = _load_run_poc()
    log = run_poc.log
    from fedseg.cli import export_job

    checks: List[Tuple[bool, str]] = []
    with run_poc.PocRun(args.workspace, keep_workspace=args.keep_workspace) as poc:
        try:
            ckpt = poc.aux / "checkpoints"
            job = export_job(
                args.method, poc.aux / "jobs", profile="tiny", num_rounds=args.rounds, task_timeout=args.task_timeout,
                checkpoint_dir=str(ckpt),
            )
            log(f"fault: job {job} ({args.rounds} rounds, task_timeout {args.task_timeout}s, checkpoints in {ckpt})")
            poc.prepare()
            poc.start()
            job_id = poc.submit(job)
            server_log = lambda: poc.prod / poc.roles["server"] / job_id / "log.txt"  # noqa: E731
            trigger = f"round {args.fault_round}/{args.rounds} done"
            if not wait_for_line(server_log, trigger, args.timeout):
                raise run_poc.PocError(f"the server never logged '{trigger}'")
            if args.site_fault:
                report, notes = _site_fault(args, run_poc, poc, job, job_id, log)
                checks = notes + check_site_fault(report, args.fault_site, args.fault_round, args.rounds)
            else:
                report, notes = _server_fault(args, run_poc, poc, job, job_id, log)
                checks = notes + check_server_fault(report, args.fault_round, args.rounds)
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=1))
        except BaseException as e:
            if not isinstance(e, KeyboardInterrupt):
                print(poc.log_tails(), file=sys.stderr, flush=True)
                checks.append((False, f"{type(e).__name__}: {e}"))
            else:
                raise
    for ok, what in checks:
        print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
    ok = bool(checks) and all(ok for ok, _ in checks)
    print("fault_poc: PASS" if ok else "fault_poc: FAIL", flush=True)
    return 0 if ok else 1


def _wait_finished(poc, job_id: str, timeout: float, log) -> str:
    """Wait for the job to end whatever its status (a job that lost a site ends FINISHED:ABNORMAL)."""
    _, meta = poc.session.monitor_job_and_return_job_meta(job_id, timeout=timeout, poll_interval=3.0)
    status = (meta or {}).get("status")
    log(f"wait: job {job_id} ended with status {status}")
    return status


def _site_fault(args, run_poc, poc, job, job_id: str, log) -> Tuple[Dict[str, Any], List[Tuple[bool, str]]]:
    site = args.fault_site
    procs = processes(run_poc, poc, site)
    log(f"fault: {site} processes {procs}")
    notes: List[Tuple[bool, str]] = []
    if args.site_fault == "hang":
        hit = _signal(procs.get("site_job", []), signal.SIGSTOP)
        log(f"fault: SIGSTOP {site} job process {hit} during round {args.fault_round}; SIGCONT in {args.hang_seconds:.0f}s")
        time.sleep(args.hang_seconds)
        _signal(hit, signal.SIGCONT)
        log(f"fault: SIGCONT {site} {hit}")
        status = _wait_finished(poc, job_id, args.timeout, log)
        notes.append((status == "FINISHED:COMPLETED", f"job status {status}"))
        return _fetch_report(poc, job_id), notes
    hit = _signal(procs.get("site", []) + procs.get("site_job", []), signal.SIGKILL)
    log(f"fault: SIGKILL {site} {hit} during round {args.fault_round}")
    # the round in progress ends without the site (task timeout); NVFlare 2.9 does not start the running job
    # again on a restarted client, so the site rejoins when the job is re-submitted (resumed from the checkpoint)
    server_log = lambda: poc.prod / poc.roles["server"] / job_id / "log.txt"  # noqa: E731
    trigger = f"round {args.fault_round + 1}/{args.rounds} done"
    notes.append((wait_for_line(server_log, trigger, args.timeout), f"round {args.fault_round} finished without {site}"))
    poc.wait_ready()  # the POC daemon loop restarts the killed client; it registers again
    log(f"fault: {site} is connected again; aborting job {job_id} and re-submitting it")
    poc.session.abort_job(job_id)
    _wait_finished(poc, job_id, 120.0, log)
    first = _fetch_report(poc, job_id)
    new_id = poc.submit(job)
    status = _wait_finished(poc, new_id, args.timeout, log)
    notes.append((status == "FINISHED:COMPLETED", f"re-submitted job {new_id} status {status}"))
    report = _fetch_report(poc, new_id)
    kept = [r["round"] for r in first.get("rounds", [])]
    notes.append((report.get("rounds", [])[: len(kept)] == first.get("rounds"), f"rounds {kept} of the first job kept as they were"))
    return report, notes


def _server_fault(args, run_poc, poc, job, job_id: str, log) -> Tuple[Dict[str, Any], List[Tuple[bool, str]]]:
    procs = processes(run_poc, poc, None)
    servers = procs.get("server", []) + procs.get("server_job", [])
    hit = _signal(servers, signal.SIGKILL)
    log(f"fault: SIGKILL server {hit} after round {args.fault_round - 1}")
    poc._close_session()
    time.sleep(3.0)
    # the POC daemon loop (sub_start.sh) restarts a killed server; if it did not, start it as an operator would
    if not processes(run_poc, poc, None).get("server"):
        log("fault: no server process: nvflare poc start -p server")
        poc.nvflare("poc", "start", "-p", poc.roles["server"], "--no-wait", timeout=120)
    poc.wait_ready()
    try:  # what NVFlare made of the job that was running when the server died
        log(f"fault: the killed server's job {job_id} now has status {poc.session.get_job_meta(job_id).get('status')}")
    except Exception as e:
        log(f"fault: the killed server's job {job_id} is unknown to the restarted server ({type(e).__name__})")
    new_id = poc.submit(job)
    log(f"fault: re-submitted the same job as {new_id}; it resumes from the checkpoint")
    status = _wait_finished(poc, new_id, args.timeout, log)
    return _fetch_report(poc, new_id), [(status == "FINISHED:COMPLETED", f"re-submitted job {new_id} status {status}")]


def _fetch_report(poc, job_id: str) -> Dict[str, Any]:
    result = poc.download(job_id)
    reports = sorted(result.rglob("report.json"), key=lambda p: (p.parent.name != "workspace", len(p.parts)))
    if not reports:
        raise RuntimeError(f"the job result {result} has no report.json")
    return json.loads(reports[0].read_text())


# SIGTERM / Ctrl-C: every POC process is ended, then the run unwinds (`finally` stops and cleans the POC)
@StopOnSignal("fault_poc", unwind_s=120.0)
def main(argv: Optional[List[str]] = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
