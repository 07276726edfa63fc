"""The GPU check: one command that tests the CUDA paths and measures a GPU, then writes JSON + Markdown.

    python benchmarks/gpu/gpu_check.py --out gpu_check/            # on a CUDA machine: sized for under 8 minutes on one GPU
    python benchmarks/gpu/gpu_check.py --out /tmp/x --quick        # dry run of the script on CPU (tiny sizes)

Steps (each bounded in time; a failing step is recorded and the next one still runs):

1. ``pytest -m cuda``: the tests marked ``cuda`` (``tests/test_cuda.py``: engine training and evaluation on CUDA,
   float16 autocast with the gradient scaler, DP-SGD, a 2-site simulator job with ``-gpu 0``, a GPU checkpoint
   read on CPU). Without CUDA they skip, each with its reason; skips are not failures.
2. Engine throughput: ``SegEngine.train`` against a plain PyTorch loop, images/s, at 256 and 512 px, float32 and
   AMP (float16 with a gradient scaler on CUDA; bfloat16 on CPU, which has no float16 autocast), through
   ``benchmarks/gpu/engine_throughput.py``'s :func:`bench_mode` (same model, loss, optimiser and in-memory batches).
3. One federated round on one GPU: FedAvg, 4 sites, ``nvflare simulator -n 4 -t 4 -gpu 0`` (default profile,
   64 px), round time and each site's compute from ``report.json``.
4. A site training as N ranks: one FedAvg round at one site under ``torchrun`` (DDP, ``site_executor=
   "client_api_torchrun"``) with 1 rank, and with N where the machine has N > 1 GPUs; gloo with 2 ranks on CPU.

6. A round against the device's pace: ``benchmarks/cost/round_limit.py`` — FedAvg and FedEvi rounds (FedEvi's ``paper``
   protocol, 4 built-in polyp sites at 384 px) against the plain-loop limit of the same batches resident on the GPU.
7. The paper budget: FedEvi and GraphFedSeg, each against FedAvg under its own ``paper`` protocol, 4 built-in polyp
   sites at 384 px (``--data-profile gpu``), 200 rounds, the two benches at once (:func:`paper_budget_commands`);
   the wall of the whole, within 8 minutes on an H100 / H200 class GPU.

``--steps`` runs some steps only (a short lease: the tests and the limit in one call, the paper budget in the next);
the steps a file ``OUT/gpu_check.json`` already holds are kept.

Writes ``OUT/gpu_check.json`` (device named, date, command, every number), ``OUT/gpu_check.md`` (each step's table as
the GPU page, ``docs/results/gpu.md``, draws it: ``render.py``) and ``OUT/cuda_tests.xml`` (pytest's JUnit report).
Exit status: 0 when every step ran and no test failed, else 1.
``--quick`` shrinks every step (32 px, one repeat, tiny profile, one round) so that the script itself can be
checked on a CPU-only machine in a few minutes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import torch

from fedseg.processes import StopOnSignal

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a script: the repository root on the path, for the package `benchmarks`
    sys.path.insert(0, str(REPO))
from benchmarks.gpu.paper_budget import (  # noqa: E402
    PAPER_BUDGET_ROUNDS, PAPER_BUDGET_SETS, PAPER_BUDGET_SITES, paper_budget_commands,
)
from benchmarks.gpu.render import GPU_CHECK_PARTS, gpu_check_part  # noqa: E402

#: seconds each step may take before it is abandoned (the whole check must fit in 8 minutes on one GPU)
TEST_TIMEOUT_S = 300
SIM_TIMEOUT_S = 240
#: the paper budget's own limit (it must finish within 8 minutes on an H100 / H200 class GPU)
PAPER_BUDGET_TIMEOUT_S = 480
#: the steps, in the order they run
STEPS = ("cuda_tests", "round_limit", "engine_throughput", "engine_throughput_3d", "simulator_round", "site_ranks",
         "volume_networks_96", "paper_budget")


def device_info() -> Dict[str, Any]:
    """What the numbers were measured on: the machine (:func:`fedseg.bench.simulator.machine_info`), then the device
    the steps use (the first GPU: its name, memory, CUDA and cuDNN versions; else the CPU)."""
    from fedseg.bench.simulator import machine_info

    info: Dict[str, Any] = {**machine_info(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update({
            "device": torch.cuda.get_device_name(0), "cuda_version": torch.version.cuda,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1), "gpu_count": torch.cuda.device_count(),
            "cudnn": torch.backends.cudnn.version(),
        })
    else:
        info["device"] = f"CPU ({platform.processor() or platform.machine()})"
    return info


def _step(results: Dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """Run one step; its result or its error (type, message, traceback tail) goes into ``results[name]``."""
    started = time.perf_counter()
    print(f"\n== {name}", flush=True)
    try:
        results[name] = {"ok": True, "result": fn()}
    except BaseException as e:  # noqa: BLE001 - one broken step must not hide the others' numbers
        if isinstance(e, KeyboardInterrupt):
            raise
        results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        print(f"   FAILED: {results[name]['error']}", flush=True)
    results[name]["seconds"] = round(time.perf_counter() - started, 1)


# ---------------------------------------------------------------------------------------------- 1. tests
def _run_group(cmd: List[str], timeout: int) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the repository in its own process group; on timeout the whole group (pytest and the
    simulator processes it started) is killed and TimeoutExpired raised."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_cuda_tests(out: Path, timeout: int) -> Dict[str, Any]:
    """``pytest -m cuda`` in a subprocess; returns counts and every test's outcome (skip reasons included)."""
    xml = out / "cuda_tests.xml"
    # only the test files that use the marker: the others are not collected (a GPU machine may lack a dependency
    # that no CUDA test needs, e.g. POT for FedEFM's transport)
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}", *files]
    proc = _run_group(cmd, timeout)
    (out / "cuda_tests.log").write_text(proc.stdout + proc.stderr)
    cases = []
    if xml.is_file():
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome, detail = "passed", ""
            for kind in ("failure", "error", "skipped"):
                node = case.find(kind)
                if node is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                    detail = (node.get("message") or "")[:300]
            cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                          "seconds": float(case.get("time") or 0), "detail": detail})
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    # pytest exits 5 when nothing was collected; 0 = all passed or skipped
    if proc.returncode not in (0,) or counts["failed"] or counts["error"] or not cases:
        raise RuntimeError(f"pytest -m cuda exited {proc.returncode} ({counts}); see {out / 'cuda_tests.log'}:\n"
                           f"{(proc.stdout + proc.stderr)[-2000:]}")
    # the interpreter by name, the output folder as given: a record names no folder of the machine that ran it
    return {"command": " ".join(["python", *cmd[1:]]), "counts": counts, "cases": cases}


