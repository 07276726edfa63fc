"""Training throughput of ``SegEngine.train`` (MONAI SupervisedTrainer + objective hook) vs a plain PyTorch loop.

Both paths train the same bundle ``FeatureUNet`` (same initial weights), with the same ``DiceCELoss``
(``engine.build_loss()``), the same optimiser (the bundle's Adam, a separate instance per model), the
same batch size and image size, in the same process, interleaved (A B, B A, A B, ...).

Data (``--data``):
  * ``memory`` (default): the site's training split is loaded and augmented ONCE into a list of
    batches held in memory; both paths iterate that same list (``SegEngine.loader`` is replaced on
    the instance), so data loading and augmentation are NOT measured — only the training loop.
  * ``loader``: both paths iterate the engine's real DataLoader (``engine.loader("training",
    shuffle=True, train=True)``: cached decoding/resizing, per-epoch random flips/rotations),
    i.e. what a federated round actually pays.
  * ``both``: one table row per mode.

One timed call = ``--epochs`` epochs over the training split. For the engine that is one
``engine.train(model, ClientObjective(), ctx)`` call (it builds a fresh SupervisedTrainer each call,
exactly as a federated round does, so that construction cost is included). A third path, ``plain_control``
(a second identical plain loop; ``--no-control`` drops it), measures the noise floor of the machine:
its ratio to ``plain`` should be ~1.0 and shows how far apart two identical loops land. Reported: median
images/s over ``--repeats`` timed calls per path (after one warm-up call each), the ratio
engine/plain of the medians, and the median process CPU seconds per call (CPU time is less
sensitive than wall time to other jobs on a shared machine).

Volumes (``--family prostate3d``): the same comparison on 3-D patches (or ``--spatial-mode slices``), the built-in
MR site resampled to its family's target spacing; throughput also as voxels/s (every patch's voxels per second).

``--amp float16|bfloat16`` trains both paths under ``torch.autocast`` (the engine through its ``amp`` option;
float16 with a gradient scaler, CUDA only). On CUDA every timed call ends with ``torch.cuda.synchronize()``.
``benchmarks/gpu/gpu_check.py`` runs :func:`bench_mode` at 256 and 512 px, float32 and AMP.

Usage:
    python benchmarks/gpu/engine_throughput.py --out /tmp/engine_throughput.json [--data both]
        [--image-size 64] [--batch-size 4] [--epochs 2] [--repeats 7] [--threads 0] [--amp float16]
    python benchmarks/gpu/engine_throughput.py --family prostate3d [--spatial-mode slices] [--patch-size "[64,64,16]"]
        --batch-size 2 --out /tmp/engine_throughput_3d.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

from fedseg.bench.simulator import machine_info
from fedseg.data.synthetic.volumes import VOLUME_FAMILIES
from fedseg.engine.base import backward_step
from fedseg.markdown import markdown_table


def _sync() -> None:
    """Wait for queued CUDA work, so that a timed call includes it (no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn: Callable[[], Any]) -> Dict[str, float]:
    _sync()
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    fn()
    _sync()
    return {"wall": time.perf_counter() - start_wall, "cpu": time.process_time() - start_cpu}


def plain_train(model: torch.nn.Module, loss_fn: torch.nn.Module, optimizer: torch.optim.Optimizer,
                batches_fn: Callable[[], Any], epochs: int, device: torch.device,
                amp: Optional[torch.dtype] = None) -> float:
    """The reference: a textbook PyTorch training loop (loss.item() per step for logging); with ``amp`` the
    forward pass runs under ``torch.autocast`` (float16: with a gradient scaler, as torch's AMP recipe)."""
    model.train()
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
    losses: List[float] = []
    for _ in range(epochs):
        for batch in batches_fn():
            inputs = batch["image"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=amp or torch.float32, enabled=amp is not None):
                loss = loss_fn(model(inputs), labels)
            backward_step(loss, optimizer, scaler)
            losses.append(loss.item())
    return sum(losses) / max(len(losses), 1)


