"""Time GraphFedSeg's server step against the number of clients K.

For each K: synthetic client update vectors ``(K, D)`` with D = parameter count of the default
``FeatureUNet()`` (~1.94 M), sample shares p and uncertainties U. Timed, median over repeats:
    cosine       pairwise_cosine of the K vectors
    W            all K graph rows, cvxpy (compiled once per K; compile time reported apart) or closed form
    graph update cosine + W, as the strategy runs it each round
    aggregation  dual_layer_aggregate of K state dicts shaped like FeatureUNet (theta_global, K
                 personalised models, theta_base, theta_graph)

Usage:
    python benchmarks/cost/graph_update_time.py --out graph_update_time.json [--ks 4 16 64 128 256]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Callable, Dict, List, Tuple

import numpy as np
import torch

from fedseg.bench.simulator import machine_info
from fedseg.markdown import markdown_table
from fedseg.networks.unet import FeatureUNet
from fedseg.strategies.collaboration_graph import (
    collaboration_graph,
    dual_layer_aggregate,
    graph_qp,
    pairwise_cosine,
)


def median_time(fn: Callable[[], object], repeats: int) -> Tuple[float, float]:
    """Median wall time and median process CPU time (all threads) of ``fn()`` over ``repeats`` calls, seconds.

    CPU time is reported too because the benchmark machine may be shared: contention inflates wall
    time but hardly the CPU time the work needs.
    """
    wall, cpu = [], []
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def repeats_for(k: int) -> int:
    """Fewer repeats for large K: the whole run must stay within a few minutes on 2 cores."""
    return 5 if k <= 16 else 3 if k <= 128 else 2


def models_as_views(vectors: torch.Tensor, template: Dict[str, torch.Tensor]) -> List[Dict[str, torch.Tensor]]:
    """K state dicts shaped like ``template`` whose tensors are views into the rows of ``vectors`` (no copy)."""
    models = []
    for row in vectors:
        offset, model = 0, {}
        for key, ref in template.items():
            model[key] = row[offset : offset + ref.numel()].view(ref.shape)
            offset += ref.numel()
        models.append(model)
    return models


def bench_k(k: int, template: Dict[str, torch.Tensor], dim: int, seed: int = 0) -> Dict[str, float]:
    repeats = repeats_for(k)
    gen = torch.Generator().manual_seed(seed + k)
    rng = np.random.default_rng(seed + k)
    # client updates: a shared direction plus client-specific noise, so cosines are spread, not ~0
    vectors = torch.randn(k, dim, generator=gen)
    vectors += 0.5 * torch.randn(1, dim, generator=gen)
    p = rng.dirichlet(np.ones(k))
    U = rng.uniform(0.05, 0.5, size=k)
    alpha, gamma, lam = 0.08 * k, 0.4, 0.2

    cos = pairwise_cosine(vectors)
    start = time.perf_counter()
    graph_qp(k).solve_row(p, cos[0], U, alpha, gamma)  # compile the DPP problem once for this K
    compile_s = time.perf_counter() - start

    W_cvxpy = collaboration_graph(p, cos, U, alpha, gamma, solver="cvxpy")
    W_closed = collaboration_graph(p, cos, U, alpha, gamma, solver="closed_form")
    models = models_as_views(vectors, template)
    timed = {
        "cosine": lambda: pairwise_cosine(vectors),
        "W_cvxpy": lambda: collaboration_graph(p, cos, U, alpha, gamma, solver="cvxpy"),
        "W_closed_form": lambda: collaboration_graph(p, cos, U, alpha, gamma, solver="closed_form"),
        "graph_update_cvxpy": lambda: collaboration_graph(p, pairwise_cosine(vectors), U, alpha, gamma, solver="cvxpy"),
        "graph_update_closed_form": lambda: collaboration_graph(
            p, pairwise_cosine(vectors), U, alpha, gamma, solver="closed_form"
        ),
        "aggregation": lambda: dual_layer_aggregate(models, p, W_closed, lam),
    }
    result = {"K": k, "repeats": repeats, "cvxpy_compile_s": compile_s}
    for name, fn in timed.items():
        result[name + "_s"], result[name + "_cpu_s"] = median_time(fn, repeats)
    result["max_abs_W_gap"] = float(np.abs(W_cvxpy - W_closed).max())
    return result


COLUMNS = [
    ("cosine", "cosine", "{:.3f}"),
    ("W_cvxpy", "W cvxpy", "{:.3f}"),
    ("W_closed_form", "W closed form", "{:.4f}"),
    ("graph_update_cvxpy", "graph update, cvxpy", "{:.3f}"),
    ("graph_update_closed_form", "graph update, closed form", "{:.3f}"),
    ("aggregation", "dual-layer aggregation", "{:.2f}"),
]


def timing_table(rows: List[Dict[str, float]], suffix: str, unit: str, extra: bool) -> str:
    """One row per K; ``suffix`` "_s" (wall) or "_cpu_s" (CPU); ``extra`` adds compile time, W gap, repeats."""
    titles = ["K"] + [f"{title} ({unit})" for _, title, _ in COLUMNS]
    if extra:
        titles += ["cvxpy compile, once (s)", "max abs W gap", "repeats"]
    table = []
    for row in rows:
        cells = [str(row["K"])] + [fmt.format(row[key + suffix]) for key, _, fmt in COLUMNS]
        if extra:
            cells += [f"{row['cvxpy_compile_s']:.2f}", f"{row['max_abs_W_gap']:.1e}", str(row["repeats"])]
        table.append(cells)
    return "\n".join(markdown_table(titles, table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file for the results")
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 16, 64, 128, 256])
    args = parser.parse_args()

    machine = machine_info()  # the load before the timings (this machine may be shared)
    template = FeatureUNet().state_dict()
    dim = sum(v.numel() for v in template.values())
    rows = []
    for k in args.ks:
        rows.append(bench_k(k, template, dim))
        print(f"K={k} done", flush=True)
    print(f"\nD = {dim} (FeatureUNet() parameters), torch threads = {torch.get_num_threads()}, medians\n")
    print("Wall clock:\n")
    print(timing_table(rows, "_s", "s", extra=True))
    print("\nProcess CPU time (all threads; about threads x wall when the cores are free):\n")
    print(timing_table(rows, "_cpu_s", "CPU s", extra=False))
    # "machine": the architecture, as the earlier records name it; the rest of the machine beside it
    meta = {"D": dim, "torch_threads": torch.get_num_threads(), **machine, "machine": platform.machine()}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
