"""What a third class costs: FedAvg on the same built-in ``fundus`` images with C = 3 (background / rim / cup) and
with C = 2 (background / disc: the same masks, rim and cup stored values both mapped to one class), in one run.

Per label space, ``fedseg bench`` runs FedAvg (``--seeds``, default budget unless told otherwise; no references) and
this script reads back from each run's ``report.json``: the median round wall time (first round left out), the
median over rounds and sites of the site's train-task compute time, the sites' peak resident memory (``peak_memory_mb``
each site reports with its weights: the largest over rounds and sites), and the bytes a site uploads per round (only
the network's last layer grows with C). Ratios are C = 3 over C = 2 in the same run.

Then, in one process and interleaved (less exposed to other jobs than two separate benches): the median local
epoch and test-split evaluation of one site's engine with C = 3 and with C = 2, and their ratios.

Usage:
    python benchmarks/cost/multiclass_cost.py --out bench_out/multiclass_cost [--seeds 0] [--rounds R]
        [--sites site-1 site-2 site-3] [--data-profile default] [--repeats 5]
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

from fedseg.processes import StopOnSignal
from fedseg.markdown import markdown_table


def binary_copies(mapping: Dict[str, str], out: Path) -> Dict[str, str]:
    """Disc-only datalists of the same files: ``label_values`` maps rim (128) and cup (0) both to class 1."""
    copies = {}
    for site, path in mapping.items():
        data = json.loads(Path(path).read_text())
        for split in ("training", "validation", "test"):
            for entry in data[split]:
                entry["image"] = str(Path(path).parent / entry["image"])
                entry["label"] = str(Path(path).parent / entry["label"])
        data.update(labels={"background": 0, "disc": 1}, label_values={"255": 0, "128": 1, "0": 1},
                    allow_external_paths=True)
        data.pop("regions", None)
        target = out / "binary" / site / "datalist.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data, indent=1))
        copies[site] = str(target)
    return copies


def run_bench(out: Path, extra: List[str]) -> Dict[str, Any]:
    cmd = ["fedseg", "bench", "--methods", "fedavg", "--references", "--out", str(out)] + extra
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def read_costs(results: Dict[str, Any]) -> Dict[str, Any]:
    rounds_wall, compute, memory, upload = [], [], [], []
    for path in results["methods"]["fedavg"]["report_paths"]:
        report = json.loads(Path(path).read_text())
        walls = [r["wall_time"] for r in report["rounds"]]
        rounds_wall += walls[1:] or walls
        for r in report["rounds"][1:] or report["rounds"]:
            compute += [m["compute_time"] for m in r["metrics"].values() if m.get("compute_time") is not None]
        memory += [m["peak_memory_mb"] for r in report["rounds"] for m in r["metrics"].values() if m.get("peak_memory_mb")]
        upload += [r["bytes_received"] / len(report["clients"]) / 1e6 for r in report["rounds"] if r.get("bytes_received")]
    timing = results["timing"]["fedavg"]
    return {
        "median_round_wall_s": statistics.median(rounds_wall),
        "median_site_compute_s": statistics.median(compute),
        "peak_site_memory_mb": max(memory),
        "upload_mb_per_site_round": statistics.median(upload),
        "job_wall_s": timing["wall_s_per_run"]["mean"],
        "mean_test_dice": results["approaches"]["fedavg"]["summary"]["mean"]["dice"]["mean"],
    }


def interleaved_engine_cost(c3: Dict[str, str], c2: Dict[str, str], repeats: int, threads: int = 1) -> Dict[str, Any]:
    """In one process, alternating C = 3 and C = 2 on the same site's images: median seconds of one local epoch
    (``engine.train``) and of a test-split evaluation (Dice / HD95 / ASSD, per class and region for C = 3), and their
    ratios. The engine-level cost without the simulator's per-task overhead, less exposed to other jobs on the machine
    than two separate benches."""
    import time

    import torch

    from fedseg.config import resolve_profile
    from fedseg.data.checks import federation_label_config
    from fedseg.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext

    torch.set_num_threads(threads)
    site = sorted(c3)[0]
    engines, models = {}, {}
    for name, mapping in (("C=3", c3), ("C=2", c2)):
        cfg = resolve_profile("default", **federation_label_config({site: mapping[site]}))["train_config"]
        engines[name] = SegEngine(site, mapping[site], cfg)
        models[name] = engines[name].build_network()
    times: Dict[str, Dict[str, List[float]]] = {n: {"train": [], "evaluate": []} for n in engines}
    for rep in range(repeats + 1):  # the first round fills the caches and is not counted
        for name in (list(engines) if rep % 2 == 0 else list(engines)[::-1]):
            engine, model = engines[name], models[name]
            ctx = RoundContext(site=site, round=rep, total_rounds=repeats + 1, train_config=engine.train_config)
            started = time.perf_counter()
            engine.train(model, ClientObjective(), ctx)
            middle = time.perf_counter()
            engine.evaluate(model, "test")
            if rep:
                times[name]["train"].append(middle - started)
                times[name]["evaluate"].append(time.perf_counter() - middle)
    out = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    out["ratio"] = {k: out["C=3"][k] / out["C=2"][k] for k in ("train", "evaluate")}
    out["site"], out["repeats"], out["threads"] = site, repeats, threads
    return out


@StopOnSignal("multiclass_cost")  # SIGTERM / Ctrl-C end the runs it started too
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", nargs="+", default=["0"])
    parser.add_argument("--rounds", default=None)
    parser.add_argument("--sites", nargs="+", default=["site-1", "site-2", "site-3"])
    parser.add_argument("--data-profile", default="default")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved in-process repeats (train epoch + evaluation)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    common = ["--seeds", *args.seeds] + (["--rounds", args.rounds] if args.rounds else [])
    three = run_bench(out / "c3", ["--family", "fundus", "--sites", *args.sites, "--data-profile", args.data_profile] + common)
    mapping = binary_copies(three["site_datalists"], out)
    (out / "binary" / "site_datalists.json").write_text(json.dumps(mapping, indent=1))
    two = run_bench(out / "c2", ["--site-datalists", str(out / "binary" / "site_datalists.json")] + common)
    costs = {"C=3": read_costs(three), "C=2": read_costs(two)}
    engine_cost = interleaved_engine_cost(three["site_datalists"], mapping, args.repeats)
    ratio = {k: costs["C=3"][k] / costs["C=2"][k] for k in
             ("median_round_wall_s", "median_site_compute_s", "peak_site_memory_mb", "upload_mb_per_site_round")}
    from fedseg.bench.bench import code_version

    record = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "command": " ".join(sys.argv),
              "code_version": code_version(), "machine": three.get("machine"), "budget": three.get("budget"), "costs": costs, "ratio_c3_over_c2": ratio,
              "interleaved_engine": engine_cost}
    (out / "multiclass_cost.json").write_text(json.dumps(record, indent=1))
    rows = [[name, f"{c['median_round_wall_s']:.2f}", f"{c['median_site_compute_s']:.2f}", f"{c['peak_site_memory_mb']:.0f}",
             f"{c['upload_mb_per_site_round']:.4f}"] for name, c in costs.items()]
    rows.append(["ratio C=3 / C=2", f"{ratio['median_round_wall_s']:.3f}", f"{ratio['median_site_compute_s']:.3f}",
                 f"{ratio['peak_site_memory_mb']:.3f}", f"{ratio['upload_mb_per_site_round']:.4f}"])
    lines = markdown_table(["label space", "median round wall (s)", "median site compute (s)", "peak site memory (MB)",
                            "upload per site per round (MB)"], rows)
    lines += ["", f"In one process, interleaved ({args.repeats} repeats, site {engine_cost['site']}, one torch thread): "
              f"median local epoch {engine_cost['C=3']['train']:.2f} s (C=3) vs {engine_cost['C=2']['train']:.2f} s (C=2), "
              f"ratio {engine_cost['ratio']['train']:.3f}; test-split evaluation {engine_cost['C=3']['evaluate']:.2f} s vs "
              f"{engine_cost['C=2']['evaluate']:.2f} s, ratio {engine_cost['ratio']['evaluate']:.3f}."]
    text = "\n".join(lines)
    (out / "multiclass_cost.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