def bench_mode(mode: str, datalist: Path, args: argparse.Namespace) -> Dict[str, Any]:
    from fedseg.config import resolve_profile
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext

    amp_name = getattr(args, "amp", None)
    if args.family in VOLUME_FAMILIES:
        from fedseg.data.checks import federation_label_config
        from fedseg.data.volumes import federation_volume_config

        fields = {**federation_label_config({"site-1": str(datalist)}), **federation_volume_config({"site-1": str(datalist)})}
        cfg = resolve_profile("default", batch_size=args.batch_size, local_epochs=args.epochs, spatial_mode=args.spatial_mode,
                              amp=amp_name, **({"patch_size": args.patch_size} if args.patch_size else {}), **fields)["train_config"]
    else:
        cfg = resolve_profile("default", image_size=args.image_size, batch_size=args.batch_size,
                              local_epochs=args.epochs, amp=amp_name)["train_config"]
    engine = SegEngine("site-1", datalist, cfg)
    device = engine.device
    amp = engine.autocast_dtype()  # the engine's own check of the option (float16 needs CUDA)
    real_loader = engine.loader("training", shuffle=True, train=True)
    if mode == "memory":
        batches = [{k: v for k, v in b.items() if k in ("image", "label")} for b in real_loader]
        engine.loader = lambda *a, **k: batches  # noqa: E731 - the engine iterates the same in-memory batches
        batches_fn = lambda: batches  # noqa: E731
    else:
        batches_fn = lambda: real_loader  # noqa: E731
    n_images = engine.n_train * args.epochs

    model_engine = engine.build_network()
    objective = ClientObjective()
    ctx = RoundContext(site="site-1", round=0, total_rounds=1, train_config=cfg)
    runs = {"engine": lambda: engine.train(model_engine, objective, ctx)}

    def plain_runner():
        # a distinct copy with the same initial weights (build_network may hand back a cached instance
        # with older fedseg versions; the optimiser is keyed per model object, so each path gets its own)
        model = copy.deepcopy(model_engine)
        loss_fn, optimizer = engine.build_loss(), engine.make_optimizer(model)
        return lambda: plain_train(model, loss_fn, optimizer, batches_fn, args.epochs, device, amp)

    runs["plain"] = plain_runner()
    if args.control:
        # A/A noise control: a second, identical plain loop; plain_control/plain shows the noise floor
        runs["plain_control"] = plain_runner()
    for fn in runs.values():  # warm-up (allocator, first-call overheads)
        fn()
    names = list(runs)
    times: Dict[str, List[Dict[str, float]]] = {k: [] for k in runs}
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]  # rotate who goes first
        for name in order:
            times[name].append(_time(runs[name]))

    # voxels (pixels) the network trains on per call: every patch of every batch
    voxels = sum(int(b["label"][0].numel()) * int(b["label"].shape[0]) for b in batches_fn()) * args.epochs
    out: Dict[str, Any] = {"mode": mode, "n_train": engine.n_train, "images_per_call": n_images, "voxels_per_call": voxels,
                           "patch": list(engine.parser.get_parsed_content("crop_size")) if engine.volumes else None, "paths": {},
                           "device": str(device), "amp": amp_name, "image_size": args.image_size}
    for name, ts in times.items():
        ips = [n_images / t["wall"] for t in ts]
        out["paths"][name] = {
            "images_per_s": ips,
            "median_images_per_s": statistics.median(ips),
            # best-of-N: the least disturbed call; on a shared machine the robust speed estimate
            "best_images_per_s": max(ips),
            "median_wall_s": statistics.median(t["wall"] for t in ts),
            "median_cpu_s": statistics.median(t["cpu"] for t in ts),
            "median_voxels_per_s": statistics.median(voxels / t["wall"] for t in ts),
        }
    e, p = out["paths"]["engine"], out["paths"]["plain"]
    out["ratio_images_per_s"] = e["median_images_per_s"] / p["median_images_per_s"]
    out["ratio_best_images_per_s"] = e["best_images_per_s"] / p["best_images_per_s"]
    # per-repeat paired ratio (the two calls of one repeat ran back to back)
    paired = [p_t["wall"] / e_t["wall"] for e_t, p_t in zip(times["engine"], times["plain"])]
    out["median_paired_ratio"] = statistics.median(paired)
    out["ratio_cpu"] = p["median_cpu_s"] / e["median_cpu_s"]
    if "plain_control" in out["paths"]:
        c = out["paths"]["plain_control"]
        out["control_ratio_images_per_s"] = c["median_images_per_s"] / p["median_images_per_s"]
        out["control_ratio_best_images_per_s"] = c["best_images_per_s"] / p["best_images_per_s"]
    return out


