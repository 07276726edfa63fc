"""Markdown table of method/ablation rows from one ``fedseg bench`` (or ``compare.py``) run (the tables of
docs/methods.md).

Reads ``<out>/results.json`` written by ``fedseg bench`` and each row's ``report.json`` (every seed's), and
prints one row per method variant: mean Dice / HD95 / ASSD of the final global model (unweighted over
sites; with several seeds, the mean over seeds), per-site Dice, optionally the personalised models' mean Dice / HD95, then timing and memory from
the rounds after round 0 (round 0 carries the sites' set-up):

* median round wall time (server side) and its ratio to the ``fedavg`` row of the same run;
* median time of each task per round (``report.json`` ``task_times``: from sending the task to the
  last answer), so a method's extra task (FedEvi's ``evaluate_surrogate``) shows on its own;
* median per-site ``compute_time`` of the training task (measured inside the site) and its ratio;
* median per-site ``peak_memory_mb`` (the site process's peak resident memory) and the difference.

Usage:
    python benchmarks/accuracy/ablation_table.py /tmp/fedseg_bench/graph_polyp/results.json [--personalised]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any, Dict, List, Optional

from fedseg.markdown import markdown_table


def _mean(values: List[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _fmt(value: Optional[float], digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _site_medians(reports: List[Dict[str, Any]], name: str) -> Optional[float]:
    """Median of a per-site round metric over the rounds after round 0 of every report (seed)."""
    values = [m.get(name) for report in reports for r in (report["rounds"][1:] or report["rounds"]) for m in r["metrics"].values()]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(results: Dict[str, Any], personalised: bool = False) -> str:
    sites = results["sites"]
    rows = []
    for label, entry in results["methods"].items():
        reports = []
        for path in entry.get("report_paths") or [entry["report_path"]]:
            with open(path) as f:
                reports.append(json.load(f))
        rows.append((label, entry, _site_medians(reports, "compute_time"), _site_medians(reports, "peak_memory_mb")))
    base = results["methods"].get("fedavg", {})
    base_wall = base.get("median_round_wall")
    base_compute = next((c for label, _, c, _ in rows if label == "fedavg"), None)
    base_memory = next((m for label, _, _, m in rows if label == "fedavg"), None)

    header = ["row", "options", "mean Dice", "mean HD95", "mean ASSD"] + [f"Dice {s}" for s in sites]
    if personalised:
        header += ["personalised mean Dice", "personalised mean HD95"]
    header += ["median round wall (s)", "vs FedAvg", "median task times (s)", "median site compute (s)", "vs FedAvg",
               "median peak mem (MB)", "vs FedAvg (MB)"]
    cells_of_rows = []
    for label, entry, compute, memory in rows:
        g = entry.get("global", {})
        options = ", ".join(f"{k}={v}" for k, v in entry["variant_args"].items()) or "defaults"
        cells = [label, f"{entry['method']}: {options}"]
        cells += [_fmt(_mean([g.get(s, {}).get(k) for s in sites]), d) for k, d in (("dice", 3), ("hd95", 2), ("assd", 2))]
        cells += [_fmt(g.get(s, {}).get("dice"), 3) for s in sites]
        if personalised:
            p = entry.get("personalized") or {}
            cells += [_fmt(_mean([p[s]["dice"] for s in sites if s in p]), 3) if p else "-",
                      _fmt(_mean([p[s]["hd95"] for s in sites if s in p]), 2) if p else "-"]
        wall = entry["median_round_wall"]
        cells += [f"{wall:.2f}", f"{wall / base_wall:.2f}x" if base_wall else "-"]
        cells.append(", ".join(f"{t} {v:.2f}" for t, v in entry.get("median_task_times", {}).items()) or "-")
        cells += [_fmt(compute, 2), f"{compute / base_compute:.2f}x" if compute and base_compute else "-"]
        cells += [_fmt(memory, 0), f"{memory - base_memory:+.0f}" if memory is not None and base_memory is not None else "-"]
        cells_of_rows.append(cells)
    return "\n".join(markdown_table(header, cells_of_rows))


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="results.json written by fedseg bench (or benchmarks/accuracy/compare.py)")
    parser.add_argument("--personalised", action="store_true", help="add the personalised models' columns")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    text = table(results, args.personalised)
    print(text)
    print(f"\ndata: {json.dumps(results.get('data'))}\ndate: {results.get('date')}")
    return text


if __name__ == "__main__":
    main()
