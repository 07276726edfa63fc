"""Patch mode vs resize mode on one machine: training throughput, evaluation time and cache memory per site.

For each site of a site -> datalist map (e.g. the retina federation from ``fedseg data retina``) and each
mode, in one process with one torch thread:

* ``train``: median over ``--repeats`` timed calls of ``engine.train`` (one local epoch each, after a
  warm-up epoch that also fills the cache): images/s (training images per second) and, in patch mode,
  patches/s (``patch_samples`` patches per image);
* ``eval``: seconds to evaluate the test split at each image's own size (sliding window in patch mode,
  one resized pass in resize mode), i.e. what a final evaluation costs;
* ``cache_mb``: decoded-image cache booked by the site's engine after training and evaluation
  (``fedseg.engine.cache``: training grid + evaluation at original size), and the process's peak RSS.

Usage:
    python benchmarks/fullsize/native_resolution.py --site-datalists /tmp/retina/site_datalists.json \\
        --out /tmp/fedseg_bench/native_resolution.json [--image-size 128] [--patch-size 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict

import torch

from fedseg.bench.simulator import machine_info


def measure(site: str, datalist: str, cfg: Dict[str, Any], repeats: int) -> Dict[str, Any]:
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext

    engine = SegEngine(site, datalist, cfg)
    model = engine.build_network()
    ctx = RoundContext(site=site, round=0, total_rounds=1, train_config=cfg)
    engine.train(model, ClientObjective(), ctx)  # warm-up: fills the cache
    walls = []
    for _ in range(repeats):
        started = time.perf_counter()
        engine.train(model, ClientObjective(), ctx)
        walls.append(time.perf_counter() - started)
    wall = statistics.median(walls)
    started = time.perf_counter()
    metrics = engine.evaluate(model, "test")
    eval_s = time.perf_counter() - started
    k = int(engine.train_config["patch_samples"]) if engine.spatial_mode == "patch" else 1
    return {
        "mode": engine.spatial_mode,
        "n_train": engine.n_train,
        "n_test": len(engine.data["test"]),
        "epoch_s": wall,
        "images_per_s": engine.n_train / wall,
        "patches_per_s": engine.n_train * k / wall,
        "pixels_per_step": (int(cfg["patch_size"]) if engine.spatial_mode == "patch" else int(cfg["image_size"])) ** 2 * k * int(cfg["batch_size"]),
        "test_eval_s": eval_s,
        "test_eval_s_per_image": eval_s / max(len(engine.data["test"]), 1),
        "cache_mb": engine.cache.used_mb,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "test_dice_after_warmup": metrics.get("dice"),
    }


def main(argv=None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site-datalists", required=True)
    parser.add_argument("--out", default="/tmp/fedseg_bench/native_resolution.json")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--patch-size", type=int, default=64)
    parser.add_argument("--patch-samples", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from fedseg.config import resolve_profile

    mapping = json.loads(Path(args.site_datalists).read_text())
    results: Dict[str, Any] = {
        "benchmark": "native_resolution",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python " + " ".join([sys.argv[0]] + (list(argv) if argv is not None else sys.argv[1:])),
        "machine": machine_info(),
        "torch_threads": 1,
        "sites": {},
    }
    for mode in ("patch", "resize"):
        cfg = resolve_profile("default", spatial_mode=mode, image_size=args.image_size, patch_size=args.patch_size,
                              patch_samples=args.patch_samples, batch_size=args.batch_size)["train_config"]
        for site, datalist in mapping.items():
            row = measure(site, datalist, cfg, args.repeats)
            results["sites"].setdefault(site, {})[mode] = row
            print(f"{site:10s} {mode:6s} {row['images_per_s']:6.2f} img/s  {row['patches_per_s']:6.1f} patches/s  "
                  f"test eval {row['test_eval_s_per_image']:.2f} s/img  cache {row['cache_mb']:.0f} MB", flush=True)
    total = {m: sum(r[m]["cache_mb"] for r in results["sites"].values()) for m in ("patch", "resize")}
    results["federation_cache_mb"] = total
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"cache for the whole federation: {total}; wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
