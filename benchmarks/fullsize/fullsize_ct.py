"""A site at full size: CT-like volumes as large as a hospital's, and what the data path costs on them.

Benchmark-only: nothing here is part of the ``fedseg`` package, and every volume is written to the folder given on
the command line.

    python benchmarks/fullsize/fullsize_ct.py generate --out DATA --volumes 11 --shape 512 512 300
    python benchmarks/fullsize/fullsize_ct.py loaders --data DATA --out OUT [--epochs 3]
    python benchmarks/fullsize/fullsize_ct.py infer --data DATA --out OUT [--stitch-device cpu]
    python benchmarks/fullsize/fullsize_ct.py all --data DATA --out OUT       # generate if missing, loaders, infer -> OUT/fullsize_ct.json

``generate`` writes int16 Hounsfield-unit NIfTI volumes (stored LPS, as DICOM-derived CT usually is; anisotropic
spacing, 0.7 x 0.7 x 2.5 mm by default) with a body ellipse of skin, subcutaneous fat, soft tissue, a vertebral body
(cortical and cancellous bone), lungs in the upper slices, an organ (a lobulated ellipsoid, label 1) and Gaussian
noise; labels are uint8 volumes with the same affine. Generation is vectorised numpy in chunks of slices (memory: one
int16 volume plus one chunk of float32 temporaries). The datalist (``DATA/datalist.json``) is the suite's format
(training / validation / test, labels, ``spatial_dims`` 3, ``modality`` CT, ``intensity_window``, ``target_spacing``).

``loaders`` trains a small 3-D U-Net on 96^3 patches through ``SegEngine`` (the suite's data path: ``CacheDataset``
within ``cache_max_mb``, the rest decoded on each access, optionally the rest kept on local disk with ``cache_dir``)
over the first 3 and the first 9 training volumes with a budget that holds 3, one fresh subprocess per configuration,
and records per configuration: decoded size, peak RSS of the site (``resource.getrusage``: the training process and
its largest worker, plus the sampled sum over the process tree), seconds per epoch and the cache hit rate (fraction
of item accesses served from the memory or disk cache, counted in the dataset, workers included). The network and
patch size are fixed so that the numbers are about the data path, not the model.

``infer`` runs ``fedseg infer`` (:func:`fedseg.inference.run_inference`) on one full-size volume with 96^3 windows,
in a fresh subprocess: peak RSS and seconds, the mask checked against the input's shape and affine.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from fedseg.processes import StopOnSignal

REPO = Path(__file__).resolve().parents[2]

#: stored spacing (mm, array axes: in-plane, in-plane, slice) and orientation of the generated volumes
SPACING = (0.7, 0.7, 2.5)
#: the job's settings on these volumes: the grid the network sees (mm, RAS order) and the CT window (HU)
TARGET_SPACING = (1.5, 1.5, 2.5)
INTENSITY_WINDOW = (-160.0, 240.0)
LABELS = {"background": 0, "organ": 1}
#: slices generated at a time (bounds generation memory to one chunk of float32 temporaries)
CHUNK_SLICES = 32
#: tissue values (HU)
HU = {"air": -1000.0, "lung": -850.0, "fat": -100.0, "soft": 40.0, "organ": 60.0, "cancellous": 250.0, "cortical": 900.0}
NOISE_HU = 12.0


# ---------------------------------------------------------------------------------------------- generation
def _affine(shape: Sequence[int], spacing: Sequence[float]) -> np.ndarray:
    """LPS-stored affine (x and y flipped, as ITK writes DICOM-derived NIfTI) with the volume centred at the origin."""
    affine = np.diag([-spacing[0], -spacing[1], spacing[2], 1.0])
    centre = (np.asarray(shape, float) - 1) / 2
    affine[:3, 3] = -affine[:3, :3] @ centre
    return affine


def _anatomy(rng: np.random.Generator) -> Dict[str, float]:
    """One patient's proportions (mm)."""
    return {
        "body_a": rng.uniform(150, 175), "body_b": rng.uniform(105, 125), "fat": rng.uniform(12, 25),
        "organ_a": rng.uniform(70, 90), "organ_b": rng.uniform(55, 75), "organ_c": rng.uniform(60, 90),
        "organ_x": rng.uniform(-70, -40), "organ_y": rng.uniform(-10, 20), "organ_z": rng.uniform(-60, 20),
        "lobes": rng.uniform(0.04, 0.09), "phase": rng.uniform(0, 2 * math.pi),
        "spine_y": rng.uniform(-85, -70), "spine_r": rng.uniform(15, 20), "lung_z": rng.uniform(60, 110),
    }