# ---------------------------------------------------------------------------------------------- 2. engine
def measure_engine(sizes: List[int], amp: Optional[str], data_profile: str, repeats: int, epochs: int,
                   batch_size: int) -> List[Dict[str, Any]]:
    """Engine vs plain loop images/s per (size, precision), in memory (data loading not measured)."""
    from benchmarks.gpu.engine_throughput import bench_mode

    from fedseg.data.synthetic import generate_federation

    rows = []
    with tempfile.TemporaryDirectory(prefix="fedseg_gpu_check_") as tmp:
        datalist = generate_federation("polyp", ["site-1"], tmp, profile=data_profile)["site-1"]
        for size in sizes:
            for precision in (None, amp):
                args = SimpleNamespace(image_size=size, batch_size=batch_size, epochs=epochs, repeats=repeats,
                                       control=False, amp=precision, family="vessel",
                                       spatial_mode=None, patch_size=None)
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                r = bench_mode("memory", Path(datalist), args)
                e, p = r["paths"]["engine"], r["paths"]["plain"]
                row = {
                    "image_size": size, "precision": precision or "float32", "device": r["device"],
                    "images_per_call": r["images_per_call"],
                    "engine_images_per_s": e["median_images_per_s"], "plain_images_per_s": p["median_images_per_s"],
                    "ratio_engine_to_plain": r["ratio_images_per_s"],
                    "peak_gpu_memory_mib": (round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None),
                }
                print(f"   {size} px {row['precision']}: engine {row['engine_images_per_s']:.1f} img/s, "
                      f"plain {row['plain_images_per_s']:.1f} img/s (x{row['ratio_engine_to_plain']:.2f})", flush=True)
                rows.append(row)
    return rows


