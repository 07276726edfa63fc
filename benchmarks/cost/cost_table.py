"""A cost table from one ``fedseg bench`` folder: round time per method
against FedAvg's, Dice, and paired per-image tests of each method against FedAvg and of each method's
window-sample default against its whole-image setting.

Reads the stored runs (``<out>/runs/method-*.json``; nothing is re-run) and prints Markdown:

* cost: runs, median round wall (median over every run's rounds 1..R-1, as ``results.md``), its ratio to
  FedAvg's in the same bench, the median task times (median over runs of each run's median), wall per run;
* Dice: mean over sites (unweighted) per seed, mean +- std over seeds, and per site;
* paired tests (``fedseg.bench.stats.compare``: per test image, same seed, pooled over seeds and sites;
  two-sided Wilcoxon and paired t): every label against FedAvg, and each ``--pairs SAMPLED:WHOLE``.

Usage:
    python benchmarks/cost/cost_table.py bench_out/cost/retina_bench \\
        --pairs graphfedseg:graph_whole fedevi:fedevi_whole [--metric dice_fov]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

if __name__ == "__main__":  # run as a script: the repository root on the path, for the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.core.runs import load_runs, median_round_wall, per_image  # noqa: E402
from fedseg.markdown import markdown_table  # noqa: E402


def cost_rows(runs: Dict[str, List[Dict[str, Any]]], baseline: str) -> List[str]:
    base = median_round_wall(runs[baseline])
    rows = []
    for label, records in runs.items():
        wall = median_round_wall(records)
        tasks = sorted({t for r in records for t in (r.get("median_task_times") or {})})
        task_text = ", ".join(f"{t} {statistics.median(r['median_task_times'][t] for r in records if t in r.get('median_task_times', {})):.2f}"
                              for t in tasks)
        walls = [r["wall_s"] for r in records]
        spread = f"{statistics.fmean(walls):.0f} ± {statistics.stdev(walls):.0f}" if len(walls) > 1 else f"{walls[0]:.0f}"
        rows.append([label, str(len(records)), f"{wall:.2f}", f"{wall / base:.2f}x", task_text, spread])
    return markdown_table(["approach", "runs", "median round wall (s)", "vs FedAvg", "median task times (s)",
                           "wall per run (s)"], rows)


def dice_rows(runs: Dict[str, List[Dict[str, Any]]], sites: List[str], metric: str) -> List[str]:
    from fedseg.bench.stats import summarise_seeds

    rows = []
    seeds_text = None
    for label, records in runs.items():
        final = {r["seed"]: r["final"]["global"] for r in records}
        summary = summarise_seeds(final, sites, metrics=(metric,))
        cells = []
        for key in sites + ["mean"]:
            s = summary[key][metric]
            cells.append("-" if s["mean"] is None else f"{s['mean']:.3f} ± {s['std']:.3f}")
        seeds_text = seeds_text or ", ".join(str(r["seed"]) for r in records)
        rows.append([label, *cells])
    return markdown_table(["approach", *sites, f"mean over sites (seeds {seeds_text})"], rows)


def test_rows(runs: Dict[str, List[Dict[str, Any]]], pairs: List[tuple], sites: List[str], metric: str) -> List[str]:
    from fedseg.bench.stats import compare

    def p(v):
        return "-" if v is None else (f"{v:.3f}" if v >= 1e-3 else f"{v:.1e}")

    rows = []
    for a, b in pairs:
        tests = compare(per_image(runs[a]), per_image(runs[b]), sites, metrics=(metric,))[metric]
        t = tests["all"]
        per_site = [p(tests["per_site"][s]["wilcoxon_p"]) for s in sites]
        diff = "-" if t["mean_diff"] is None else f"{t['mean_diff']:+.4f}"
        rows.append([a, b, str(t["n"]), diff, p(t["wilcoxon_p"]), p(t["ttest_p"]), *per_site])
    return markdown_table([f"{metric} of", "against", "pairs", "mean diff", "Wilcoxon p", "t-test p"]
                          + [f"Wilcoxon p {s}" for s in sites], rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the fedseg bench --out folder")
    parser.add_argument("--baseline", default="fedavg")
    parser.add_argument("--pairs", nargs="*", default=[], help="SAMPLED:WHOLE labels to test against each other")
    parser.add_argument("--metric", default="dice", help="per-image metric of the Dice table and the tests")
    parser.add_argument("--seeds", nargs="*", type=int, default=None,
                        help="only these seeds' runs (e.g. the seeds that ran on a quiet machine, for the cost table)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.out)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    if args.seeds is not None:
        runs = {label: [r for r in records if r["seed"] in args.seeds] for label, records in runs.items()}
        runs = {label: records for label, records in runs.items() if records}
    if args.baseline not in runs:
        raise SystemExit(f"baseline {args.baseline!r} not among the runs' labels {sorted(runs)}")
    sites = list(json.loads((args.out / "site_datalists.json").read_text()))
    pairs = [tuple(x.split(":", 1)) for x in args.pairs]
    for a, b in pairs:
        for label in (a, b):
            if label not in runs:
                raise SystemExit(f"--pairs label {label!r} not among the runs' labels {sorted(runs)}")
    vs_base = [(label, args.baseline) for label in runs if label != args.baseline]
    print("\n".join(cost_rows(runs, args.baseline)))
    print()
    print("\n".join(dice_rows(runs, sites, args.metric)))
    print()
    print("\n".join(test_rows(runs, pairs + vs_base, sites, args.metric)))


if __name__ == "__main__":
    main()
