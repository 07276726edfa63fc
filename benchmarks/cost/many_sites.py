"""Many sites: does a round complete with 16, 32, 64 sites, and how does the server's memory grow with K?

For each method and K, the ``tiny`` job runs in NVFlare's simulator on built-in data with K sites and a few
simulator threads (``--threads``; with fewer threads than sites the simulator runs sites in turns, each task in a
fresh site process that restores its training state from disk, so K = 64 does not need 64 resident processes).
Read from each run's ``report.json``:
    server MB     ``server_peak_memory_mb`` of the last round (peak RSS of the server process; in the simulator
                  that process also hosts the simulator's bookkeeping, the same for every method)
    round s       median ``wall_time`` over rounds
    missing       sites absent from any round (must be 0)
Verdicts (PASS/FAIL lines, exit status 1 on any FAIL): every site in every round; server memory linear in K
(r >= 0.95); each strategy's held state within its budget (FedAvg 1 model, GraphFedSeg 2K + 2).
Per method, a least-squares line of server MB against K (``scipy.stats.linregress``) gives MB per site.
In process (``--state-methods``), the tensors a strategy holds after one round with K sites, in copies of the
model: what a method adds per site on top of FedAvg's one global model.

Usage:
    python benchmarks/cost/many_sites.py --sites 4 16 32 64 --methods fedavg graphfedseg --out bench_out/many_sites
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

from fedseg.processes import StopOnSignal
from fedseg.markdown import markdown_table


def run(method: str, k: int, out: Path, rounds: int, threads: int) -> Dict[str, Any]:
    from fedseg.bench.simulator import run_simulator
    from fedseg.recipes.export import export_job
    from fedseg.data.synthetic import generate_federation

    sites = [f"site-{i + 1}" for i in range(k)]
    family = "nuclei" if method == "pathfl" else "polyp"
    paths = generate_federation(family, sites, out / "data" / f"{family}_{k}", profile="tiny")
    site_map = out / "data" / f"{family}_{k}.json"
    site_map.write_text(json.dumps({s: str(Path(p).resolve()) for s, p in paths.items()}, indent=1))
    job = export_job(method, out / "jobs" / f"{method}_{k}", "tiny", num_rounds=rounds,
                     script_args=f"--site_datalists {site_map}", min_clients=k, data_family=family)
    res = run_simulator(job, out / "ws" / f"{method}_{k}", sites, threads=min(threads, k),
                        log_path=out / "logs" / f"{method}_{k}.log")
    rounds_ = res["report"]["rounds"]
    return {
        "method": method, "sites": k, "threads": min(threads, k), "rounds": len(rounds_),
        "server_peak_memory_mb": rounds_[-1].get("server_peak_memory_mb"),
        "median_round_s": statistics.median(r["wall_time"] for r in rounds_),
        "missing": sorted({s for r in rounds_ for s in r.get("missing", [])}),
        "upload_mb_per_round": statistics.median(r.get("bytes_received", 0) for r in rounds_) / 1e6,
        "total_wall_s": res["total_wall_s"], "command": res["command"],
    }


def strategy_state_mb(method: str, k: int) -> Dict[str, float]:
    """In process, no simulator: the bytes a method's server strategy holds after one round with K sites
    (its ``state_dict()``: global, personalised and any other per-site tensors), for the ``tiny`` network.
    ``models`` = that size in copies of the model."""
    import torch

    from fedseg.config import resolve_profile
    from fedseg.fl.controller import payload_bytes
    from fedseg.recipes.base import build_initial_network
    from fedseg.strategies.base import ClientUpdate
    from fedseg.strategies.registry import build_strategy

    reference = dict(build_initial_network(resolve_profile("tiny")["train_config"]).state_dict())
    strategy = build_strategy(method)
    sites = [f"site-{i + 1}" for i in range(k)]
    strategy.start(sites, reference)
    gen = torch.Generator().manual_seed(0)
    updates = {
        s: ClientUpdate(site=s, n_samples=10, metrics={}, meta={"uncertainty": 0.5}, params={
            n: v + 0.01 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for n, v in reference.items()})
        for s in sites
    }
    strategy.aggregate(0, updates, lambda *args, **kwargs: {})
    model_mb = payload_bytes(reference) / 1e6
    state_mb = payload_bytes(strategy.state_dict()) / 1e6
    return {"method": method, "sites": k, "model_mb": model_mb, "state_mb": state_mb, "models": state_mb / model_mb}


@StopOnSignal("many_sites")  # SIGTERM / Ctrl-C end the runs it started too
def main(argv=None) -> Dict[str, Any]:
    from scipy.stats import linregress

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, nargs="+", default=[4, 16, 32, 64])
    parser.add_argument("--methods", nargs="*", default=["fedavg", "graphfedseg"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="simulator threads (site processes at a time)")
    parser.add_argument("--state-methods", nargs="*", default=["fedavg", "graphfedseg"],
                        help="strategies whose held state is measured in process for each K (no simulator)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    states = [strategy_state_mb(m, k) for m in args.state_methods for k in args.sites]
    print("\n".join(markdown_table(["strategy", "K", "state held after a round (MB)", "in model copies"],
                                   [[r["method"], str(r["sites"]), f"{r['state_mb']:.2f}", f"{r['models']:.1f}"]
                                    for r in states])), flush=True)
    rows: List[Dict[str, Any]] = []
    for method in args.methods:
        for k in args.sites:
            print(f"[{_dt.datetime.now():%H:%M:%S}] {method} K={k} ...", flush=True)
            rows.append(run(method, k, out, args.rounds, args.threads))
            print(f"    server {rows[-1]['server_peak_memory_mb']:.0f} MB, round {rows[-1]['median_round_s']:.1f} s, "
                  f"missing {rows[-1]['missing']}", flush=True)
    fits = {}
    for method in args.methods:
        mine = [r for r in rows if r["method"] == method]
        if len(mine) >= 2:
            fit = linregress([r["sites"] for r in mine], [r["server_peak_memory_mb"] for r in mine])
            fits[method] = {"mb_per_site": fit.slope, "intercept_mb": fit.intercept, "r": fit.rvalue}
    result = {"benchmark": "many_sites", "date": _dt.datetime.now().isoformat(timespec="seconds"),
              "command": "python " + " ".join([sys.argv[0]] + (list(argv) if argv is not None else sys.argv[1:])),
              "rows": rows, "fits": fits, "strategy_state": states}
    (out / "many_sites.json").write_text(json.dumps(result, indent=1))
    print("\n" + "\n".join(markdown_table(
        ["method", "K", "threads", "server peak MB", "median round (s)", "upload MB/round", "missing"],
        [[r["method"], str(r["sites"]), str(r["threads"]), f"{r['server_peak_memory_mb']:.0f}", f"{r['median_round_s']:.1f}",
          f"{r['upload_mb_per_round']:.2f}", str(len(r["missing"]))] for r in rows])))
    for method, fit in fits.items():
        print(f"{method}: {fit['mb_per_site']:.2f} MB per site (intercept {fit['intercept_mb']:.0f} MB, r = {fit['r']:.3f})")
    verdicts = verdicts_of(rows, fits, states)
    for ok, text in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}: {text}")
    result["passed"] = all(ok for ok, _ in verdicts)
    (out / "many_sites.json").write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out / 'many_sites.json'}\nmany_sites: {'PASS' if result['passed'] else 'FAIL'}")
    return result


#: model copies a strategy may hold after a round with K sites (docs/reliability.md, "Many sites")
STATE_BUDGET = {"fedavg": lambda k: 1, "graphfedseg": lambda k: 2 * k + 2}


def verdicts_of(rows, fits, states) -> List[tuple]:
    """(passed, what) for: every site in every round; server memory linear in K (r >= 0.95); each strategy's
    held state within its budget of model copies (1 % slack for the graph and norms)."""
    out = [(not r["missing"], f"{r['method']} K={r['sites']}: every site in every round (missing {r['missing']})")
           for r in rows]
    out += [(fit["r"] >= 0.95, f"{m}: server memory linear in K ({fit['mb_per_site']:.2f} MB per site, r = {fit['r']:.3f})")
            for m, fit in fits.items()]
    out += [(st["models"] <= STATE_BUDGET[st["method"]](st["sites"]) * 1.01,
             f"{st['method']} K={st['sites']}: state {st['models']:.1f} model copies <= {STATE_BUDGET[st['method']](st['sites'])}")
            for st in states if st["method"] in STATE_BUDGET]
    return out


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
