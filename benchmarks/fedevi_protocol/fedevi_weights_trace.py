"""FedEvi's evidential weights round by round: the suite's federated run against the authors' round loop, same data.

Two sites of the built-in polyp family (a larger and a smaller one, as Kvasir-SEG / CVC-ClinicDB), FedEvi's ``paper``
profile (the authors' local protocol) at a reduced size, every seed twice:

* ``suite``: FedEvi through the real server workflow (``fedseg.bench.inprocess``: the controller, the strategy, the
  objective, the train and surrogate tasks of each round, the sites' optimiser state), one process;
* ``loop``: the authors' main loop written out here from their code's facts, sharing only the data pipeline, the
  network constructor and its seeded initial weights: local models overwritten by the global model, one epoch of
  Adam (betas 0.9 / 0.99, weight decay 1e-5, the state kept, x0.99 per round) on the evidential Dice + annealed KL
  written here, then the surrogate ``sum beta^{r-1} theta_k^r``, each site's G (surrogate, epistemic) and A (its own
  fresh model, aleatoric) over its validation images in eval mode, ``beta += G / A``, normalised, clipped at 1e-3,
  and the new global model ``sum beta^r theta_k^r``.

Per round and site it records G, A and beta. If the suite computed A at another time, on other images or in another
model state than the authors' order, the two columns would part; the results page sets them side by side.

Usage:
    python benchmarks/fedevi_protocol/fedevi_weights_trace.py --out DIR [--seeds 0 1 2] [--rounds 30] [--loop-seeds 0]
        [--site-datalists SITES.json]
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]

#: the two sites: (name, number of images), the first about 1.7 times the second as Kvasir-SEG / CVC-ClinicDB
SITES = (("site-1", 140), ("site-2", 84))
IMAGE_SIZE = 64


def federation(out: Path, site_datalists: str = None) -> Dict[str, str]:
    """Site name -> datalist: the two built-in sites, or the two of ``site_datalists`` (a JSON mapping, as
    ``fedseg bench --site-datalists`` takes; e.g. Kvasir-SEG and CVC-ClinicDB)."""
    from fedseg.data.synthetic import generate_site_data

    if site_datalists:
        sites = json.loads(Path(site_datalists).read_text())
        if len(sites) != 2:
            raise SystemExit(f"--site-datalists: the trace compares two sites, {site_datalists} names {len(sites)}")
        return {s: str(Path(p).resolve()) for s, p in sites.items()}
    return {s: str(generate_site_data("polyp", s, out / "data", seed=0, profile="default", image_size=IMAGE_SIZE, num_images=n))
            for s, n in SITES}


def train_config(seed: int) -> Dict[str, Any]:
    from fedseg.config import resolve_profile
    from fedseg.recipes.fedevi import PAPER_PROFILES

    cfg = resolve_profile("paper", PAPER_PROFILES, None, image_size=IMAGE_SIZE, local_epochs=1, seed=seed,
                          eval_best_val_round=False, eval_largest_component=False)["train_config"]
    return cfg


def suite_run(sites: Dict[str, str], rounds: int, seed: int, out: Path) -> Dict[str, Any]:
    """FedEvi through the server workflow, in process: the per-round G, A, beta of its report."""
    from fedseg.bench.inprocess import run_in_process

    report = run_in_process("fedevi", sites, out, profile="paper", num_rounds=rounds, image_size=IMAGE_SIZE, local_epochs=1,
                            seed=seed, eval_best_val_round=False, eval_largest_component=False)
    return {k: [r[k] for r in report["rounds"]] for k in ("G", "A", "beta")}


# ------------------------------------------------------------------------------------------ the authors' loop
def evidential_loss(logits: torch.Tensor, labels: torch.Tensor, round_1based: int) -> torch.Tensor:
    """Their EDL_Dice_Loss: Dice on rho = alpha / S (squared denominator, batch sums, both classes) + 0.01 *
    min(1, round / 10) * KL(Dir(alpha~) || Dir(1)) averaged over pixels, alpha~ without the true class's evidence."""
    alpha = torch.exp(torch.clamp_max(logits, 80)) + 1
    strength = alpha.sum(dim=1, keepdim=True)
    rho = alpha / strength
    onehot = torch.zeros_like(rho).scatter_(1, labels.long(), 1.0)
    dims = (0, 2, 3)
    dice = ((2 * (rho * onehot).sum(dims) + 1e-5) / ((rho ** 2).sum(dims) + onehot.sum(dims) + 1e-5)).mean()
    tilde = (alpha - 1) * (1 - onehot) + 1
    s = tilde.sum(dim=1, keepdim=True)
    classes = torch.tensor(float(alpha.shape[1]))
    kl = (torch.lgamma(s) - torch.lgamma(tilde).sum(dim=1, keepdim=True) - torch.lgamma(classes)
          + ((tilde - 1) * (torch.digamma(tilde) - torch.digamma(s))).sum(dim=1, keepdim=True))
    return 1 - dice + 0.01 * min(1.0, round_1based / 10) * kl.mean()


