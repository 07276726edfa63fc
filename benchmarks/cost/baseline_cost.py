"""Each method's work per round without NVFlare's transport: the real controller and sites in one process.

``fedseg bench`` and ``framework_overhead.py`` time rounds in NVFlare's simulator: three site processes on the
machine's cores plus NVFlare's fixed cost per task, all at the mercy of whatever else the machine runs. Here every
method runs through ``fedseg.bench.inprocess`` (the real ``FedSegController`` workflow; sites answer one after the
other in this process, one torch thread), so a round's wall time is the sum of the sites' work (local training,
the method's extras, validation) plus the server's aggregation. Methods are interleaved, the order reversed every
repeat, and each method's figure is the best over repeats of its median round (rounds 1.., round 0 carries the
set-up): the least disturbed measurement of the same work. Bytes are the report's ``bytes_sent`` /
``bytes_received`` (identical to the simulator's: the same controller counts them).

    python benchmarks/cost/baseline_cost.py --family vessel --rounds 3 --repeats 3 \\
        --methods fedavg fedprox scaffold fedadam fedbn ditto fedrep moon feddyn fedce --out /tmp/fedseg_bench/baseline_cost
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import statistics
from pathlib import Path
from typing import Any, Dict, List

from fedseg.processes import StopOnSignal
from fedseg.markdown import markdown_table


@StopOnSignal("baseline_cost")  # SIGTERM / Ctrl-C end the runs it started too
def main(argv=None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", required=True, help="methods or LABEL=METHOD:key=value,... rows")
    parser.add_argument("--family", default="vessel", choices=["polyp", "vessel", "nuclei"])
    parser.add_argument("--sites", nargs="+", default=["site-1", "site-2", "site-3"])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    parser.add_argument("--out", default="/tmp/fedseg_bench/baseline_cost")
    args = parser.parse_args(argv)

    import torch

    from fedseg.bench.inprocess import InProcessController, controller_args
    from fedseg.bench.runs import parse_variant
    from fedseg.bench.simulator import machine_info
    from fedseg.data.synthetic import generate_federation

    torch.set_num_threads(args.threads)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sites = {s: str(Path(p).resolve()) for s, p in generate_federation(args.family, args.sites, out / "data", profile=args.profile).items()}
    rows = [parse_variant(m) for m in args.methods]
    runs: List[Dict[str, Any]] = []
    for rep in range(args.repeats):
        for label, method, options in (rows if rep % 2 == 0 else list(reversed(rows))):
            tmp = out / "runs" / f"{label}_r{rep}"
            shutil.rmtree(tmp, ignore_errors=True)
            kwargs = controller_args(method, tmp, profile=args.profile, num_rounds=args.rounds, data_family=args.family, **options)
            kwargs["final_evaluation"] = False  # the rounds only
            print(f"[{_dt.datetime.now():%H:%M:%S}] {label} repeat {rep} ...", flush=True)
            controller = InProcessController(sites, tmp / "server", tmp / "sites", **kwargs)
            controller.run()
            report = json.loads((tmp / "server" / "report.json").read_text())
            rounds = report["rounds"][1:] or report["rounds"]
            runs.append({
                "label": label, "method": method, "repeat": rep,
                "round_wall": statistics.median(r["wall_time"] for r in rounds),
                "site_compute": statistics.median(sum(m.get("compute_time", 0.0) for m in r["metrics"].values()) for r in rounds),
                "bytes_sent": statistics.median(r["bytes_sent"] for r in rounds),
                "bytes_received": statistics.median(r["bytes_received"] for r in rounds),
            })
            shutil.rmtree(tmp / "sites", ignore_errors=True)

    base = rows[0][0]
    table = {}
    for label, method, _ in rows:
        mine = [r for r in runs if r["label"] == label]
        best = min(mine, key=lambda r: r["round_wall"])
        table[label] = {"method": method, "best_round_wall": best["round_wall"], "site_compute": best["site_compute"],
                        "round_walls": [r["round_wall"] for r in mine],
                        "upload_mb_per_site": best["bytes_received"] / len(sites) / 1e6,
                        "download_mb_per_site": best["bytes_sent"] / len(sites) / 1e6}
    for entry in table.values():
        entry["wall_vs_first"] = entry["best_round_wall"] / table[base]["best_round_wall"]
        entry["upload_vs_first"] = entry["upload_mb_per_site"] / table[base]["upload_mb_per_site"]
    result = {"command": "python benchmarks/cost/baseline_cost.py " + " ".join(argv or __import__("sys").argv[1:]),
              "machine": machine_info(), "sites": list(sites), "family": args.family, "rounds": args.rounds,
              "repeats": args.repeats, "table": table, "runs": runs}
    (out / "baseline_cost.json").write_text(json.dumps(result, indent=1))
    print(f"\n{args.family}, {len(sites)} sites in one process, {args.rounds} rounds, best of {args.repeats} interleaved repeats "
          f"of the median round (rounds 1..)\n")
    print("\n".join(markdown_table(
        ["method", "round, in process (s)", f"vs {base}", "sites' work (s)", "all repeats (s)",
         "upload / download per site per round (MB)", f"upload vs {base}"],
        [[label, f"{e['best_round_wall']:.2f}", f"{e['wall_vs_first']:.2f}x", f"{e['site_compute']:.2f}",
          ", ".join(f"{w:.2f}" for w in e["round_walls"]), f"{e['upload_mb_per_site']:.3f} / {e['download_mb_per_site']:.3f}",
          f"{e['upload_vs_first']:.3f}x"] for label, e in table.items()])))
    print(f"\nwrote {out / 'baseline_cost.json'}")
    return result


if __name__ == "__main__":
    main()
