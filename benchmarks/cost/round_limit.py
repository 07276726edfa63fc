"""How close a federated round runs to the device's pace: the suite's round wall against the limit, in one run.

    python benchmarks/round_limit.py --out OUT --methods fedavg fedevi                 # built-in polyp, 3 sites, default
    python benchmarks/round_limit.py --out OUT --methods fedavg --sites site-1 site-2 site-3 site-4 \\
        --profile paper --protocol fedevi --data-profile gpu --rounds 6 --set amp=bfloat16

1. **The suite's round**: ``fedseg bench`` (NVFlare's simulator, one process per site, the jobs' settings) for the
   methods, ``--rounds`` rounds, one seed; per method the median round wall over rounds 1.. (round 0 apart: it holds
   the sites' start-up), each task's deliver / site / return split (``report.json``'s ``task_breakdown``) and the
   sites' own compute.
2. **The limit**: for every site, a plain PyTorch loop over the same training batches already resident on the
   device (the site's cached split, augmented once by the engine's own batch pipeline, ``fedseg.engine.resident``)
   for the round's local epochs, with the same network, optimiser, loss and precision as the run's
   ``train_config``, then the forward pass over its validation images (held on the device, ``eval_batch_size`` at a
   time) — no data pipeline, no framework, no method terms. Timed after a warm-up, median of ``--repeats``.
   * ``limit`` = the slowest site alone on the device (what the round could take if nothing else ran);
   * ``shared limit`` = every site's loop at once, one process per site with the simulator's threads per site, the
     wall from a common start to the last site's end: the floor of a round whose sites share one machine (on 2 CPU
     cores, 3 sites cannot each have a core; on one GPU, 4 sites take turns on it).
3. The ratios round wall / limit and round wall / shared limit, per method.

Writes ``OUT/round_limit.json`` (machine, command, every number) and prints a table. CPU and CUDA alike; on CUDA
every timed loop ends with a synchronisation.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import multiprocessing as mp
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import torch

from fedseg.bench.simulator import machine_info
from fedseg.processes import StopOnSignal

if __name__ == "__main__":  # run as a script: the repository root on the path, for the package `benchmarks`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def site_loop(site: str, datalist: str, train_config: Dict[str, Any], device: str, seed: int = 0):
    """``(train(), validate())``: the plain loop of one site and its validation forward, on ``device``, with the
    site's batches for one round (``local_epochs`` epochs) already resident and augmented there."""
    from fedseg.engine.base import backward_step
    from fedseg.engine.engine import SegEngine
    from fedseg.engine.resident import ResidentLoader, resident_training_data

    dev = torch.device(device)
    engine = SegEngine(site, datalist, train_config, device=dev)
    model = engine.build_network()
    optimizer = engine.make_optimizer(model)
    loss_fn = engine.build_loss()
    data = resident_training_data(engine._dataset("training", True), dev, engine.train_config, engine.num_classes)
    if data is None:
        raise RuntimeError(f"{site}: the training split cannot be held on the device (resident_data)")
    generator = torch.Generator().manual_seed(seed)
    epochs = engine.local_epochs()
    batches = [b for _ in range(epochs) for b in ResidentLoader(data, generator)]
    held = engine.evaluation.hold_split("validation") if engine.spatial_mode == "resize" and not engine.volumes else None
    val_images = held[0] if held is not None else None
    amp = engine.autocast_dtype()
    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
    step = max(int(engine.train_config.get("eval_batch_size") or 16), 1)
    layout = engine.memory_format()
    if layout is not None:
        model.to(memory_format=layout)
        batches = [{**b, "image": b["image"].contiguous(memory_format=layout)} for b in batches]

    def train() -> None:
        model.train()
        for b in batches:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=dev.type, dtype=amp or torch.float32, enabled=amp is not None):
                loss = loss_fn(model(b["image"]), b["label"])
            backward_step(loss, optimizer, scaler)
        _sync(dev)

    @torch.no_grad()
    def validate() -> None:
        if val_images is None:
            return
        model.eval()
        for i in range(0, len(val_images), step):
            model(val_images[i:i + step])
        model.train()
        _sync(dev)

    return train, validate, {"train_batches": len(batches), "train_images": sum(len(b["image"]) for b in batches),
                             "validation_images": 0 if val_images is None else len(val_images)}


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def time_site(site: str, datalist: str, train_config: Dict[str, Any], device: str, repeats: int) -> Dict[str, Any]:
    """One site alone: median seconds of its round's steps and of its validation forward (after a warm-up)."""
    train, validate, sizes = site_loop(site, datalist, train_config, device)
    train(), validate()  # warm-up: allocator, kernels, autotuning
    steps = [_timed(train) for _ in range(repeats)]
    forward = [_timed(validate) for _ in range(repeats)]
    return {**sizes, "steps_s": statistics.median(steps), "validation_s": statistics.median(forward),
            "round_s": statistics.median(steps) + statistics.median(forward)}


