"""What each method costs (``docs/results/cost.md``): round time, payload and memory against FedAvg's in the same
bench, on the built-in families and the real federations, and the server step's cost. The scripts beside this module
measure cost apart from a bench (NVFlare's overhead in the simulator and POC, a site's compute, the server step's
time against the number of sites, many sites, a third class, the window sample)."""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.cost.render import render_multiclass_cost
from benchmarks.server_step.registry import SERVER_STEP_ROUNDS

PAGE = "docs/results/cost.md"

RUNS: Dict[str, Dict[str, Any]] = {}

TABLES: Dict[str, Dict[str, Any]] = {
    "fundus-cost": {"run": "fundus", "render": "cost", "title": "Cost on the built-in fundus family, 3 sites"},
    "polyp-cost": {"run": "polyp", "render": "cost", "title": "Cost on the built-in polyp family, 3 sites"},
    "retina-cost": {"run": "fedevi-protocol-retina-base", "render": "cost",
                    "title": "Cost on the real retina federation at native resolution (20 rounds)"},
    **{f"{fed}-server-step-cost": {"run": f"{fed}-server-step", "render": "cost",
                                   "title": f"Cost of the server step on the real {fed} federation ({rounds} rounds)"}
       for fed, rounds in SERVER_STEP_ROUNDS.items()},
}

RENDERERS = {"multiclass-cost": render_multiclass_cost}
