"""How big each loss term was, round by round, in a finished ``fedseg bench``: the train metrics an objective reports
about its own terms (FVAC's ``record_terms``: FVDA's share of the loss, its gradient norm over the main term's), read
from each run's server report and kept per round, site and seed.

The sites send these as scalars of their own training, like ``train_loss``; nothing here is re-trained. The output
carries the bench's header (its command, code version, machine and date), so the table it renders names the bench
the terms were measured in.

Usage:
    python benchmarks/ablations/term_sizes.py --bench BENCH_OUT --labels fvac fvac-fvda-only --out DIR
        [--metrics fvda_loss_share fvda_grad_ratio main_loss fvda_loss]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]

#: FVAC's term metrics (``objectives/fvac.py``, ``record_terms``)
FVAC_TERMS = ("fvda_loss_share", "fvda_grad_ratio", "main_loss", "fvda_loss")


def run_terms(report: Dict[str, Any], metrics: Sequence[str]) -> List[Dict[str, Dict[str, Optional[float]]]]:
    """Per round (in order), per site: each of ``metrics`` from a server ``report.json`` (None where a site did not
    report it that round)."""
    return [{site: {m: values.get(m) for m in metrics} for site, values in sorted(r["metrics"].items())}
            for r in report["rounds"]]


def method_reports(bench: Path, label: str) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    """``(run record, server report)`` of each seed's method run labelled ``label`` in a finished bench, by seed.

    Raises:
        SystemExit: a label the bench did not run, or a run whose report is gone (what is read comes from it).
    """
    records = [json.loads(p.read_text()) for p in sorted((bench / "runs").glob("*.json"))]
    runs = sorted((r for r in records if r.get("label") == label and r.get("kind") == "method"), key=lambda r: r["seed"])
    if not runs:
        raise SystemExit(f"{bench}: no method run labelled {label!r} (labels: {sorted({r.get('label') for r in records})})")
    out = []
    for record in runs:
        report_path = Path(record["report_path"])
        if not report_path.is_file():
            raise SystemExit(f"{record['id']}: its report {report_path} is gone (what is read here comes from it)")
        out.append((record, json.loads(report_path.read_text())))
    return out


def bench_header(bench: Path) -> Dict[str, Any]:
    """The finished bench's own header (what a caption names: data, seeds, budget, machine, date, code)."""
    header_path = bench / "results.json"
    if not header_path.is_file():
        raise SystemExit(f"{bench}: no results.json (the bench has not finished)")
    header = json.loads(header_path.read_text())
    return {k: header.get(k) for k in ("benchmark", "command", "date", "code_version", "run_code_versions", "machine",
                                       "budget", "spatial", "site_datalists", "data", "seeds", "sites")}


def collect(bench: Path, labels: Sequence[str], metrics: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``{label: {seed: per-round terms}}`` of the bench's method runs of ``labels``.

    Raises:
        SystemExit: a label the bench did not run, a run whose report is gone, or one whose sites reported none of
            ``metrics`` (the objective ran without recording its terms).
    """
    out: Dict[str, Dict[str, Any]] = {}
    for label in labels:
        out[label] = {}
        for record, report in method_reports(bench, label):
            terms = run_terms(report, metrics)
            if not any(v is not None for rnd in terms for site in rnd.values() for v in site.values()):
                raise SystemExit(f"{record['id']}: its sites reported none of {list(metrics)} (run it with record_terms)")
            out[label][str(record["seed"])] = {"variant_args": record.get("variant_args"), "rounds": terms}
    return out


def write_reading(benchmark: str, script: str, argv: Optional[Sequence[str]], header: Dict[str, Any], out: Path,
                  **fields: Any) -> Path:
    """Write ``<out>/<benchmark>.json``: what a script read back from a finished bench (``fields``), under the script's
    command and date and the bench's own ``header`` (:func:`bench_header`)."""
    result = {
        "benchmark": benchmark,
        "command": "python " + " ".join([os.path.relpath(script, REPO)] + list(argv if argv is not None else sys.argv[1:])),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "bench": header,
        **fields,
    }
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{benchmark}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return path


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", required=True, help="a finished fedseg bench output folder")
    parser.add_argument("--labels", nargs="+", required=True, help="the approaches whose terms to read")
    parser.add_argument("--metrics", nargs="+", default=list(FVAC_TERMS))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    bench = Path(args.bench).resolve()
    header = bench_header(bench)  # first: an unfinished bench is refused before its runs are read
    write_reading("term_sizes", __file__, argv, header, Path(args.out),
                  metrics=list(args.metrics), runs=collect(bench, args.labels, args.metrics))


if __name__ == "__main__":
    main()
