"""On one GPU (``docs/results/gpu.md``): the GPU check (``gpu_check.py`` beside this module) on a CUDA machine — the
CUDA tests, the engine against a plain PyTorch loop, a simulator job sharing the GPU, a site as DDP ranks and the 3-D
``paper`` networks."""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.gpu.render import render_engine_throughput, render_gpu_check

PAGE = "docs/results/gpu.md"

RUNS: Dict[str, Dict[str, Any]] = {
    "gpu-check": {"out": "gpu_check", "result": "gpu_check.json", "commands": ["python benchmarks/gpu/gpu_check.py --out {out}"]},
}

TABLES: Dict[str, Dict[str, Any]] = {
    f"gpu-check-{part}": {"run": "gpu-check", "render": "gpu-check", "part": part, "title": title}
    for part, title in (("tests", "The CUDA tests on one GPU"),
                        ("engine", "Training throughput on one GPU: the engine against a plain PyTorch loop"),
                        ("simulator", "One FedAvg job of 4 sites sharing one GPU (NVFlare simulator, 2 rounds)"),
                        ("site-ranks", "A site as DDP ranks under torchrun on one GPU"),
                        ("networks-96", "The 3-D paper-profile networks at 96³ patches on one GPU"))}

RENDERERS = {"gpu-check": render_gpu_check, "engine-throughput": render_engine_throughput}
