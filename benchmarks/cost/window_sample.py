"""How close GraphFedSeg's graph and FedEvi's weights are when their statistics come from a window sample
instead of whole images (docs/methods.md, "window sample").

Two small federations are trained in this process on a site -> datalist map (e.g. ``fedseg data retina``),
with the product's engine and defaults, one local epoch a round, sample-weighted averaging:

* ``graphfedseg``: GraphFedSeg's data term (the bundle's DiceCE; the similarity regulariser is left out);
* ``fedevi``: FedEvi's evidential loss.

After the local training of each round in ``--at``, on the same local models, every statistic is computed
by the product's own code path (``GraphFedSegObjective.end_round``, ``FedEviObjective.handle_task``) in
three settings:

* ``whole``: the whole-image pass (``uncertainty_windows`` / ``surrogate_windows`` = ``"whole_image"``: a
  sliding window, the engine's overlap and blending, over every whole image, scored at its own size);
* ``tiling``: a sample as large as the split's tiling (every cell of every image; the sample's value with
  no sampling error, so ``tiling - whole`` is what scoring cells by one window each changes);
* ``M`` for each ``--windows`` M, ``--draws`` times (the draws are the seeds of different rounds).

and then what the server makes of them, with the strategies' own maths:

* GraphFedSeg: the graph W (closed form of the QP, alpha = 0.08 K, gamma = 0.4, ``similarity="update"``
  cosines of the local models against the round-0 model) and the effective aggregation weights
  (lam = 0.2), from p, cos and each setting's U;
* FedEvi: the updated weights ``update_beta(p, G, 1 / A)`` (the default ``weight_form="code"``), with the
  surrogate = the p-weighted average of the local models.

Reported per setting (max over sites, then median and max over checkpoints x draws): relative |dU|, max |dW|,
max |d effective weight|; relative |dG|, |dA|, |dR_paper| and max |d beta|; and seconds per pass at a site.

Usage:
    python benchmarks/cost/window_sample.py --site-datalists bench_out/cost/retina_data/site_datalists.json \\
        --rounds 20 --at 1 5 20 --windows 16 32 64 128 256 --draws 5 --out bench_out/cost/window_sample_retina.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

from fedseg.bench.simulator import machine_info
from fedseg.markdown import markdown_table

WHOLE = "whole"
TILING = "tiling"


def _average(states: List[Dict[str, torch.Tensor]], weights: np.ndarray) -> Dict[str, torch.Tensor]:
    out = {}
    for key, value in states[0].items():
        if value.is_floating_point():
            out[key] = sum(float(w) * s[key] for w, s in zip(weights, states))
        else:
            out[key] = value.clone()
    return out


def _timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def graph_statistics(engine, model, ctx_round: int, windows) -> tuple:
    """U of one site with ``uncertainty_windows=windows`` (the product's ``end_round``) and its seconds."""
    from fedseg.objectives.base import RoundContext
    from fedseg.objectives.graphfedseg import GraphFedSegObjective

    objective = GraphFedSegObjective(uncertainty_windows=windows)
    ctx = RoundContext(engine.site, ctx_round, 10**6, server_meta={}, train_config=engine.train_config)
    objective.begin_round(ctx, model)
    stats, seconds = _timed(lambda: objective.end_round(ctx, model, engine))
    return stats["uncertainty"], seconds


def fedevi_statistics(engine, local, surrogate, ctx_round: int, windows) -> tuple:
    """G, A, R_paper of one site with ``surrogate_windows=windows`` (the product's surrogate task) and seconds."""
    from fedseg.objectives.base import RoundContext
    from fedseg.objectives.fedevi import FedEviObjective

    objective = FedEviObjective(surrogate_windows=windows)
    ctx = RoundContext(engine.site, ctx_round, 10**6, server_meta={"fedevi": {"round": ctx_round}}, train_config=engine.train_config)
    objective.end_round(ctx, local, engine)
    return _timed(lambda: objective.handle_task("evaluate_surrogate", ctx, surrogate, engine))


def settings(engine_cells: int, windows: List[int], draws: int) -> List[tuple]:
    """(label, windows option, draw) of every setting; ``tiling`` asks for at least every cell."""
    out = [(WHOLE, "whole_image", 0), (TILING, engine_cells, 0)]
    out += [(str(m), m, d) for m in windows for d in range(draws)]
    return out


def run(args) -> Dict[str, Any]:
    from fedseg.config import resolve_profile
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext
    from fedseg.objectives.fedevi import FedEviObjective
    from fedseg.strategies.collaboration_graph import (
        effective_weight,
        flatten_params,
        graph_rows_closed_form,
        pairwise_cosine,
        similarity_keys,
    )
    from fedseg.strategies.evidential_weights import update_beta
    from fedseg.uncertainty.window_sample import cells_in_split

    torch.set_num_threads(args.threads)
    site_datalists = json.loads(Path(args.site_datalists).read_text())
    sites = sorted(site_datalists)
    cfg = dict(resolve_profile("default")["train_config"], seed=args.seed, local_epochs=1)
    for item in args.set or []:
        key, _, value = item.partition("=")
        cfg[key] = json.loads(value) if value[:1] in "0123456789-[{tfn" else value
    engines = {s: SegEngine(s, site_datalists[s], cfg) for s in sites}
    if any(e.spatial_mode != "patch" for e in engines.values()):
        raise SystemExit("every site must be in patch mode (native resolution): the window sample applies there only")
    n = np.array([engines[s].n_train for s in sites], dtype=np.float64)
    p = n / n.sum()
    k = len(sites)
    cells = {s: {split: cells_in_split(engines[s].grid_shapes(split), engines[s].window_cell)
                 for split in ("training", "validation")} for s in sites}

    torch.manual_seed(args.seed)
    initial = engines[sites[0]].build_network().state_dict()
    keys = similarity_keys(initial)
    initial_flat = flatten_params(initial, keys)
    federations = {
        "graphfedseg": {"objective": ClientObjective, "global": copy.deepcopy(initial)},
        "fedevi": {"objective": FedEviObjective, "global": copy.deepcopy(initial)},
    }
    models = {(f, s): engines[s].build_network() for f in federations for s in sites}
    checkpoints: List[Dict[str, Any]] = []
    for round_ in range(max(args.at)):
        locals_: Dict[str, Dict[str, Any]] = {}
        for fed, spec in federations.items():
            states = []
            for s in sites:
                model = models[(fed, s)]
                model.load_state_dict(spec["global"])
                ctx = RoundContext(s, round_, args.rounds, train_config=engines[s].train_config)
                objective = spec["objective"]()
                objective.begin_round(ctx, model)
                engines[s].train(model, objective, ctx)
                states.append({key: v.detach().clone() for key, v in model.state_dict().items()})
            locals_[fed] = states
            spec["global"] = _average(states, p)
        print(f"{_dt.datetime.now(_dt.timezone.utc):%H:%M:%S} round {round_ + 1} trained", flush=True)
        if round_ + 1 not in args.at:
            continue

        record: Dict[str, Any] = {"round": round_ + 1, "graphfedseg": {}, "fedevi": {}}
        # GraphFedSeg: U per setting on the same local models, then the server's graph from p, cos, U
        raw = torch.stack([flatten_params(st, keys) for st in locals_["graphfedseg"]])
        cos = pairwise_cosine(raw - initial_flat)
        alpha, gamma, lam = 0.08 * k, 0.4, 0.2
        for i, s in enumerate(sites):
            models[("graphfedseg", s)].load_state_dict(locals_["graphfedseg"][i])
        for label, windows, draw in settings(max(c["training"] for c in cells.values()), args.windows, args.draws):
            U, seconds = [], []
            for i, s in enumerate(sites):
                u, sec = graph_statistics(engines[s], models[("graphfedseg", s)], 1000 * draw + round_, windows)
                U.append(u)
                seconds.append(sec)
            W = graph_rows_closed_form(p, cos, np.array(U), alpha, gamma)
            record["graphfedseg"].setdefault(label, []).append({
                "draw": draw, "U": U, "seconds": seconds, "W": W.tolist(),
                "effective_weight": effective_weight(p, W, lam).tolist(),
            })
            print(f"  graphfedseg {label:>7} draw {draw}: U {np.round(U, 5).tolist()}  s/site {np.round(seconds, 2).tolist()}", flush=True)

        # FedEvi: G / A / R_paper per setting, the surrogate = p-weighted average of the local models
        surrogate_state = _average(locals_["fedevi"], p)
        surrogate = engines[sites[0]].build_network()
        for label, windows, draw in settings(max(c["validation"] for c in cells.values()), args.windows, args.draws):
            stats, seconds = [], []
            for i, s in enumerate(sites):
                local = models[("fedevi", s)]
                local.load_state_dict(locals_["fedevi"][i])
                surrogate.load_state_dict(surrogate_state)
                st, sec = fedevi_statistics(engines[s], local, surrogate, 1000 * draw + round_, windows)
                stats.append(st)
                seconds.append(sec)
            G = np.array([st["G"] for st in stats])
            A = np.array([st["A"] for st in stats])
            beta = update_beta(p, G, 1.0 / A)
            record["fedevi"].setdefault(label, []).append({
                "draw": draw, "G": G.tolist(), "A": A.tolist(), "R_paper": [st["R_paper"] for st in stats],
                "seconds": seconds, "beta": np.asarray(beta).tolist(),
            })
            print(f"  fedevi      {label:>7} draw {draw}: G {np.round(G, 5).tolist()} A {np.round(A, 5).tolist()} "
                  f"beta {np.round(beta, 4).tolist()}  s/site {np.round(seconds, 2).tolist()}", flush=True)
        checkpoints.append(record)
    return {
        "command": " ".join(sys.argv),
        "date": f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "machine": machine_info(),
        "sites": sites,
        "n_train": n.tolist(),
        "cells": cells,
        "train_config": {key: cfg[key] for key in ("seed", "local_epochs")},
        "checkpoints": checkpoints,
    }


def _rel(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-12)))