def _shared_worker(args) -> None:
    site, datalist, train_config, device, threads, repeats, barrier, queue = args
    if threads:
        torch.set_num_threads(int(threads))
    train, validate, _ = site_loop(site, datalist, train_config, device)
    train(), validate()
    for _ in range(repeats):
        barrier.wait()
        started = time.time()
        train()
        validate()
        queue.put((site, started, time.time()))


def time_shared(sites: Dict[str, str], train_config: Dict[str, Any], device: str, threads: Optional[int],
                repeats: int) -> Dict[str, Any]:
    """Every site's loop at once, one process per site (as the simulator runs them): median wall from the common start
    to the last site's end."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(len(sites)), ctx.Queue()
    procs = [ctx.Process(target=_shared_worker, args=((s, d, train_config, device, threads, repeats, barrier, queue),))
             for s, d in sites.items()]
    for p in procs:
        p.start()
    rows = [queue.get() for _ in range(len(sites) * repeats)]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a shared-limit worker failed (exit code {p.exitcode})")
    walls = []
    for r in range(repeats):
        batch = rows[r * len(sites):(r + 1) * len(sites)]
        walls.append(max(e for _, _, e in batch) - min(s for _, s, _ in batch))
    return {"round_s": statistics.median(walls), "walls": walls}


def run_bench(out: Path, args: argparse.Namespace) -> Dict[str, Any]:
    """``fedseg bench`` for the methods (one seed); returns its results.json."""
    cmd = ["fedseg", "bench", "--methods", *args.methods, "--references", "--seeds", str(args.seed), "--rounds", str(args.rounds),
           "--out", str(out), "--family", args.family, "--data-profile", args.data_profile]
    if args.sites:
        cmd += ["--sites", *args.sites]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.protocol:
        cmd += ["--protocol", args.protocol]
    if args.local_epochs:
        cmd += ["--local-epochs", str(args.local_epochs)]
    if args.set:
        cmd += ["--set", *args.set]
    if args.omp_threads:
        cmd += ["--omp-threads", args.omp_threads]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads((out / "results.json").read_text())


def suite_rounds(results: Dict[str, Any], out: Path) -> Dict[str, Dict[str, Any]]:
    """Per method: round walls, median over rounds 1.., round 0, the task split and the slowest site's compute."""
    rows: Dict[str, Dict[str, Any]] = {}
    for run_id in results["runs"]:
        record = json.loads((out / "runs" / f"{run_id}.json").read_text())
        if record.get("kind") != "method":
            continue
        report = json.loads(Path(record["report_path"]).read_text())
        walls = [r["wall_time"] for r in report["rounds"]]
        later = report["rounds"][1:] or report["rounds"]
        breakdown: Dict[str, Dict[str, float]] = {}
        for task in sorted({t for r in later for t in r.get("task_breakdown", {})}):
            parts = [r["task_breakdown"][task] for r in later if task in r.get("task_breakdown", {})]
            breakdown[task] = {k: statistics.median(p[k] for p in parts) for k in ("deliver", "site", "return", "total")}
        compute = [max(m.get("compute_time", 0.0) for m in r["metrics"].values()) for r in later if r["metrics"]]
        rows[record["label"]] = {
            "round_walls": walls, "round0_s": walls[0], "median_round_s": statistics.median(walls[1:] or walls),
            "tasks_per_round": statistics.median(len(r.get("task_breakdown", {})) for r in later),
            "task_breakdown": breakdown, "slowest_site_compute_s": statistics.median(compute) if compute else None,
            "train_config": record["train_config"],
        }
    return rows