def measure_engine_volumes(amp: Optional[str], data_profile: str, repeats: int, epochs: int,
                           batch_size: int) -> List[Dict[str, Any]]:
    """3-D: engine vs plain loop on the built-in prostate MR volumes (3-D patches of the volume bundle's default
    size), float32 and AMP, in voxels/s as well as patches/s."""
    from benchmarks.gpu.engine_throughput import bench_mode

    from fedseg.data.synthetic import generate_federation

    rows = []
    with tempfile.TemporaryDirectory(prefix="fedseg_gpu_check_3d_") as tmp:
        datalist = generate_federation("prostate3d", ["site-1"], tmp, profile=data_profile)["site-1"]
        for precision in (None, amp):
            args = SimpleNamespace(image_size=None, batch_size=batch_size, epochs=epochs, repeats=repeats, control=False,
                                   amp=precision, family="prostate3d", spatial_mode="patch", patch_size=None)
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            r = bench_mode("memory", Path(datalist), args)
            e, p = r["paths"]["engine"], r["paths"]["plain"]
            per_patch = r["voxels_per_call"] / max(r["images_per_call"], 1)
            row = {
                "patch": r["patch"], "precision": precision or "float32", "device": r["device"],
                "engine_volumes_per_s": e["median_images_per_s"], "plain_volumes_per_s": p["median_images_per_s"],
                "engine_mvoxels_per_s": e["median_images_per_s"] * per_patch / 1e6,
                "ratio_engine_to_plain": r["ratio_images_per_s"],
                "peak_gpu_memory_mib": (round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None),
            }
            print(f"   3-D {row['patch']} {row['precision']}: engine {row['engine_volumes_per_s']:.1f} volumes/s "
                  f"({row['engine_mvoxels_per_s']:.1f} Mvox/s), plain {row['plain_volumes_per_s']:.1f} "
                  f"(x{row['ratio_engine_to_plain']:.2f})", flush=True)
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- 3. simulator
def measure_simulator_round(out: Path, quick: bool, timeout: int) -> Dict[str, Any]:
    """FedAvg, 4 sites on one GPU (``-gpu 0``; no ``-gpu`` without CUDA): per-round wall time and site compute."""
    from fedseg.bench.simulator import round_timings, run_simulator
    from fedseg.recipes.export import export_job

    if shutil.which("nvflare") is None:
        raise RuntimeError("the nvflare command is not on PATH (pip install -e . installs it with its dependencies)")
    sites = [f"site-{i}" for i in range(1, 5)]
    profile, rounds = ("tiny", 1) if quick else ("default", 2)
    gpu = "0" if torch.cuda.is_available() else None
    job = export_job("fedavg", out / "sim" / "jobs", profile=profile, num_rounds=rounds)
    run = run_simulator(job, out / "sim" / "ws", sites, omp_threads="1", fedseg_threads="1", timeout=timeout,
                        log_path=out / "sim" / "simulator.log", gpu=gpu)
    report = run["report"]
    logs = "".join((out / "sim" / "ws" / s / "log.txt").read_text() for s in sites)
    return {
        "command": run["command"], "profile": profile, "rounds": rounds, "sites": len(sites),
        "sites_on_cuda": logs.count("engine on device cuda"),
        "job_total_s": round(run["total_wall_s"], 1), "per_round": round_timings(report),
        "task_breakdown": [r.get("task_breakdown") for r in report["rounds"]],
        "final_mean_dice": sum(v["dice"] for v in report["final"]["global"].values()) / len(report["final"]["global"]),
    }