def scores(global_model: torch.nn.Module, local_model: torch.nn.Module, engine) -> tuple:
    """Their scoring_func: per validation image (eval mode) the pixel-mean epistemic uncertainty of the surrogate and
    the pixel-mean aleatoric uncertainty of the local model; the means over the images."""
    global_model.eval()
    local_model.eval()
    gaps, data = [], []
    with torch.no_grad():
        for batch in engine.loader("validation"):
            x = batch["image"]
            for model, out in ((global_model, gaps), (local_model, data)):
                alpha = torch.exp(torch.clamp_max(model(x).double(), 80)) + 1
                s = alpha.sum(dim=1, keepdim=True)
                rho = alpha / s
                aleatoric = (rho * (torch.digamma(s + 1) - torch.digamma(alpha + 1))).sum(dim=1)
                value = (-(rho * torch.log(rho)).sum(dim=1) - aleatoric) if model is global_model else aleatoric
                out.append(float(value.mean()))
    return float(np.mean(gaps)), float(np.mean(data))


def authors_loop(sites: Dict[str, str], rounds: int, seed: int) -> Dict[str, Any]:
    from fedseg.engine.engine import SegEngine

    cfg = train_config(seed)
    names = list(sites)
    engines = {s: SegEngine(s, sites[s], cfg) for s in names}
    global_model = engines[names[0]].build_network()  # the job's seeded initial weights, as the suite's server
    local = {s: copy.deepcopy(global_model) for s in names}
    optimisers = {s: torch.optim.Adam(local[s].parameters(), lr=cfg["learning_rate"], betas=tuple(cfg["adam_betas"]),
                                      weight_decay=cfg["weight_decay"]) for s in names}
    schedulers = {s: torch.optim.lr_scheduler.ExponentialLR(optimisers[s], gamma=cfg["lr_decay_per_round"]) for s in names}
    n = np.array([engines[s].n_train for s in names], dtype=np.float64)
    beta = n / n.sum()
    trace: Dict[str, List[Dict[str, float]]] = {"G": [], "A": [], "beta": []}
    for r in range(rounds):
        for s in names:  # distribute
            with torch.no_grad():
                for p, q in zip(local[s].state_dict().values(), global_model.state_dict().values()):
                    p.copy_(q)
        for s in names:
            local[s].train()
            for batch in engines[s].loader("training", shuffle=True, train=True):
                optimisers[s].zero_grad()
                loss = evidential_loss(local[s](batch["image"]), batch["label"], r + 1)
                loss.backward()
                optimisers[s].step()
            schedulers[s].step()
        surrogate = _average(global_model, [local[s] for s in names], beta)
        stats = {s: scores(surrogate, local[s], engines[s]) for s in names}
        beta = beta + np.array([stats[s][0] / stats[s][1] for s in names])
        beta = np.clip(beta / beta.sum(), 1e-3, None)
        global_model = _average(global_model, [local[s] for s in names], beta)
        trace["G"].append({s: stats[s][0] for s in names})
        trace["A"].append({s: stats[s][1] for s in names})
        trace["beta"].append(dict(zip(names, beta.tolist())))
    return trace


def _average(template: torch.nn.Module, models: List[torch.nn.Module], weights: np.ndarray) -> torch.nn.Module:
    out = copy.deepcopy(template)
    states = [m.state_dict() for m in models]
    with torch.no_grad():
        for key, value in out.state_dict().items():
            if value.is_floating_point():
                value.copy_(sum(float(w) * st[key] for w, st in zip(weights, states)))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--site-datalists", default=None,
                        help="JSON mapping of two site names to their datalists (default: two built-in polyp sites)")
    parser.add_argument("--loop-seeds", nargs="*", type=int, default=None,
                        help="seeds the authors' loop also runs for (default: every seed)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "custom"))
    from fedseg.bench.bench import code_version
    from fedseg.bench.simulator import machine_info

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    started, version, machine = time.perf_counter(), code_version(), machine_info()
    sites = federation(out, args.site_datalists)
    result: Dict[str, Any] = {
        "benchmark": "fedevi_weights_trace",
        "command": "python " + " ".join([os.path.relpath(__file__, REPO)] + list(argv if argv is not None else sys.argv[1:])),
        "code_version": version, "machine": machine, "seeds": args.seeds, "rounds": args.rounds,
        "sites": {s: {"n_train": None} for s in sites}, "image_size": IMAGE_SIZE,
        "train_config": train_config(args.seeds[0]), "runs": {"suite": {}, "loop": {}},
    }
    from fedseg.engine.engine import SegEngine

    for s in sites:
        result["sites"][s]["n_train"] = SegEngine(s, sites[s], result["train_config"]).n_train
    path = out / "fedevi_weights_trace.json"
    loop_seeds = args.seeds if args.loop_seeds is None else args.loop_seeds
    for seed in args.seeds:
        for kind in ("suite", "loop") if seed in loop_seeds else ("suite",):
            t = time.perf_counter()
            trace = (suite_run(sites, args.rounds, seed, out / f"suite-seed{seed}") if kind == "suite"
                     else authors_loop(sites, args.rounds, seed))
            result["runs"][kind][str(seed)] = {**trace, "seconds": time.perf_counter() - t}
            result["date"] = _dt.datetime.now().isoformat(timespec="seconds")
            result["wall_time_s"] = time.perf_counter() - started
            path.write_text(json.dumps(result, indent=1))
            print(f"{kind} seed {seed}: {time.perf_counter() - t:.0f} s; beta at the end {trace['beta'][-1]}", flush=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
