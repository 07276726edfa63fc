"""The weights PathFL's stratified similarity aggregation (SSA) gave each site, round by round, in a finished
``fedseg bench``, beside the sample-count weights it replaces: read from each run's server report (``ssa_sites``,
``ssa_weights``: per stratum, one convex weight per site), nothing re-trained.

With SSA off the server averages by training-sample count (``weighting="samples"``) or 1/K (``"uniform"``); SSA
ignores the counts and weighs each stratum by the sites' output similarity on noise. This table shows how far its
weights moved from 1/K and from the sample shares, so a reader can tell the similarity's effect from the weighting's.

Usage:
    python benchmarks/ablations/ssa_weights.py --bench BENCH_OUT --labels pathfl pathfl-noise512 --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

if __name__ == "__main__":  # run as a script: the repository root on the path, for the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.ablations.term_sizes import bench_header, method_reports, write_reading  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def run_ssa_weights(report: Dict[str, Any]) -> List[Dict[str, Dict[str, float]]]:
    """Per round (in order): ``{stratum: {site: weight}}`` from a server ``report.json`` (empty for a round the
    server did not aggregate with SSA).

    Raises:
        SystemExit: a report with no SSA weights in any round (the run had SSA off).
    """
    rounds = [{stratum: dict(zip(r["ssa_sites"], weights)) for stratum, weights in (r.get("ssa_weights") or {}).items()}
              for r in report["rounds"]]
    if not any(rounds):
        raise SystemExit(f"{report.get('method')}: no round of this report has SSA weights (was SSA off?)")
    return rounds


def collect(bench: Path, labels: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``{label: {seed: {"variant_args", "rounds": per-round SSA weights}}}`` of the bench's runs of ``labels``."""
    return {label: {str(record["seed"]): {"variant_args": record.get("variant_args"), "rounds": run_ssa_weights(report)}
                    for record, report in method_reports(bench, label)}
            for label in labels}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", required=True, help="a finished fedseg bench output folder")
    parser.add_argument("--labels", nargs="+", required=True, help="the approaches that ran with SSA on")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    bench = Path(args.bench).resolve()
    header = bench_header(bench)  # first: an unfinished bench is refused before its runs are read
    write_reading("ssa_weights", __file__, argv, header, Path(args.out), runs=collect(bench, args.labels))


if __name__ == "__main__":
    main()