def throughput_table(results: List[Dict[str, Any]]) -> List[str]:
    """The printed table of :func:`bench_mode` results: one row per data mode, medians (best) of both paths."""
    rows = []
    for r in results:
        e, p = r["paths"]["engine"], r["paths"]["plain"]
        control = (f"{r['control_ratio_images_per_s']:.3f} ({r['control_ratio_best_images_per_s']:.3f})"
                   if "control_ratio_images_per_s" in r else "-")
        rows.append([r["mode"], str(r["images_per_call"]), f"{e['median_images_per_s']:.1f} ({e['best_images_per_s']:.1f})",
                     f"{p['median_images_per_s']:.1f} ({p['best_images_per_s']:.1f})", f"{r['ratio_images_per_s']:.3f}",
                     f"{r['median_paired_ratio']:.3f}", f"{r['ratio_best_images_per_s']:.3f}", control,
                     f"{e['median_cpu_s']:.2f}", f"{p['median_cpu_s']:.2f}",
                     f"{e['median_voxels_per_s'] / 1e6:.2f}M / {p['median_voxels_per_s'] / 1e6:.2f}M"])
    return markdown_table(["data", "train images/call", "engine img/s median (best)", "plain img/s median (best)",
                           "ratio engine/plain: medians", "paired (median)", "best",
                           "A/A control plain2/plain: medians (best)", "CPU s/call engine", "CPU s/call plain",
                           "engine / plain voxels/s (median)"], rows)


def main(argv=None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--data", choices=["memory", "loader", "both"], default="both")
    parser.add_argument("--family", choices=["polyp", "vessel", "nuclei", "fundus"] + list(VOLUME_FAMILIES), default="polyp",
                        help="built-in family; prostate3d = MR volumes (3-D patches, or --spatial-mode slices)")
    parser.add_argument("--spatial-mode", default="patch", choices=["patch", "slices"], help="volume families only")
    parser.add_argument("--patch-size", type=json.loads, default=None, help="volume families: e.g. [64,64,16] (JSON)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per timed call")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the A/A control (a second identical plain loop that measures the noise floor)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch default)")
    parser.add_argument("--amp", choices=["float16", "bfloat16"], default=None,
                        help="autocast dtype of both paths (float16: CUDA only, with a gradient scaler)")
    parser.add_argument("--data-dir", default=None, help="where the synthetic site is generated (default: a temp dir)")
    args = parser.parse_args(argv)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from fedseg.bench.bench import code_version
    from fedseg.data.synthetic import generate_federation

    tmp = None
    data_dir = args.data_dir
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="fedseg_bench_data_")
        data_dir = tmp.name
    datalist = generate_federation(args.family, ["site-1"], data_dir, profile="default")["site-1"]

    modes = ["memory", "loader"] if args.data == "both" else [args.data]
    machine = machine_info()  # the load before the timings (this machine may be shared)
    results = [bench_mode(m, datalist, args) for m in modes]
    report = {
        "benchmark": "engine_throughput",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
        "code_version": code_version(),
        "machine": {**machine, "torch_threads": torch.get_num_threads(), "device": "cuda" if torch.cuda.is_available() else "cpu"},
        "settings": {"family": args.family, "image_size": args.image_size, "batch_size": args.batch_size,
                     "epochs_per_call": args.epochs, "repeats": args.repeats, "spatial_mode": args.spatial_mode,
                     "patch_size": args.patch_size, "amp": args.amp},
        "results": results,
    }
    print(f"\nEngine throughput — {args.family}, {args.image_size}px, batch {args.batch_size}, "
          f"{args.epochs} epochs/call, {args.repeats} interleaved repeats, torch threads {torch.get_num_threads()}\n")
    print("\n".join(throughput_table(results)))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.out}")
    if tmp is not None:
        tmp.cleanup()
    return report


if __name__ == "__main__":
    main()
