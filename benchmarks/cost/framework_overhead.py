"""Per-round framework overhead of a FedAvg job in NVFlare's simulator, and settings that cut it.

For every round of ``report.json`` (written by ``FedSegController``):
    wall       the controller's ``wall_time`` (send tasks -> all results in -> aggregated)
    max/sum    max and sum over sites of ``compute_time`` (seconds of site work: local training +
               validation Dice + packing the weights; measured inside the site)
    overhead   wall - max(compute): what the round costs beyond its slowest site's own work
               (task fetch polling, (de)serialisation, messaging, result polling, aggregation)
Sites run as parallel processes (simulator threads == sites); on a 2-core machine three sites
contend for the cores, so ``compute_time`` itself grows with contention — the overhead is measured
on top of that. Round 0 also carries process warm-up (imports, data caching outside the timed
block) and is left out of the medians.

Settings tried (``--variants``, each ``name:key=value,...``; keys):
    tcp      the controller's ``task_check_period`` (recipe option; default 0.5 s)
    tri      the server's ``task_request_interval`` (NVFlare server config, default 2 s): the server
             sends it as the WAIT_TIME header with every task and every TRY_AGAIN, and the client
             (simulator worker) sleeps that long after each task before asking for the next one.
             Set by adding ``{"server": {"task_request_interval": X}}`` to the exported job's
             ``config_fed_server.json`` (NVFlare's FedJob API has no setter for it).
    fetch    the client's ``default_task_fetch_interval`` (config_fed_client.json; only used until
             the server's first WAIT_TIME arrives)
    omp      OMP_NUM_THREADS for the simulator and its site processes ("default" = unset: torch uses
             one thread per physical core in every site process)
    exe      the site executor (recipe option ``site_executor``): native (default; ``FedSegSiteExecutor``)
             or client_api (NVFlare's in-process Client API running the site script)
    method   the method's job (default fedavg): compare methods' round time in one run
    threads  simulator threads (-t); 3 = one persistent process per site. Fewer threads than sites
             makes the simulator start a fresh site process for every task (site state such as the
             optimiser's moments is lost between rounds — a different training run, timing only).
Per task, the report's ``task_breakdown`` (``fedseg.fl.task_clock``) splits each site's round trip into deliver
(server send -> site start), site (its own work) and return (site answer -> server receipt); the second table
prints their medians and framework = deliver + return, NVFlare's fixed cost per task.
Hard-coded in NVFlare 2.9 (not settable from a job; listed so the residual overhead is explained):
    * simulator_worker: 3 fetch tries 0.5 s apart before it reports back and sleeps WAIT_TIME;
    * in-process Client API: the trainer's ``flare.receive()`` and the executor's result wait both
      poll every 0.5 s (``in_process_backend._RESULT_POLL_INTERVAL``).

Usage:
    python benchmarks/cost/framework_overhead.py --rounds 6 --repeats 2 --out /tmp/fedseg_bench/overhead
    python benchmarks/cost/framework_overhead.py --variants baseline "fast:tcp=0.1,tri=0.2,omp=1"
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

DEFAULT_VARIANTS = [
    "baseline:",
    "tcp0.1:tcp=0.1",
    "tri0.2:tri=0.2",
    "omp1:omp=1",
    "tri0.2+omp1:tri=0.2,omp=1",
    "all:tcp=0.1,tri=0.2,fetch=0.2,omp=1",
]


# ------------------------------------------------------------------------------------ job helpers
# the simulator helpers live in the package (``fedseg bench`` uses them); re-exported here
from fedseg.bench.simulator import (  # noqa: E402,F401
    machine_info, median_task_breakdown, patch_job, round_timings, run_simulator,
)
from fedseg.markdown import markdown_table  # noqa: E402
from fedseg.processes import StopOnSignal  # noqa: E402


def summarise_rounds(rows: List[Dict[str, float]], skip_first: int = 1) -> Dict[str, float]:
    """Medians over rounds (skipping the first ``skip_first`` warm-up rounds when there are enough)."""
    use = rows[skip_first:] if len(rows) > skip_first else rows
    out = {"rounds_used": len(use)}
    for key in ("wall", "max_compute", "sum_compute", "overhead"):
        vals = [r[key] for r in use if key in r]
        if vals:
            out[f"median_{key}"] = statistics.median(vals)
    return out


def parse_variant(spec: str) -> Dict[str, Any]:
    name, _, body = spec.partition(":")
    settings: Dict[str, Any] = {"name": name}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        if key not in ("tcp", "tri", "fetch", "omp", "threads", "exe", "method"):
            raise ValueError(f"unknown setting {key!r} in variant {spec!r}")
        if key in ("omp", "exe", "method"):
            settings[key] = value
        else:
            settings[key] = int(value) if key == "threads" else float(value)
    return settings


# ------------------------------------------------------------------------------------------- main
@StopOnSignal("framework_overhead")  # SIGTERM / Ctrl-C end the runs it started too
def main(argv=None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/fedseg_bench/overhead", help="output folder (jobs, workspaces, JSON)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant (interleaved, order reversed each repeat)")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--family", default="polyp", choices=["polyp", "vessel", "nuclei"])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--sites", nargs="+", default=["site-1", "site-2", "site-3"])
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS,
                        help="'name:key=value,...' with keys tcp, tri, fetch, omp, threads, exe, method")
    args = parser.parse_args(argv)

    from fedseg.recipes.export import export_job
    from fedseg.data.synthetic import generate_federation

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    paths = generate_federation(args.family, args.sites, out / "data", profile=args.profile)
    site_map = out / "site_datalists.json"
    site_map.write_text(json.dumps({s: str(Path(p).resolve()) for s, p in paths.items()}, indent=1))

    variants = [parse_variant(v) for v in args.variants]
    runs: List[Dict[str, Any]] = []
    for rep in range(args.repeats):
        order = variants if rep % 2 == 0 else list(reversed(variants))
        for v in order:
            tag = f"{v['name']}_r{rep}"
            job = export_job(
                v.get("method", "fedavg"), out / "jobs" / tag, args.profile, num_rounds=args.rounds,
                site_executor=v.get("exe", "native"),
                script_args=f"--site_datalists {site_map}", min_clients=len(args.sites),
                task_check_period=v.get("tcp", 0.5), data_family=args.family,
                image_size=args.image_size, local_epochs=args.local_epochs,
            )
            patch_job(job, v.get("tri"), v.get("fetch"))
            print(f"[{_dt.datetime.now():%H:%M:%S}] {tag} ...", flush=True)
            res = run_simulator(job, out / "ws" / tag, args.sites, threads=v.get("threads"),
                                omp_threads=v.get("omp", "default"), log_path=out / "logs" / f"{tag}.log")
            rows = round_timings(res["report"])
            summary = summarise_rounds(rows)
            runs.append({"variant": v["name"], "settings": v, "repeat": rep, "total_wall_s": res["total_wall_s"],
                         "command": res["command"], "rounds": rows, "summary": summary,
                         "report_rounds": [{"task_breakdown": r.get("task_breakdown", {})} for r in res["report"]["rounds"]],
                         # FedBN / FedRep have no global model: their sites' own models
                         "final_dice_mean": statistics.mean(m["dice"] for m in (res["report"]["final"].get("global")
                                                                                or res["report"]["final"]["personalized"]).values())})
            print(f"    wall/round {summary.get('median_wall', float('nan')):.2f}s  max compute "
                  f"{summary.get('median_max_compute', float('nan')):.2f}s  overhead "
                  f"{summary.get('median_overhead', float('nan')):.2f}s  job total {res['total_wall_s']:.1f}s", flush=True)
            shutil.rmtree(out / "ws" / tag, ignore_errors=True)  # keep only the JSON + logs

    # per variant: medians over all used rounds of all repeats
    table = []
    for v in variants:
        mine = [r for r in runs if r["variant"] == v["name"]]
        used = [row for r in mine for row in (r["rounds"][1:] if len(r["rounds"]) > 1 else r["rounds"])]
        med = lambda key: statistics.median(row[key] for row in used if key in row)  # noqa: E731
        table.append({
            "variant": v["name"], "settings": {k: val for k, val in v.items() if k != "name"},
            "rounds_used": len(used), "median_wall": med("wall"), "median_max_compute": med("max_compute"),
            "median_sum_compute": med("sum_compute"), "median_overhead": med("overhead"),
            "median_job_total_s": statistics.median(r["total_wall_s"] for r in mine),
            "tasks_per_round": med("tasks"),
            "mb_up_per_site_round": med("bytes_up") / len(args.sites) / 1e6,
            "final_dice_mean": statistics.mean(r["final_dice_mean"] for r in mine),
        })
    # where each task's time goes (report field task_breakdown): medians over used rounds of all repeats
    breakdown = []
    for v in variants:
        rounds = [row for r in runs if r["variant"] == v["name"] for row in r["report_rounds"][1:]]
        breakdown += [{"variant": v["name"], "task": t, **parts} for t, parts in median_task_breakdown(rounds, 0).items()]
    base = table[0]
    result = {
        "benchmark": "framework_overhead",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python " + " ".join([sys.argv[0]] + (list(argv) if argv is not None else sys.argv[1:])),
        "machine": machine_info(),
        "settings": {"rounds": args.rounds, "repeats": args.repeats, "profile": args.profile, "family": args.family,
                     "image_size": args.image_size, "local_epochs": args.local_epochs, "sites": args.sites},
        "table": table,
        "task_breakdown": breakdown,
        "runs": runs,
    }
    (out / "framework_overhead.json").write_text(json.dumps(result, indent=1))

    print(f"\nFedAvg, {len(args.sites)} sites, {args.family} {args.image_size}px, {args.rounds} rounds x "
          f"{args.local_epochs} local epoch(s), {args.repeats} repeat(s) per variant; medians over rounds 1..{args.rounds - 1} "
          "of all repeats (round 0 = warm-up, left out)\n")
    print("\n".join(markdown_table(
        ["variant", "settings", "wall/round (s)", "wall vs first", "max site compute (s)", "sum site compute (s)",
         "overhead = wall - max (s)", "tasks/round", "overhead per task (s)", "upload/site/round (MB)", "job total (s)",
         "final mean Dice"],
        [[row["variant"], ", ".join(f"{k}={val}" for k, val in row["settings"].items()) or "defaults",
          f"{row['median_wall']:.2f}", f"{row['median_wall'] / base['median_wall']:.2f}x", f"{row['median_max_compute']:.2f}",
          f"{row['median_sum_compute']:.2f}", f"{row['median_overhead']:.2f}", f"{row['tasks_per_round']:g}",
          f"{row['median_overhead'] / row['tasks_per_round']:.2f}", f"{row['mb_up_per_site_round']:.3f}",
          f"{row['median_job_total_s']:.1f}", f"{row['final_dice_mean']:.3f}"] for row in table])))
    print("\nPer task (report field task_breakdown; medians over sites, then over rounds): deliver = server send -> "
          "site start, site = the site's own work, return = site answer -> server receipt, framework = deliver + return\n")
    nan = float("nan")
    print("\n".join(markdown_table(
        ["variant", "task", "deliver (s)", "site (s)", "return (s)", "framework (s)", "send -> last answer (s)"],
        [[row["variant"], row["task"], f"{row.get('deliver', nan):.2f}", f"{row.get('site', nan):.2f}",
          f"{row.get('return', nan):.2f}", f"{row.get('framework', nan):.2f}", f"{row['total']:.2f}"] for row in breakdown])))
    print(f"\nwrote {out / 'framework_overhead.json'}")
    return result


if __name__ == "__main__":
    main()