def summarise(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per setting: median / max over checkpoints x draws of each difference to ``whole``."""
    rows = []
    labels = list(result["checkpoints"][0]["graphfedseg"])
    for label in labels:
        if label == WHOLE:
            continue
        diffs: Dict[str, List[float]] = {}
        for ck in result["checkpoints"]:
            g_ref, f_ref = ck["graphfedseg"][WHOLE][0], ck["fedevi"][WHOLE][0]
            for g, f in zip(ck["graphfedseg"][label], ck["fedevi"][label]):
                for name, value in (
                    ("rel_dU", _rel(g["U"], g_ref["U"])),
                    ("dW", float(np.max(np.abs(np.array(g["W"]) - np.array(g_ref["W"]))))),
                    ("d_eff", float(np.max(np.abs(np.array(g["effective_weight"]) - np.array(g_ref["effective_weight"]))))),
                    ("graph_s", max(g["seconds"])),
                    ("rel_dG", _rel(f["G"], f_ref["G"])),
                    ("rel_dA", _rel(f["A"], f_ref["A"])),
                    ("rel_dR", _rel(f["R_paper"], f_ref["R_paper"])),
                    ("d_beta", float(np.max(np.abs(np.array(f["beta"]) - np.array(f_ref["beta"]))))),
                    ("fedevi_s", max(f["seconds"])),
                ):
                    diffs.setdefault(name, []).append(value)
        rows.append({"setting": label, **{f"{k}_median": statistics.median(v) for k, v in diffs.items()},
                     **{f"{k}_max": max(v) for k, v in diffs.items()}})
    whole = {"setting": WHOLE,
             "graph_s_median": statistics.median(max(ck["graphfedseg"][WHOLE][0]["seconds"]) for ck in result["checkpoints"]),
             "fedevi_s_median": statistics.median(max(ck["fedevi"][WHOLE][0]["seconds"]) for ck in result["checkpoints"])}
    return [whole] + rows


def markdown(rows: List[Dict[str, Any]]) -> str:
    head = ["setting", "U: rel. diff (median / max)", "W: max abs diff", "effective weight: max abs diff",
            "slowest site s / pass", "G: rel. diff", "A: rel. diff", "R_paper: rel. diff", "beta: max abs diff",
            "slowest site s / pass"]
    table = []
    for r in rows:
        if r["setting"] == WHOLE:
            table.append(["whole (sliding window)", "-", "-", "-", f"{r['graph_s_median']:.2f}", "-", "-", "-", "-",
                          f"{r['fedevi_s_median']:.2f}"])
            continue

        def pair(name, fmt=".2g"):
            return f"{r[name + '_median']:{fmt}} / {r[name + '_max']:{fmt}}"

        table.append([r["setting"], pair("rel_dU"), pair("dW"), pair("d_eff"), f"{r['graph_s_median']:.2f}",
                      pair("rel_dG"), pair("rel_dA"), pair("rel_dR"), pair("d_beta"), f"{r['fedevi_s_median']:.2f}"])
    return "\n".join(markdown_table(head, table))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site-datalists", required=True)
    parser.add_argument("--rounds", type=int, default=20, help="rounds of the schedule (the KL annealing of FedEvi reads it)")
    parser.add_argument("--at", type=int, nargs="+", default=[1, 5, 20], help="rounds after which to compare")
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--draws", type=int, default=5, help="samples per window count (seeds of different rounds)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (site processes use 1)")
    parser.add_argument("--set", nargs="*", help="train_config overrides key=value")
    parser.add_argument("--out", required=True, help="JSON output (a .md table is written beside it)")
    args = parser.parse_args(argv)
    if max(args.at) > args.rounds:
        parser.error("--at rounds must be <= --rounds")
    result = run(args)
    result["summary"] = summarise(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    table = markdown(result["summary"])
    out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