def render_volume(shape: Sequence[int], spacing: Sequence[float], seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """One CT-like volume: ``image`` int16 HU ``(X, Y, Z)`` and ``label`` uint8 ``(X, Y, Z)`` (1 = organ), on the grid
    of :func:`_affine` (array axes left-to-right as stored). A pure function of ``(shape, spacing, seed)``."""
    nx, ny, nz = (int(s) for s in shape)
    rng = np.random.default_rng(seed)
    a = _anatomy(rng)
    # world coordinates (mm) of the voxel centres; the stored x and y axes run towards -x / -y (LPS)
    x = (-(np.arange(nx) - (nx - 1) / 2) * spacing[0]).astype(np.float32)[:, None, None]
    y = (-(np.arange(ny) - (ny - 1) / 2) * spacing[1]).astype(np.float32)[None, :, None]
    image = np.empty((nx, ny, nz), np.int16)
    label = np.empty((nx, ny, nz), np.uint8)
    for z0 in range(0, nz, CHUNK_SLICES):
        z1 = min(nz, z0 + CHUNK_SLICES)
        z = ((np.arange(z0, z1) - (nz - 1) / 2) * spacing[2]).astype(np.float32)[None, None, :]
        # the body narrows slowly along z; everything outside it is air
        scale = 1.0 + 0.05 * np.sin(z / 90.0)
        body = (x / (a["body_a"] * scale)) ** 2 + (y / (a["body_b"] * scale)) ** 2
        inner = (x / (a["body_a"] * scale - a["fat"])) ** 2 + (y / (a["body_b"] * scale - a["fat"])) ** 2
        hu = np.full(np.broadcast_shapes(body.shape, z.shape), HU["air"], np.float32)
        inside = np.broadcast_to(body < 1.0, hu.shape)
        hu[inside] = HU["fat"]
        hu[np.broadcast_to(inner < 1.0, hu.shape)] = HU["soft"]
        # lungs: two ellipsoids in the upper slices
        for side in (-1.0, 1.0):
            lung = ((x - side * 0.5 * a["body_a"]) / (0.35 * a["body_a"])) ** 2 + ((y - 10.0) / (0.6 * a["body_b"])) ** 2 \
                + ((z - a["lung_z"] - 90.0) / 110.0) ** 2
            hu[lung < 1.0] = HU["lung"]
        # the organ: a lobulated ellipsoid (the label is its interior)
        dx, dy, dz = x - a["organ_x"], y - a["organ_y"], z - a["organ_z"]
        radius = (dx / a["organ_a"]) ** 2 + (dy / a["organ_b"]) ** 2 + (dz / a["organ_c"]) ** 2
        lobes = 1.0 + a["lobes"] * np.sin(3.0 * np.arctan2(dy, dx) + a["phase"]) * np.cos(dz / 25.0)
        organ = radius < lobes
        hu[organ] = HU["organ"]
        # a vertebral body: cancellous core in a cortical shell, posterior in every slice
        spine = np.broadcast_to(np.sqrt(x ** 2 + (y - a["spine_y"]) ** 2), hu.shape)
        hu[spine < a["spine_r"]] = HU["cortical"]
        hu[spine < a["spine_r"] - 3.0] = HU["cancellous"]
        hu += rng.standard_normal(hu.shape, dtype=np.float32) * NOISE_HU
        image[:, :, z0:z1] = np.clip(np.rint(hu), -1024, 3071).astype(np.int16)
        label[:, :, z0:z1] = organ
    return image, label


def _save(array: np.ndarray, affine: np.ndarray, path: Path) -> None:
    """NIfTI with qform and sform set, units mm, written atomically."""
    import nibabel as nib

    img = nib.Nifti1Image(array, affine)
    img.header.set_xyzt_units("mm")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    tmp = path.with_name(f".{path.name}.tmp.nii.gz")
    nib.save(img, str(tmp))
    os.replace(tmp, path)


def write_datalist(folder: Path, names: Sequence[str], n_train: int, name: str = "datalist.json",
                   target_spacing: Sequence[float] = TARGET_SPACING) -> Path:
    """A suite datalist over ``names`` in ``folder``: the first ``n_train`` for training, the last two for validation
    and test (paths relative to ``folder``); ``target_spacing`` (mm) is the grid the job resamples to."""
    from fedseg.data.datalist import write_json_atomic

    if n_train + 2 > len(names):
        raise ValueError(f"{n_train} training volumes + validation + test need {n_train + 2} volumes, have {len(names)}")
    entry = [{"image": f"images/{n}", "label": f"labels/{n}"} for n in names]
    return write_json_atomic(folder / name, {
        "name": "fedseg-benchmark-fullsize-ct",
        "labels": LABELS, "spatial_dims": 3, "modality": "CT", "intensity_window": list(INTENSITY_WINDOW),
        "target_spacing": [float(s) for s in target_spacing],
        "training": entry[:n_train], "validation": [entry[-2]], "test": [entry[-1]],
    })


def generate(out: Path, volumes: int, shape: Sequence[int], spacing: Sequence[float] = SPACING, seed: int = 0,
             target_spacing: Sequence[float] = TARGET_SPACING) -> Path:
    """Write ``volumes`` image/label pairs and ``datalist.json`` (``volumes - 2`` for training) into ``out``; a volume
    already there with the recorded shape, spacing and seed is kept. Returns the datalist path."""
    if volumes < 3:
        raise ValueError("--volumes must be >= 3 (one each for training, validation and test)")
    out = Path(out)
    for sub in ("images", "labels"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    stamp = out / "generated.json"
    spec = {"shape": [int(s) for s in shape], "spacing": [float(s) for s in spacing], "seed": int(seed)}
    done = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if done.get("spec") != spec:
        done = {"spec": spec, "volumes": []}
    names = [f"{i:03d}.nii.gz" for i in range(volumes)]
    affine = _affine(shape, spacing)
    for i, name in enumerate(names):
        if name in done["volumes"] and (out / "images" / name).is_file() and (out / "labels" / name).is_file():
            continue
        started = time.perf_counter()
        image, label = render_volume(shape, spacing, seed * 100003 + i)
        _save(image, affine, out / "images" / name)
        _save(label, affine, out / "labels" / name)
        del image, label
        done["volumes"] = sorted(set(done["volumes"]) | {name})
        stamp.write_text(json.dumps(done))
        print(f"  {name}: {time.perf_counter() - started:.1f} s", flush=True)
    return write_datalist(out, names, volumes - 2, target_spacing=target_spacing)



# ---------------------------------------------------------------------------------------------- measurement helpers
#: the small network and patches of every configuration (the measurement is about the data path, not the model)
NETWORK = {"channels": [8, 16, 32, 64], "patch_size": [96, 96, 96], "batch_size": 2, "patch_samples": 1}


class TreeMemory:
    """Samples the summed RSS and PSS (proportional set size: shared pages split between the processes sharing them)
    of this process and its children every ``interval`` seconds in a thread; ``peak_rss_mb`` / ``peak_pss_mb``."""

    def __init__(self, interval: float = 0.5):
        import psutil

        self._proc, self._interval = psutil.Process(), interval
        self.peak_rss_mb = self.peak_pss_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            rss = pss = 0
            for p in [self._proc] + self._proc.children(recursive=True):
                try:
                    info = p.memory_full_info()
                    rss, pss = rss + info.rss, pss + info.pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.peak_rss_mb = max(self.peak_rss_mb, rss / 2**20)
            self.peak_pss_mb = max(self.peak_pss_mb, pss / 2**20)
            self._stop.wait(self._interval)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _rss_now_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _max_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def job_config(datalist: Path, **overrides: Any) -> Dict[str, Any]:
    """The train_config of a site on the generated volumes: the suite's volume job with :data:`NETWORK`."""
    from fedseg.config import resolve_profile

    settings = {"spatial_dims": 3, "spatial_mode": "patch", "target_spacing": list(TARGET_SPACING), "modality": "CT",
                "intensity_window": list(INTENSITY_WINDOW), "labels": LABELS, "num_classes": 2, "local_epochs": 1,
                **NETWORK, **overrides}
    return resolve_profile("default", **settings)["train_config"]


def _count_accesses(counts: Any) -> None:
    """Make every ``SiteDataset`` access count where it was served from: ``counts`` = shared ``[memory, disk,
    decoded]`` (a ``multiprocessing`` array: DataLoader workers, forked, add to the same counters), and its seconds
    (``counts.seconds``, summed over the processes)."""
    from fedseg.engine.cache import SiteDataset

    original = SiteDataset._transform

    def counted(self, index: int):
        i = index % len(self)
        if i < self.cache_num:
            slot = 0
        elif self._disk is not None:
            item = self._disk.data[i]
            name = self._disk.hash_func(item).decode("utf-8") + self._disk.transform_hash
            slot = 1 if (self._disk.cache_dir / f"{name}.pt").is_file() else 2
        else:
            slot = 2
        started = time.perf_counter()
        out = original(self, index)
        with counts.get_lock():
            counts[slot] += 1
            counts.seconds.value += time.perf_counter() - started
        return out

    SiteDataset._transform = counted


def measure_loader(datalist: Path, cache_mb: float, workers: int, cache_dir: Optional[Path], epochs: int) -> Dict[str, Any]:
    """One configuration, in this (fresh) process: ``epochs`` calls of ``SegEngine.train`` (one epoch each)."""
    import torch

    from fedseg.engine.cache import volume_item_bytes
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext

    torch.manual_seed(0)
    counts = mp.Array("l", 3)
    counts.seconds = mp.Value("d", 0.0)
    _count_accesses(counts)
    cfg = job_config(datalist, cache_max_mb=cache_mb, num_workers=workers,
                     cache_dir=str(cache_dir) if cache_dir else None)
    engine = SegEngine("site-1", datalist, cfg, device=torch.device("cpu"))
    model = engine.build_network()
    ctx = RoundContext(site="site-1", round=0, total_rounds=1, train_config=engine.train_config)
    items = engine.data["training"]
    item_mb = [volume_item_bytes(e, engine.train_config, True, 1) / 2**20 for e in items]
    base_mb = _rss_now_mb()  # imports, engine, network: before any volume is decoded
    walls = []
    with TreeMemory() as tree:
        started = time.perf_counter()
        engine._dataset("training", True)  # the memory cache filled (CacheDataset decodes its items up front)
        fill_s, fill_peak_mb, filled_mb = time.perf_counter() - started, _max_rss_mb(), _rss_now_mb()
        for _ in range(epochs):
            started = time.perf_counter()
            engine.train(model, ClientObjective(), ctx)
            walls.append(time.perf_counter() - started)
    dataset = engine._datasets[("training", True)]
    cached = int(dataset.cache_num)
    disk_mb = round(sum(p.stat().st_size for p in Path(cache_dir).glob("*.pt")) / 2**20) if cache_dir else None
    del engine, dataset
    import gc

    gc.collect()
    memory, disk, decoded = (int(v) for v in counts)
    return {
        "volumes": len(items), "cache_max_mb": cache_mb, "num_workers": workers, "disk_cache": cache_dir is not None,
        "disk_cache_mb": disk_mb,
        "epochs": epochs, "cached_in_memory": cached,
        "decoded_mb": round(sum(item_mb), 1), "item_mb": round(max(item_mb), 1), "cache_mb": round(sum(item_mb[:cached]), 1),
        "cache_fill_s": round(fill_s, 1), "fill_peak_rss_mb": round(fill_peak_mb), "filled_rss_mb": round(filled_mb),
        "epoch_s": [round(w, 1) for w in walls], "first_epoch_s": round(walls[0], 1),
        "data_s": round(counts.seconds.value, 1),
        "steady_epoch_s": round(sum(walls[1:]) / max(len(walls) - 1, 1), 1) if len(walls) > 1 else None,
        "accesses": {"memory": memory, "disk": disk, "decoded": decoded},
        "hit_rate": round((memory + disk) / max(memory + disk + decoded, 1), 3),
        "base_rss_mb": round(base_mb), "peak_rss_mb": round(_max_rss_mb()),
        "peak_worker_rss_mb": round(_max_rss_mb(resource.RUSAGE_CHILDREN)) if workers else 0,
        "peak_tree_rss_mb": round(tree.peak_rss_mb), "peak_tree_pss_mb": round(tree.peak_pss_mb),
    }


def measure_decode(datalist: Path) -> Dict[str, Any]:
    """What decoding one training volume adds to a process: peak RSS while the training transforms run on it once,
    minus the RSS before (imports and engine in place)."""
    from fedseg.engine.engine import SegEngine

    import torch

    engine = SegEngine("site-1", datalist, job_config(datalist, cache_max_mb=0), device=torch.device("cpu"))
    dataset = engine._dataset("training", True)
    before = _rss_now_mb()
    started = time.perf_counter()
    dataset[0]
    seconds = time.perf_counter() - started
    return {"base_rss_mb": round(before), "decode_peak_mb": round(_max_rss_mb() - before), "decode_s": round(seconds, 1)}


def measure_infer(datalist: str, out: str, stitch_device: Optional[str], sw_batch_size: int = 4) -> Dict[str, Any]:
    """``fedseg infer`` on the test volume of ``datalist`` with a network of :data:`NETWORK`'s width (weights as
    initialised: the measurement is memory and time), 96^3 windows; the mask checked against the input geometry."""
    import nibabel as nib
    import torch

    from fedseg.bundle import bundle_for_task, load_bundle
    from fedseg.data.datalist import load_datalist
    from fedseg.inference import run_inference

    cfg = {**job_config(Path(datalist)), "sw_batch_size": sw_batch_size}
    cfg["num_classes"] = 2
    network = load_bundle(bundle_for_task(cfg), cfg).get_parsed_content("network_def", instantiate=True, lazy=False)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = folder / "model.pt"
    torch.save({"model": network.state_dict(), "train_config": cfg}, ckpt)
    del network
    base = _rss_now_mb()
    started = time.perf_counter()
    (mask,) = run_inference(ckpt, folder / "masks", datalist=datalist, split="test", stitch_device=stitch_device)
    seconds = time.perf_counter() - started
    peak = _max_rss_mb()
    image = nib.load(load_datalist(datalist)["test"][0]["image"])
    written = nib.load(str(mask))
    return {
        "stitch_device": stitch_device, "device": "cuda" if torch.cuda.is_available() else "cpu",
        "shape": [int(v) for v in image.shape], "spacing": [round(float(v), 3) for v in image.header.get_zooms()],
        "window": NETWORK["patch_size"], "sw_batch_size": sw_batch_size, "target_spacing": list(TARGET_SPACING),
        "seconds": round(seconds, 1), "base_rss_mb": round(base), "peak_rss_mb": round(peak),
        "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None,
        "mask_shape_ok": tuple(written.shape) == tuple(image.shape),
        "mask_affine_ok": bool(np.allclose(written.affine, image.affine, atol=1e-4)),
        "mask_foreground": round(float(np.asarray(written.dataobj).astype(bool).mean()), 4),
    }


def _child(kind: str, parts: Optional[Path] = None, **kwargs: Any) -> Dict[str, Any]:
    """Run ``measure_<kind>`` in a fresh interpreter (its own peak RSS) and return its JSON; with ``parts`` (a folder)
    the result is kept there and an interrupted run resumes from the configurations already measured."""
    import hashlib

    spec = json.dumps({"kind": kind, **kwargs}, sort_keys=True)
    part = Path(parts) / f"{kind}_{hashlib.sha256(spec.encode()).hexdigest()[:12]}.json" if parts else None
    if part is not None and part.is_file():
        return json.loads(part.read_text())
    cmd = [sys.executable, str(Path(__file__).resolve()), "_measure", kind, json.dumps(kwargs)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if part is not None:
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_text(json.dumps(result))
    return result


def subset_datalist(data: Path, n_train: int) -> Path:
    """``DATA/datalist_<n>.json``: the first ``n_train`` training volumes of ``DATA/datalist.json``, same validation
    and test."""
    names = sorted(p.name for p in (data / "images").glob("*.nii.gz"))
    return write_datalist(data, names, n_train, name=f"datalist_{n_train}.json") if n_train != len(names) - 2 \
        else data / "datalist.json"


def run_loaders(data: Path, out: Path, epochs: int, small: int = 3, large: int = 9) -> Dict[str, Any]:
    """The loader table: ``small`` volumes within a budget that holds them, ``large`` (= 3x) with the same budget,
    through the decode-on-access path (0 and 2 workers) and the disk cache (``cache_dir``; 0 workers)."""
    import psutil

    from fedseg.engine.cache import volume_item_bytes

    lists = {n: subset_datalist(data, n) for n in (small, large)}
    from fedseg.data.datalist import load_datalist

    entries = load_datalist(lists[small])["training"]
    cfg = job_config(lists[small])
    # the budget: the small set's decoded training items and 1 MB to spare (CacheBudget books whole items)
    budget = math.ceil(sum(volume_item_bytes(e, cfg, True, 1) for e in entries) / 2**20) + 1
    parts = out / "parts"
    decode = _child("decode", parts, datalist=str(lists[small]))
    print(f"  one decode: {decode}", flush=True)
    configs = [
        ("fits the cache", small, 0, False),
        ("3x the cache, decoded on access", large, 0, False),
        ("3x the cache, decoded on access", large, 2, False),
        ("3x the cache, disk cache (cache_dir)", large, 0, True),
    ]
    rows = []
    for label, n, workers, disk in configs:
        cache_dir = out / "disk_cache" / f"{n}_{workers}" if disk else None
        if cache_dir is not None and cache_dir.exists():
            shutil.rmtree(cache_dir)  # every disk configuration starts empty: its first epoch writes the cache
        row = _child("loader", parts, datalist=str(lists[n]), cache_mb=budget, workers=workers,
                     cache_dir=str(cache_dir) if cache_dir else None, epochs=epochs)
        if cache_dir is not None and cache_dir.exists():
            shutil.rmtree(cache_dir)  # decoded patient data: not kept after the measurement
        row["configuration"] = label
        # the stated bound: the site whose data fit the same budget (its peak: cache, network, one batch), plus one
        # volume being decoded in the training process; each worker a process of the same base size decoding one
        # volume, plus the batches it has prefetched (DataLoader's prefetch_factor 2)
        fit = rows[0]["peak_rss_mb"] if rows else row["peak_rss_mb"]
        prefetch_mb = 2 * NETWORK["batch_size"] * NETWORK["patch_samples"] * 2 * math.prod(NETWORK["patch_size"]) * 4 / 2**20
        row["bound_main_mb"] = round(fit + (decode["decode_peak_mb"] if n > small else 0))
        row["bound_tree_mb"] = round(row["bound_main_mb"] + workers * (row["base_rss_mb"] + decode["decode_peak_mb"] + prefetch_mb))
        row["within_bound"] = row["peak_rss_mb"] <= row["bound_main_mb"] and row["peak_tree_pss_mb"] <= row["bound_tree_mb"]
        print(f"  {label}, {n} volumes, {workers} workers: {row}", flush=True)
        rows.append(row)
    return {"ram_mb": round(psutil.virtual_memory().total / 2**20), "cache_max_mb": budget, "decode": decode,
            "prefetch_mb": round(2 * NETWORK["batch_size"] * NETWORK["patch_samples"] * 2 * math.prod(NETWORK["patch_size"]) * 4 / 2**20, 1),
            "rows": rows}



def run_all(data: Path, out: Path, epochs: int, volumes: int, shape: Sequence[int], argv: Sequence[str]) -> Dict[str, Any]:
    """Generate (if not there), measure the loaders and inference; writes ``OUT/fullsize_ct.json``."""
    import torch

    from fedseg.bench.bench import code_version
    from fedseg.bench.simulator import machine_info
    from fedseg.data.datalist import read_datalist_json

    started, machine = time.perf_counter(), machine_info()  # the load before the measurements
    datalist = generate(data, volumes, shape)
    loaders = run_loaders(data, out, epochs)
    infer = _child("infer", out / "parts", datalist=str(datalist), out=str(out / "infer"), stitch_device="cpu")
    print(f"  inference: {infer}", flush=True)
    shutil.rmtree(out / "infer", ignore_errors=True)  # the mask and the throw-away checkpoint
    image = str(data / read_datalist_json(datalist)[1]["test"][0]["image"])  # the header only, no file checks
    import nibabel as nib

    result = {
        "benchmark": "fullsize_ct", "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + " ".join([os.path.relpath(__file__, REPO)] + list(argv)),
        "code_version": code_version(),
        "machine": {**machine, "torch_threads": torch.get_num_threads()},
        "volumes": {"count": volumes, "shape": [int(v) for v in shape], "spacing": list(SPACING), "dtype": "int16",
                    "file_mb": round(os.path.getsize(image) / 2**20, 1),
                    "raw_mb": round(math.prod(nib.load(image).shape) * 2 / 2**20, 1),
                    "target_spacing": list(TARGET_SPACING), "intensity_window": list(INTENSITY_WINDOW)},
        "network": NETWORK, "epochs": epochs, "loaders": loaders, "infer": infer,
        "wall_s": round(time.perf_counter() - started),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "fullsize_ct.json").write_text(json.dumps(result, indent=1))
    return result


@StopOnSignal("fullsize_ct")  # SIGTERM / Ctrl-C end the measuring subprocesses too
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="write CT-like volumes and their datalist")
    gen.add_argument("--out", required=True, help="folder for images/, labels/ and datalist.json")
    gen.add_argument("--volumes", type=int, default=11, help="volumes in all; the last two are validation and test")
    gen.add_argument("--shape", type=int, nargs=3, default=[512, 512, 300])
    gen.add_argument("--spacing", type=float, nargs=3, default=list(SPACING))
    gen.add_argument("--seed", type=int, default=0)
    for name, what in (("loaders", "the loader table"), ("infer", "fedseg infer on one full-size volume"),
                       ("all", "generate if needed, loaders and infer; OUT/fullsize_ct.json")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--data", required=True, help="the generated volumes (generate --out)")
        p.add_argument("--out", required=True, help="folder for results (and the disk cache, emptied afterwards)")
        p.add_argument("--epochs", type=int, default=2)
        p.add_argument("--stitch-device", default="cpu")
        p.add_argument("--volumes", type=int, default=11)
        p.add_argument("--shape", type=int, nargs=3, default=[512, 512, 300])
    internal = sub.add_parser("_measure")  # one configuration in a fresh process (called by the others)
    internal.add_argument("kind", choices=["loader", "decode", "infer"])
    internal.add_argument("kwargs")
    args = parser.parse_args(argv)
    if args.cmd == "generate":
        print(generate(Path(args.out), args.volumes, args.shape, args.spacing, args.seed))
    elif args.cmd == "_measure":
        kwargs = json.loads(args.kwargs)
        for key in ("datalist", "cache_dir"):
            if kwargs.get(key):
                kwargs[key] = Path(kwargs[key])
        fn = {"loader": measure_loader, "decode": measure_decode, "infer": measure_infer}[args.kind]
        print(json.dumps(fn(**kwargs)), flush=True)
    elif args.cmd == "loaders":
        print(json.dumps(run_loaders(Path(args.data), Path(args.out), args.epochs), indent=1))
    elif args.cmd == "infer":
        datalist = Path(args.data) / "datalist.json"
        print(json.dumps(_child("infer", datalist=str(datalist), out=str(Path(args.out) / "infer"),
                                stitch_device=args.stitch_device), indent=1))
    else:
        run_all(Path(args.data), Path(args.out), args.epochs, args.volumes, args.shape,
                argv if argv is not None else sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
