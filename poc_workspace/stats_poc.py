#!/usr/bin/env python
"""The federated statistics job (``jobs/fedstats``) in a fresh NVFlare POC, then how the sites differ.

    python poc_workspace/stats_poc.py --out runs/poc_stats      # stats.json, stats.md, plots/, image_statistics.json

``run_poc.PocRun`` does the cycle of ``run_poc.py`` (free loopback ports, prepare, start, wait for every site of the
project, submit, wait, download; always stop and clean). The job's result holds NVFlare's statistics JSON
(``statistics/image_statistics.json``, written by the server), which ``fedseg.fl.fed_statistics.report_statistics``
turns into ``stats.json`` / ``stats.md`` of the project's sites, naming a site that sent nothing. Each site
describes the data it resolves itself (``local/fedseg_site.json``, ``FEDSEG_DATALIST``), else built-in data
generated in its workspace.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import List, Optional

from fedseg.processes import StopOnSignal

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# run_poc.py lies beside this script (python puts this folder first on sys.path); nothing of it is cached in the
# repository
sys.dont_write_bytecode = True
import run_poc  # noqa: E402


def run(job: Path, out: Path, project: Path, timeout: float, start_timeout: float,
        workspace: Optional[str] = None, keep_workspace: bool = False) -> dict:
    """The POC cycle on the statistics ``job``; ``out`` gets NVFlare's JSON and the report. Raises run_poc's
    PocError on a failed cycle, RuntimeError when no site sent statistics."""
    from fedseg.fl.fed_statistics import STATS_OUTPUT, report_statistics

    with run_poc.PocRun(workspace, project, keep_workspace=keep_workspace, start_timeout=start_timeout) as poc:
        try:
            _, result = poc.run_job(job, timeout)
            found = sorted(result.rglob(Path(STATS_OUTPUT).name))
            if not found:
                raise run_poc.PocError(f"the job result {result} has no {STATS_OUTPUT} (no site sent statistics?)")
            out.mkdir(parents=True, exist_ok=True)
            raw = out / Path(STATS_OUTPUT).name
            shutil.copyfile(found[0], raw)
            run_poc.log(f"fetch: {found[0].relative_to(result.parent)} -> {raw}")
            report = report_statistics(raw, poc.roles["clients"], out,
                                       header={"benchmark": "fedseg stats (POC)", "job": str(job)})
        except BaseException as e:
            if not isinstance(e, KeyboardInterrupt):
                print(poc.log_tails(), file=sys.stderr, flush=True)
            raise
    run_poc.log(f"report: {out / 'stats.json'}, {out / 'stats.md'}")
    for sentence in report["summary"]:
        run_poc.log(f"  {sentence}")
    return report


@StopOnSignal("stats_poc", unwind_s=120.0)
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", default=str(REPO / "jobs" / "fedstats"), help="the statistics job (default jobs/fedstats)")
    parser.add_argument("--out", default=str(REPO / "runs" / "poc_stats"), help="folder of stats.json, stats.md")
    parser.add_argument("--project", default=str(HERE / "project.yml"), help="project file (default poc_workspace/project.yml)")
    parser.add_argument("--workspace", default=None, help="POC workspace (default: a new temp dir; outside the repository)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the job may run")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds for server + sites to connect")
    parser.add_argument("--keep-workspace", action="store_true", help="stop the processes, keep the workspace (logs)")
    args = parser.parse_args(argv)
    try:
        run(Path(args.job).resolve(), Path(args.out).resolve(), Path(args.project).resolve(), args.timeout,
            args.start_timeout, args.workspace, args.keep_workspace)
    except Exception as e:  # PocError, Flare API errors, no statistics: one line
        print(f"stats_poc: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