def measure_site_ranks(out: Path, quick: bool, timeout: int) -> Dict[str, Any]:
    """A site training as N ranks (DDP under torchrun, ``site_executor="client_api_torchrun"``): one FedAvg round, one
    site, with 1 rank and, where the machine has N > 1 GPUs, with N; on CPU the gloo path with 2 ranks. Per run: the
    launch command, round wall time and the site's compute and loss from ``report.json``."""
    from fedseg.bench.simulator import round_timings, run_simulator
    from fedseg.recipes.export import export_job

    if shutil.which("torchrun") is None or shutil.which("nvflare") is None:
        raise RuntimeError("torchrun and nvflare must be on PATH (pip install -e . installs both)")
    gpus = torch.cuda.device_count()
    counts = ([1] + ([gpus] if gpus > 1 else [])) if gpus else [2]
    profile = "tiny" if quick else "default"
    runs = []
    for n in counts:
        root = out / "site_ranks" / f"ranks{n}"
        # no -gpu: every GPU of the machine stays visible to the site, whose ranks take cuda:LOCAL_RANK
        job = export_job("fedavg", root / "jobs", profile=profile, num_rounds=1, min_clients=1,
                         site_executor="client_api_torchrun", site_ranks=n)
        run = run_simulator(job, root / "ws", ["site-1"], omp_threads="1", fedseg_threads="1", timeout=timeout,
                            log_path=root / "simulator.log")
        report = run["report"]
        [round_] = report["rounds"]
        if round_["missing"] or round_["rejected"]:
            raise RuntimeError(f"{n} rank(s): the site's update is missing or rejected: {round_['missing']} {round_['rejected']}")
        site = round_["metrics"]["site-1"]
        runs.append({"ranks": n, "backend": "nccl" if gpus else "gloo", "command": run["command"],
                     "job_total_s": round(run["total_wall_s"], 1), "per_round": round_timings(report),
                     "site_compute_s": site.get("compute_time"), "train_loss": site.get("train_loss"),
                     "steps": site.get("steps"), "test_dice": report["final"]["global"]["site-1"]["dice"]})
    return {"profile": profile, "gpus": gpus, "runs": runs}


