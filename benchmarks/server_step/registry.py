"""Each method with the server step, against the strongest baselines (``docs/results/server-step.md``): every method
with and without FedAvgM's heavy-ball step against FedAvg, FedAvgM and FedDyn on the real retina and nuclei
federations, and on retina every other baseline against the same three (a bench that reuses their runs). Their cost
tables are on the cost page (``benchmarks/cost/registry.py``).
"""

from __future__ import annotations

from typing import Any, Dict, List

from benchmarks.core.registry import REAL_DATA

PAGE = "docs/results/server-step.md"

#: rounds of each real federation's server-step bench (its command and its tables' titles)
SERVER_STEP_ROUNDS = {"retina": 20, "nuclei": 10}

#: a bench of every method with and without the server step: the baselines, then each method plain and stepped
SERVER_STEP_METHODS = " ".join(
    ["fedavg", "fedevi", "fedavgm", "feddyn"]
    + [f"{m}+m={m}:server_optimizer=sgd-momentum" for m in ("fedevi", "graphfedseg", "fvac", "pathfl")] + ["fvac", "graphfedseg", "pathfl"])

#: the papers' baselines besides FedAvgM and FedDyn; with them, every baseline the suite ships
PAPER_BASELINES = "fedprox scaffold fedadam fedbn ditto fedrep moon fedce"
#: every baseline of the retina baselines bench, in its tables' order
RETINA_BASELINES = ["fedavgm", "feddyn", *PAPER_BASELINES.split()]

RUNS: Dict[str, Dict[str, Any]] = {
    # every method with and without the server step (FedAvgM's heavy ball, lr 1, momentum 0.6) against FedAvg and the
    # baselines with a server-side correction, real retina; FedAvg and FedEvi are the protocol bench's runs
    "retina-server-step": {"out": "retina_server_step", "commands": [
        REAL_DATA["retina"][0],
        f"fedseg bench --site-datalists {REAL_DATA['retina'][1]} --methods {SERVER_STEP_METHODS} --references "
        f"--seeds 0 1 2 --rounds {SERVER_STEP_ROUNDS['retina']} --local-epochs 1 --task-request-interval 0.2 "
        "--reuse {root}/fedevi_protocol/retina_base --out {out}"]},
    # every other baseline on the same budget, paired with the server-step bench's FedAvg, FedAvgM and FedDyn runs
    # (reused: the same runs, so the glance can draw its best baseline from both benches). Seed 0 of the eight ran on
    # a machine loaded well past its 2 cores, where a task took over the default 300 s (the timeout does not change a
    # finished run); seeds 1 and 2 back to back on a quiet one
    "retina-baselines": {"out": "retina_baselines", "commands": [
        REAL_DATA["retina"][0],
        f"fedseg bench --site-datalists {REAL_DATA['retina'][1]} --methods fedavg fedavgm feddyn {PAPER_BASELINES} "
        f"--references --seeds 0 1 2 --rounds {SERVER_STEP_ROUNDS['retina']} --local-epochs 1 "
        "--task-request-interval 0.2 --task-timeout 3600 --reuse {root}/retina_server_step --out {out}"]},
    # the same on the real nuclei federation (MoNuSeg / TNBC at 40x, native resolution); every method run here.
    # 10 rounds, whole-tile validation only in the last: on 2 CPUs a run of 20 rounds took 6 min (33 runs: 3.3 h), a
    # third of it the sliding-window test of the 1000 px tiles, and each validation round 4x a training round
    "nuclei-server-step": {"out": "nuclei_server_step", "commands": [
        REAL_DATA["nuclei"][0],
        f"fedseg bench --site-datalists {REAL_DATA['nuclei'][1]} --methods {SERVER_STEP_METHODS} --references "
        f"--seeds 0 1 2 --rounds {SERVER_STEP_ROUNDS['nuclei']} --local-epochs 1 --task-request-interval 0.2 "
        f"--set validate_every={SERVER_STEP_ROUNDS['nuclei']} --out {{out}}"]},
}


def server_step_tables(federation: str, data: str, metrics: List[str],
                       baselines_from: List[str]) -> Dict[str, Dict[str, Any]]:
    """The three tables of a server-step bench on a real federation: accuracy against FedAvg (``data``: its glance
    label; ``metrics``: extra accuracy columns; ``baselines_from``: benches sharing its FedAvg runs whose baselines
    compete for the glance's best baseline), the same runs against FedAvgM, and the ranking."""
    run, where, budget = f"{federation}-server-step", f"real {federation} federation", f"({SERVER_STEP_ROUNDS[federation]} rounds)"
    tables = {
        run: {"title": f"Each method with the server step, against FedAvg, FedAvgM and FedDyn, {where} at native "
                       "resolution " + budget, "render": "accuracy", "data": data,
              **({"metrics": metrics} if metrics else {}), **({"baselines_from": baselines_from} if baselines_from else {})},
        f"{run}-vs-fedavgm": {"render": "accuracy", "baseline": "fedavgm",
                              "title": f"The same runs against FedAvgM, {where} {budget}"},
        f"{run}-ranking": {"render": "ranking", "baseline": "fedavg",
                           "title": f"Which approach to use on the {where} {budget}"},
    }
    return {table: {"run": run, **entry} for table, entry in tables.items()}


TABLES: Dict[str, Dict[str, Any]] = {
    # retina's glance verdict and best baseline come from every baseline: the two retina benches share their FedAvg runs
    **{table: entry for fed, data, metrics, baselines_from in (
        ("retina", "real retina (DRIVE / STARE / CHASE_DB1), native resolution", ["dice_fov@DRIVE"],
         ["retina-baselines"]),
        ("nuclei", "real nuclei (MoNuSeg / TNBC), native resolution", [], []))
       for table, entry in server_step_tables(fed, data, metrics, baselines_from).items()},
    "retina-baselines": {"run": "retina-baselines", "render": "accuracy", "metrics": ["dice_fov@DRIVE"],
                         "title": f"Every baseline against FedAvg, real retina federation at native resolution "
                                  f"({SERVER_STEP_ROUNDS['retina']} rounds)"},
    "retina-baselines-vs-strongest": {
        "run": "retina-baselines", "render": "versus", "labels": RETINA_BASELINES, "against": ["fedavgm", "feddyn"],
        # FedAvg, FedAvgM and FedDyn were timed in another bench, on another day and load: no round-time ratio here
        "round_time": False,
        "title": f"The same baselines against FedAvgM and FedDyn, real retina federation ({SERVER_STEP_ROUNDS['retina']} "
                 "rounds)"},
}
