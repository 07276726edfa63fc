"""What each method costs (``docs/results/cost.md``): round time, payload and memory against FedAvg's in the same
bench, on the built-in families and the real federations, and the server step's cost. The scripts beside this module
measure cost apart from a bench (NVFlare's overhead in the simulator and POC, a site's compute, the server step's
time against the number of sites, many sites, a third class, the window sample, a user's bundle against the
suite's own engine, homomorphic aggregation against the same job in the clear)."""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.cost.render import (render_bundle_path, render_bundle_path_site, render_he_cost, render_multiclass_cost,
                                    render_round_limit)
from benchmarks.server_step.registry import SERVER_STEP_ROUNDS

PAGE = "docs/results/cost.md"

RUNS: Dict[str, Dict[str, Any]] = {
    "round-limit-cpu": {"out": "round_limit_cpu", "result": "round_limit.json",
                        "commands": ["python benchmarks/cost/round_limit.py --out {out} --methods fedavg fedevi --rounds 10"]},
    "bundle-path-cpu": {"out": "bundle_path_cpu", "result": "bundle_path.json",
                        "commands": ["python benchmarks/cost/bundle_path.py --out {out}"]},
    "he-cost-cpu": {"out": "he_cost_cpu", "result": "he_cost.json",
                    "commands": ["python benchmarks/cost/he_cost.py --out {out} --rounds 3 --repeats 2"]},
}

TABLES: Dict[str, Dict[str, Any]] = {
    "fundus-cost": {"run": "fundus", "render": "cost", "title": "Cost on the built-in fundus family, 3 sites"},
    "polyp-cost": {"run": "polyp", "render": "cost", "title": "Cost on the built-in polyp family, 3 sites"},
    "retina-cost": {"run": "fedevi-protocol-retina-base", "render": "cost",
                    "title": "Cost on the real retina federation at native resolution (20 rounds)"},
    "round-limit-cpu": {"run": "round-limit-cpu", "render": "round-limit",
                        "title": "A round against the device's pace on this 2-core CPU: built-in polyp, 3 sites, default profile"},
    "bundle-path-cpu": {"run": "bundle-path-cpu", "render": "bundle-path",
                        "title": "FedAvg's round on the bundle path against today's path on this 2-core CPU: the same network and data"},
    "bundle-path-site-cpu": {"run": "bundle-path-cpu", "render": "bundle-path-site",
                             "title": "Where a site's round goes on each path: one site in one process on this 2-core CPU"},
    "he-cost-cpu": {"run": "he-cost-cpu", "render": "he-cost",
                    "title": "Homomorphic aggregation (CKKS) against the same job in the clear on this 2-core CPU: "
                             "built-in polyp (2-D) and prostate3d (3-D), 3 sites, default profile"},
    **{f"{fed}-server-step-cost": {"run": f"{fed}-server-step", "render": "cost",
                                   "title": f"Cost of the server step on the real {fed} federation ({rounds} rounds)"}
       for fed, rounds in SERVER_STEP_ROUNDS.items()},
}

RENDERERS = {"multiclass-cost": render_multiclass_cost, "round-limit": render_round_limit,
             "bundle-path": render_bundle_path, "bundle-path-site": render_bundle_path_site, "he-cost": render_he_cost}