def device_info(device: torch.device) -> Dict[str, Any]:
    """The machine (:func:`fedseg.bench.simulator.machine_info`, with its load now) and the device the loops run on."""
    info = machine_info()
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
    else:
        info["device"] = f"CPU ({platform.processor() or platform.machine()}, {info['cpu_count']} cores)"
    return info


@StopOnSignal("round_limit")  # SIGTERM / Ctrl-C end the bench and the loops it started too
def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    from fedseg.bench.bench import code_version

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--methods", nargs="+", default=["fedavg"])
    parser.add_argument("--family", default="polyp")
    parser.add_argument("--sites", nargs="+", default=None)
    parser.add_argument("--data-profile", default="default")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--protocol", default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--local-epochs", type=int, default=None)
    parser.add_argument("--set", nargs="*", default=None, metavar="KEY=VALUE")
    parser.add_argument("--omp-threads", default=None, help="threads per site process (the bench's; default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--skip-shared", action="store_true", help="only the slowest-site limit")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.perf_counter()
    machine = device_info(device)  # the load before the run starts (this machine may be shared)
    results = run_bench(out / "bench", args)
    suite = suite_rounds(results, out / "bench")
    sites = {s: str(p) for s, p in results["site_datalists"].items()}
    threads = int(args.omp_threads) if args.omp_threads and args.omp_threads.isdigit() else (
        1 if args.omp_threads is None else None)
    limits: Dict[str, Any] = {}
    for label, row in suite.items():
        cfg = row.pop("train_config")
        key = json.dumps({k: cfg.get(k) for k in sorted(cfg)}, sort_keys=True, default=str)
        if key not in limits:  # methods that share a local protocol share its limit
            if threads:
                torch.set_num_threads(threads)
            per_site = {s: time_site(s, d, cfg, str(device), args.repeats) for s, d in sites.items()}
            slowest = max(per_site, key=lambda s: per_site[s]["round_s"])
            entry: Dict[str, Any] = {"per_site": per_site, "slowest_site": slowest, "limit_s": per_site[slowest]["round_s"]}
            if not args.skip_shared and len(sites) > 1:
                entry["shared"] = time_shared(sites, cfg, str(device), threads, args.repeats)
                entry["shared_limit_s"] = entry["shared"]["round_s"]
            limits[key] = entry
        row["limit"] = limits[key]
        row["ratio_to_limit"] = row["median_round_s"] / row["limit"]["limit_s"]
        if "shared_limit_s" in row["limit"]:
            row["ratio_to_shared_limit"] = row["median_round_s"] / row["limit"]["shared_limit_s"]
    baseline = next((m for m in suite if m.startswith("fedavg")), None)
    for label, row in suite.items():
        if baseline:
            row["round_ratio_to_fedavg"] = row["median_round_s"] / suite[baseline]["median_round_s"]
    record = {
        "benchmark": "round_limit", "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/cost/round_limit.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine, "device_type": device.type, "code_version": code_version(), "sites": list(sites), "methods": suite,
        "wall_time_s": time.perf_counter() - started,
    }
    (out / "round_limit.json").write_text(json.dumps(record, indent=1, default=str))
    print(render(record))
    return record


def render(record: Dict[str, Any]) -> str:
    """The record as the cost page draws it (:func:`benchmarks.cost.render.round_limit_rows`), under the device."""
    from benchmarks.cost.render import round_limit_rows

    return "\n".join([f"{record['machine']['device']}: {len(record['sites'])} sites", "", *round_limit_rows(record)])


if __name__ == "__main__":
    main()
