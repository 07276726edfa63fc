"""Does PathFL's feature alignment help at inference? Evaluate each final global PathFL model of a
``fedseg bench`` output twice on every site's test split — alignment layer on and off in eval mode — and
compare per test image (paired Wilcoxon / t-test, pooled over seeds and sites).

The trained weights are the same in both arms (``at_inference`` changes evaluation only), so the
difference is the alignment's effect at inference alone.

Usage:
    python benchmarks/accuracy/pathfl_afa_inference.py --bench /tmp/fedseg_bench/nuclei_source --label pathfl \
        [--out afa_inference.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from fedseg.bench.stats import paired_tests
from fedseg.engine import SegEngine


def evaluate_run(workspace: Path, site_datalists: dict) -> dict:
    ckpt = torch.load(next(workspace.rglob("FL_global_model.pt")), weights_only=False)
    state, train_config = ckpt["model"], ckpt["train_config"]
    if "bottleneck_alignment.active" not in state:
        raise SystemExit(f"{workspace}: this model has no alignment layer (AFA off)")
    rows = {}
    for site, datalist in site_datalists.items():
        engine = SegEngine(site, datalist, train_config, device=torch.device("cpu"))
        model = engine.build_network()
        model.load_state_dict(state)
        for flag in (1.0, 0.0):
            model.bottleneck_alignment.at_inference.fill_(flag)
            _, per_image = engine.evaluate(model, "test", metrics=("dice", "assd"), per_image=True)
            rows.setdefault(site, {})["on" if flag else "off"] = per_image
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="a fedseg bench --out folder")
    parser.add_argument("--label", default="pathfl", help="method label of the PathFL rows")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    bench = Path(args.bench)
    site_datalists = json.loads((bench / "site_datalists.json").read_text())
    on, off, per_run = {"dice": [], "assd": []}, {"dice": [], "assd": []}, {}
    for ws in sorted((bench / "workspaces").glob(f"method-{args.label}-seed*")):
        rows = evaluate_run(ws, site_datalists)
        per_run[ws.name] = {}
        for site, arms in rows.items():
            per_run[ws.name][site] = {arm: statistics.fmean(r["dice"] for r in arms[arm]) for arm in arms}
            for metric in on:
                for a, b in zip(arms["on"], arms["off"]):
                    if a.get(metric) is not None and b.get(metric) is not None:
                        on[metric].append(a[metric])
                        off[metric].append(b[metric])
        print(ws.name, json.dumps(per_run[ws.name]))
    result = {"runs": per_run, "tests": {m: paired_tests(on[m], off[m]) for m in on}}
    print(json.dumps(result["tests"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
