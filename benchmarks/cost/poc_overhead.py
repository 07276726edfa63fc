"""Round time and per-task time split of exported jobs in NVFlare's POC mode (server + 3 site processes, loopback).

The simulator's numbers (``framework_overhead.py``) could be an artefact of the simulator; POC runs the
same exported job as separate processes talking gRPC, as a deployment does. Each variant (``name:key=value,...``
with keys ``method``, ``exe`` = native | client_api, and ``tri`` = the server's task_request_interval in seconds,
default the exported job's 0.2) is exported at the default profile (built-in polyp,
3 sites, 64 px, 1 local epoch, ``--rounds`` rounds) and run with ``poc_workspace/run_poc.py``; variants run
interleaved, the order reversed in every other repeat. From each ``report.json`` (rounds 1.. ; round 0 carries
the site set-up):
    round      median round wall time, and its ratio to the first variant
    per task   median deliver / site / return / framework (= deliver + return) seconds of each task
               (report field ``task_breakdown``, ``fedseg.fl.task_clock``; one machine, so one clock)

Usage:
    python benchmarks/cost/poc_overhead.py --rounds 10 --repeats 1 --out bench_out/poc_overhead \
        --variants fedavg:method=fedavg fedavg_client_api:method=fedavg,exe=client_api fedevi:method=fedevi
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

from fedseg.markdown import markdown_table
from fedseg.processes import StopOnSignal

REPO = Path(__file__).resolve().parents[2]
RUN_POC = REPO / "poc_workspace" / "run_poc.py"


def parse_variant(spec: str) -> Dict[str, str]:
    name, _, body = spec.partition(":")
    settings = {"name": name, "method": "fedavg", "exe": "native", "tri": None}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        if key not in ("method", "exe", "tri"):
            raise SystemExit(f"unknown variant key {key!r} in {spec!r} (method, exe, tri)")
        settings[key] = float(value) if key == "tri" else value
    return settings


# SIGTERM / Ctrl-C end the POC run and its processes too; run_poc.py gets the time to stop and clean its POC
@StopOnSignal("poc_overhead", grace_s=150.0)
def main(argv=None) -> Dict[str, Any]:
    from fedseg.bench.simulator import machine_info, median_task_breakdown, patch_job, round_timings
    from fedseg.recipes.export import export_job

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output folder (jobs, reports, JSON)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--variants", nargs="+", default=["fedavg:method=fedavg", "fedevi:method=fedevi"])
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    variants = [parse_variant(v) for v in args.variants]

    runs: List[Dict[str, Any]] = []
    for rep in range(args.repeats):
        for v in variants if rep % 2 == 0 else list(reversed(variants)):
            tag = f"{v['name']}_r{rep}"
            job = export_job(v["method"], out / "jobs" / tag, "default", num_rounds=args.rounds, site_executor=v["exe"])
            patch_job(job, v["tri"], None)
            report_path = out / "reports" / f"{tag}.json"
            print(f"[{_dt.datetime.now():%H:%M:%S}] {tag} ...", flush=True)
            with open(out / f"{tag}.log", "w") as log:
                rc = subprocess.run([sys.executable, str(RUN_POC), "--job", str(job), "--out", str(report_path)],
                                    stdout=log, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                raise SystemExit(f"{tag}: run_poc.py failed (exit {rc}); see {out / f'{tag}.log'}")
            report = json.loads(report_path.read_text())
            rows = round_timings(report)[1:]
            runs.append({"variant": v["name"], "repeat": rep, "wall": [r["wall"] for r in rows],
                         "rounds": report["rounds"],
                         "dice": statistics.mean(m["dice"] for m in report["final"]["global"].values())})

    table = []
    for v in variants:
        mine = [r for r in runs if r["variant"] == v["name"]]
        table.append({"variant": v["name"], "method": v["method"], "exe": v["exe"], "tri": v["tri"],
                      "median_round": statistics.median(w for r in mine for w in r["wall"]),
                      "dice": statistics.mean(r["dice"] for r in mine),
                      "tasks": median_task_breakdown([rr for r in mine for rr in r["rounds"][1:]], 0)})
    result = {"benchmark": "poc_overhead", "date": _dt.datetime.now().isoformat(timespec="seconds"),
              "command": "python " + " ".join([sys.argv[0]] + (list(argv) if argv is not None else sys.argv[1:])),
              "machine": machine_info(), "rounds": args.rounds, "repeats": args.repeats, "table": table, "runs": runs}
    (out / "poc_overhead.json").write_text(json.dumps(result, indent=1))

    base = table[0]["median_round"]
    print(f"\nPOC, 3 sites, built-in polyp 64 px, default profile, {args.rounds} rounds; medians over rounds 1.. of "
          f"{args.repeats} repeat(s)\n")
    nan = float("nan")
    rows = []
    for row in table:
        for i, (task, parts) in enumerate(row["tasks"].items()):  # a variant's own cells on its first task's row
            first = i == 0
            rows.append(([row["variant"], row["exe"], f"{row['median_round']:.2f}", f"{row['median_round'] / base:.2f}x"]
                         if first else ["", "", "", ""])
                        + [task, f"{parts.get('deliver', nan):.2f}", f"{parts.get('site', nan):.2f}",
                           f"{parts.get('return', nan):.2f}", f"{parts.get('framework', nan):.2f}", f"{parts['total']:.2f}",
                           f"{row['dice']:.3f}" if first else ""])
    print("\n".join(markdown_table(["variant", "executor", "round (s)", "vs first", "task", "deliver (s)", "site (s)",
                                    "return (s)", "framework (s)", "send -> last answer (s)", "final mean Dice"], rows)))
    print(f"\nwrote {out / 'poc_overhead.json'}")
    return result


if __name__ == "__main__":
    main()
