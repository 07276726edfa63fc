"""A site's compute per round for FedAvg, GraphFedSeg and FedEvi, interleaved in one process.

``fedseg bench`` runs one method after another, so on a shared machine a change of load between runs moves
their round-time ratios. Here every round runs each method's site work back to back on the same site and
the same starting weights, in a rotating order, so the ratio of each round is taken under (nearly) the
same load; the medians of these per-round ratios are the methods' site-side cost relative to FedAvg. The
framework's share (a second task, a larger payload) is not in here: read it from the bench's
``task_breakdown``.

Per method and round, timed with ``time.perf_counter``:

* ``fedavg``: ``engine.train`` (the bundle's loss) + ``validation_metrics`` (what a FedAvg site does);
* ``graphfedseg`` / ``graph_whole``: ``begin_round`` with a direction of the model's size (the regulariser
  on, lambda1 = 0.01) + train + validation + ``end_round`` (U_i on the window sample / on whole images);
* ``fedevi`` / ``fedevi_whole``: FedEvi's train + validation + ``end_round`` (keeps the local model in a
  temporary state folder) + the ``evaluate_surrogate`` task (window sample / whole images).

Usage:
    python benchmarks/cost/site_cost.py --site-datalists bench_out/cost/retina_data/site_datalists.json \\
        --rounds 5 [--whole] --out bench_out/cost/site_cost_retina.json
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
from typing import Any, Callable, Dict, List

import torch

from fedseg.bench.simulator import machine_info
from fedseg.markdown import markdown_table


def site_rounds(site: str, datalist: str, rounds: int, whole: bool, seed: int) -> Dict[str, List[float]]:
    from fedseg.config import resolve_profile
    from fedseg.engine.engine import SegEngine
    from fedseg.objectives.base import ClientObjective, RoundContext
    from fedseg.objectives.fedevi import DEFAULT_SURROGATE_WINDOWS, FedEviObjective
    from fedseg.objectives.graphfedseg import DEFAULT_UNCERTAINTY_WINDOWS, GraphFedSegObjective

    cfg = dict(resolve_profile("default")["train_config"], seed=seed, local_epochs=1)
    engine = SegEngine(site, datalist, cfg)
    torch.manual_seed(seed)
    start = engine.build_network()
    initial = copy.deepcopy(start.state_dict())
    direction = {k: (torch.randn_like(p) / p.numel() ** 0.5).numpy() for k, p in start.named_parameters()}
    state_dir = tempfile.mkdtemp(prefix="site_cost_")
    models: Dict[str, torch.nn.Module] = {}

    def fedavg(model, ctx):
        engine.train(model, ClientObjective(), ctx)
        engine.validation_metrics(model)

    def graph(windows):
        def run(model, ctx):
            objective = GraphFedSegObjective(uncertainty_windows=windows)
            objective.begin_round(ctx, model)
            engine.train(model, objective, ctx)
            engine.validation_metrics(model)
            objective.end_round(ctx, model, engine)
        return run

    def fedevi(windows):
        def run(model, ctx):
            objective = FedEviObjective(surrogate_windows=windows)
            objective.begin_round(ctx, model)
            engine.train(model, objective, ctx)
            engine.validation_metrics(model)
            objective.end_round(ctx, model, engine)
            surrogate = copy.deepcopy(model)  # any model of the right shape: the cost is the same
            objective.handle_task("evaluate_surrogate", ctx, surrogate, engine)
        return run

    methods: Dict[str, Callable] = {"fedavg": fedavg, "graphfedseg": graph(DEFAULT_UNCERTAINTY_WINDOWS),
                                    "fedevi": fedevi(DEFAULT_SURROGATE_WINDOWS)}
    if whole:
        methods["graph_whole"] = graph("whole_image")
        methods["fedevi_whole"] = fedevi("whole_image")
    names = list(methods)
    seconds: Dict[str, List[float]] = {n: [] for n in names}
    for round_ in range(-1, rounds):  # round -1: warm-up (fills the caches), not timed
        order = names[max(round_, 0) % len(names):] + names[: max(round_, 0) % len(names)]
        for name in order:
            model = models.setdefault(name, engine.build_network())  # one model (and optimiser) per method
            model.load_state_dict(initial)
            meta = {"graphfedseg": {"lambda1": 0.01, "direction": direction}, "fedevi": {"round": max(round_, 0)}}
            ctx = RoundContext(site, max(round_, 0), 20, server_meta=meta, train_config=engine.train_config, state_dir=state_dir)
            started = time.perf_counter()
            methods[name](model, ctx)
            if round_ >= 0:
                seconds[name].append(time.perf_counter() - started)
        if round_ >= 0:
            print(f"{site} round {round_}: " + ", ".join(f"{n} {seconds[n][-1]:.2f}s" for n in names), flush=True)
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site-datalists", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--whole", action="store_true", help="also the whole-image settings (slow)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    mapping = json.loads(Path(args.site_datalists).read_text())
    result: Dict[str, Any] = {"command": " ".join(sys.argv), "date": f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
                              "machine": machine_info(), "sites": {}}
    rows = []
    for site, datalist in mapping.items():
        seconds = site_rounds(site, datalist, args.rounds, args.whole, args.seed)
        result["sites"][site] = seconds
        for name, values in seconds.items():
            ratios = [v / f for v, f in zip(values, seconds["fedavg"])]
            rows.append([site, name, f"{statistics.median(values):.2f}",
                         f"{statistics.median(ratios):.2f}x ({min(ratios):.2f} - {max(ratios):.2f})"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    table = "\n".join(markdown_table(["site", "method", "median s / round",
                                       "median per-round ratio to FedAvg (min - max)"], rows))
    out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