def measure_volume_networks_96(quick: bool) -> Dict[str, Any]:
    """The 3-D U-Net and UNETR of the volume bundle as the ``paper`` profile builds them (``volume_network``; 96^3
    patches, ``fedseg.config.VOLUME_PAPER_DEFAULTS``): training steps on random in-memory patches (no data loading),
    batch 2, the bundle's DiceCE loss and Adam, float32 and AMP (float16 with a gradient scaler on CUDA, bfloat16 on
    CPU). Per row: voxels/s (patch voxels trained per second, median step after a warm-up) and peak GPU memory.
    ``quick``: 32^3 patches, batch 1, one step (a dry run on CPU)."""
    import statistics

    from fedseg.bundle import bundle_for_task, load_bundle
    from fedseg.config import resolve_profile
    from fedseg.recipes.fedavg import PAPER_PROFILES

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    side, batch, steps = (32, 1, 1) if quick else (96, 2, 5)
    rows = []
    for kind in ("unet", "unetr"):
        cfg = resolve_profile("paper", PAPER_PROFILES, spatial_dims=3, spatial_mode="patch", volume_network=kind,
                              num_classes=3, in_channels=1)["train_config"]
        cfg["patch_size"] = [side] * 3
        parser = load_bundle(bundle_for_task(cfg), cfg)
        for amp in (None, torch.float16 if cuda else torch.bfloat16):
            network = parser.get_parsed_content("network_def", instantiate=True, lazy=False).to(device)
            loss_fn = parser.get_parsed_content("loss", instantiate=True)
            optimizer = torch.optim.Adam(network.parameters(), lr=1e-4)
            scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None
            x = torch.randn(batch, 1, side, side, side, device=device)
            y = torch.randint(0, 3, (batch, 1, side, side, side), device=device)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            walls = []
            for _ in range(steps + 1):  # the first step is a warm-up (cuDNN autotuning, allocator)
                started = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device_type=device.type, dtype=amp or torch.float32, enabled=amp is not None):
                    loss = loss_fn(network(x), y)
                (scaler.scale(loss) if scaler else loss).backward()
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                if cuda:
                    torch.cuda.synchronize()
                walls.append(time.perf_counter() - started)
            step_s = statistics.median(walls[1:])
            row = {"network": kind, "patch": [side] * 3, "batch": batch, "precision": str(amp).replace("torch.", "") if amp else "float32",
                   "device": str(device), "parameters_m": round(sum(p.numel() for p in network.parameters()) / 1e6, 1),
                   "step_s": round(step_s, 3), "mvoxels_per_s": round(batch * side ** 3 / step_s / 1e6, 2),
                   "loss_finite": bool(torch.isfinite(loss)),
                   "peak_gpu_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None}
            print(f"   {kind} {side}^3 x{batch} {row['precision']}: {row['mvoxels_per_s']} Mvoxel/s, "
                  f"peak {row['peak_gpu_memory_mib'] or '-'} MiB", flush=True)
            rows.append(row)
            del network, optimizer, loss
            if cuda:
                torch.cuda.empty_cache()
    return {"rows": rows}


# ---------------------------------------------------------------------------------------------- 6. round limit
def measure_round_limit(out: Path, quick: bool, rounds: int = 5) -> Dict[str, Any]:
    """``benchmarks/cost/round_limit.py``: FedAvg and FedEvi rounds against the plain-loop limit on this device —
    built-in polyp, 4 sites, FedEvi's ``paper`` protocol at 384 px (``--data-profile gpu``), ``rounds`` rounds;
    ``quick``: the tiny profile, 3 sites, 2 rounds."""
    from benchmarks.cost.round_limit import main as round_limit

    if quick:
        argv = ["--out", str(out / "round_limit"), "--methods", "fedavg", "fedevi", "--profile", "tiny", "--rounds", "2",
                "--repeats", "2"]
    else:
        argv = ["--out", str(out / "round_limit"), "--methods", "fedavg", "fedevi", "--sites", *PAPER_BUDGET_SITES,
                "--profile", "paper", "--protocol", "fedevi", "--data-profile", "gpu", "--rounds", str(rounds), "--repeats", "3"]
    record = round_limit(argv)
    record["command"] = "python benchmarks/cost/round_limit.py " + " ".join(a if a != str(out / "round_limit") else "OUT/round_limit" for a in argv)
    return record


# ---------------------------------------------------------------------------------------------- 7. paper budget
def start_paper_budget(out: Path, quick: bool) -> Dict[str, Any]:
    """Start the paper budget's benches (``paper_budget_commands``), both at once; :func:`run_paper_budget` waits."""
    commands = paper_budget_commands(out, quick)
    procs = {m: subprocess.Popen(cmd, cwd=REPO, stdout=open(out / f"paper_{m}.log", "w"), stderr=subprocess.STDOUT,
                                 start_new_session=True) for m, cmd in commands.items()}
    return {"commands": commands, "procs": procs, "started": time.perf_counter()}


def _rounds_done(out: Path) -> Dict[str, int]:
    """Rounds each of the paper budget's simulator jobs has finished (from their servers' report.json)."""
    done = {}
    for report in sorted(out.glob("paper_*/workspaces/*/server/simulate_job/report.json")):
        try:
            done[f"{report.parts[-6]}/{report.parts[-4]}"] = len(json.loads(report.read_text()).get("rounds", []))
        except (OSError, json.JSONDecodeError):
            done[f"{report.parts[-6]}/{report.parts[-4]}"] = -1
    return done


def run_paper_budget(out: Path, quick: bool, timeout: int, started: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The paper budget (``paper_budget_commands``), both benches at once on this device (``started``: already started
    by :func:`start_paper_budget`): the wall of the whole and each bench's per-method median round and the ratio to
    FedAvg's, with the paired comparisons of the bench."""
    running = started or start_paper_budget(out, quick)
    commands, procs, started = running["commands"], running["procs"], running["started"]
    deadline = started + timeout
    for m, proc in procs.items():
        try:
            proc.wait(timeout=max(deadline - time.perf_counter(), 1))
        except subprocess.TimeoutExpired:
            for other in procs.values():
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            raise RuntimeError(f"the paper budget did not finish within {timeout} s; rounds done by then: {_rounds_done(out)}")
    wall = time.perf_counter() - started
    failed = {m: p.returncode for m, p in procs.items() if p.returncode}
    if failed:
        raise RuntimeError(f"fedseg bench failed: {failed}; see {[str(out / f'paper_{m}.log') for m in failed]}")
    benches = {}
    for m in commands:
        res = json.loads((out / f"paper_{m}" / "results.json").read_text())
        benches[m] = {"timing": {k: {f: v.get(f) for f in ("median_round_wall", "wall_s_total", "round_wall_ratio_to_fedavg")}
                                 for k, v in res["timing"].items()},
                      "comparisons": res.get("comparisons")}
    shown = {m: " ".join(["fedseg", *[a if not a.startswith(str(out)) else "OUT" + a[len(str(out)):] for a in cmd[1:]]])
             for m, cmd in commands.items()}
    return {"commands": shown, "wall_s": round(wall, 1), "benches": benches,
            "rounds": 2 if quick else PAPER_BUDGET_ROUNDS, "sets": [] if quick else PAPER_BUDGET_SETS}


# ---------------------------------------------------------------------------------------------- report
#: the sections of ``gpu_check.md``: each part of the check as the GPU page draws it (``render.py``), in step order
SECTIONS = (
    ("tests", "CUDA tests (`pytest -m cuda`)"),
    ("engine", "Engine vs plain PyTorch loop (training, in-memory batches: 2-D images, then 3-D patches)"),
    ("simulator", "One FedAvg job, 4 sites on one device (NVFlare simulator)"),
    ("site-ranks", "One site as N ranks (DDP under torchrun, one FedAvg round)"),
    ("round-limit", "A round against the device's pace (`benchmarks/cost/round_limit.py`)"),
    ("paper-budget", "The paper budget on one GPU"),
    ("networks-96", "3-D networks of the `paper` profile (random in-memory patches, training steps)"),
)


def _not_ok(step: Dict[str, Any]) -> str:
    """What a step that has no table shows: its error, or that this check did not run it (``--steps``)."""
    return f"**failed**: {step['error']}" if step else "not run in this check"


def to_markdown(result: Dict[str, Any]) -> str:
    """``gpu_check.md``: the device, the command and the status, then one section per part of the check: its table
    and note as the GPU page draws them (:func:`benchmarks.gpu.render.gpu_check_part`), or why it has none."""
    info, steps = result["device"], result["steps"]
    lines = [f"# GPU check — {info['device']}", "",
             f"{result['date']}, `{result['command']}`; torch {info['torch']}"
             + (f", CUDA {info.get('cuda_version')}, {info.get('gpu_memory_gib')} GiB" if info["cuda"] else ", no CUDA")
             + f"; status **{'OK' if result['ok'] else 'FAILED'}**."]
    for part, heading in SECTIONS:
        step = steps.get(GPU_CHECK_PARTS[part], {})
        lines += ["", f"## {heading}", ""]
        if not step.get("ok") and not (step and part == "paper-budget"):  # a budget that did not finish has a table
            lines.append(_not_ok(step))
            continue
        table, note = gpu_check_part(steps, part)
        lines += [note, "", *table]
        if part == "engine" and not steps.get("engine_throughput_3d", {}).get("ok"):
            lines += ["", "3-D patches: " + _not_ok(steps.get("engine_throughput_3d", {}))]
    return "\n".join(lines) + "\n"


@StopOnSignal("gpu_check")  # a lease's time limit (SIGTERM) ends the simulators, benches and tests it started too
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for gpu_check.json / gpu_check.md (created)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a dry run of the script (CPU is fine)")
    parser.add_argument("--skip-tests", action="store_true", help="measure only (the tests already ran)")
    parser.add_argument("--steps", nargs="+", default=None, choices=STEPS,
                        help="run only these steps (default: all); steps already in OUT/gpu_check.json are kept")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="seconds from the start within which the check must end (a lease's limit): the paper "
                             "budget gets what is left, at most its own limit")
    parser.add_argument("--round-limit-rounds", type=int, default=5, help="rounds of the round-limit step's runs")
    parser.add_argument("--overlap-tests", action="store_true",
                        help="run the CUDA tests while the paper budget runs (a short lease: the tests time nothing; "
                             "the budget's wall then includes their load)")
    args = parser.parse_args(argv)
    from fedseg.bench.bench import code_version

    check_started = time.perf_counter()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print("gpu_check: no CUDA device: the CUDA tests will skip and the numbers are CPU numbers "
              "(use --quick for a short dry run)", flush=True)

    result: Dict[str, Any] = {
        "benchmark": "gpu_check", "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + " ".join([os.path.relpath(__file__, REPO)] + (argv if argv is not None else sys.argv[1:])),
        "device": device_info(), "quick": args.quick, "code_version": code_version(), "steps": {},
    }
    previous = out / "gpu_check.json"
    if args.steps and previous.is_file():  # a check run in parts (short leases): the earlier parts' steps stay
        result["steps"].update({k: v for k, v in json.loads(previous.read_text()).get("steps", {}).items()
                                if k not in args.steps})
    steps = result["steps"]
    wanted = set(args.steps or STEPS) - ({"cuda_tests"} if args.skip_tests else set())

    def save() -> None:
        """Write what is measured so far: a check cut off by its caller's time limit keeps its finished steps."""
        result["ok"] = all(s["ok"] for s in steps.values())
        (out / "gpu_check.json").write_text(json.dumps(result, indent=1))
        (out / "gpu_check.md").write_text(to_markdown(result))

    def step(name: str, fn: Callable[[], Any]) -> None:
        if name not in wanted:
            return
        _step(steps, name, fn)
        save()

    overlap = args.overlap_tests and {"cuda_tests", "paper_budget"} <= wanted
    if not overlap:
        step("cuda_tests", lambda: run_cuda_tests(out, TEST_TIMEOUT_S))
    step("round_limit", lambda: measure_round_limit(out, args.quick, args.round_limit_rounds))
    budget = start_paper_budget(out, args.quick) if overlap else None
    if overlap:
        step("cuda_tests", lambda: run_cuda_tests(out, TEST_TIMEOUT_S))
    amp = "float16" if cuda else "bfloat16"
    if args.quick:
        step("engine_throughput", lambda: measure_engine([32], amp, "tiny", repeats=1, epochs=1, batch_size=2))
        step("engine_throughput_3d", lambda: measure_engine_volumes(amp, "tiny", repeats=1, epochs=1, batch_size=2))
    else:
        step("engine_throughput", lambda: measure_engine([256, 512], amp, "default", repeats=5, epochs=5, batch_size=8))
        step("engine_throughput_3d", lambda: measure_engine_volumes(amp, "default", repeats=5, epochs=3, batch_size=2))
    step("simulator_round", lambda: measure_simulator_round(out, args.quick, SIM_TIMEOUT_S))
    step("site_ranks", lambda: measure_site_ranks(out, args.quick, SIM_TIMEOUT_S))
    step("volume_networks_96", lambda: measure_volume_networks_96(args.quick))
    left = None if args.deadline_s is None else args.deadline_s - (time.perf_counter() - check_started) - 15
    budget_timeout = int(max(60, min(PAPER_BUDGET_TIMEOUT_S, left if left is not None else PAPER_BUDGET_TIMEOUT_S)))
    step("paper_budget", lambda: run_paper_budget(out, args.quick, budget_timeout, budget))

    save()
    print(f"\n{to_markdown(result)}\nwrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
