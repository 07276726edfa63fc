"""The paper budget of the GPU check (``gpu_check.py``, step 7): what it runs, for the check that runs it and for the
GPU page that names its commands (``render.py``), also where it did not finish."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

#: the paper budget on one GPU: FedEvi's and GraphFedSeg's papers train 4 polyp sites at 384 px for 200 rounds, two
#: local epochs; each method against FedAvg under the method's own ``paper`` protocol, the two benches at once
PAPER_BUDGET_SITES = ["site-1", "site-2", "site-3", "site-4"]
PAPER_BUDGET_ROUNDS = 200
#: the budget's precision: bfloat16 autocast (weights, optimiser and evaluation stay float32), a speed option the
#: papers did not use; the results page says so beside the numbers
PAPER_BUDGET_SETS = ["amp=bfloat16"]


def paper_budget_commands(out: Path, quick: bool) -> Dict[str, List[str]]:
    """The two ``fedseg bench`` commands of the paper budget, one per method and its own protocol."""
    commands = {}
    for method in ("fedevi", "graphfedseg"):
        cmd = ["fedseg", "bench", "--family", "polyp", "--sites", *PAPER_BUDGET_SITES, "--methods", "fedavg", method,
               "--seeds", "0", "--references", "--parallel", "2", "--out", str(out / f"paper_{method}")]
        if quick:
            cmd += ["--profile", "tiny", "--rounds", "2"]
        else:
            cmd += ["--data-profile", "gpu", "--profile", "paper", "--protocol", method,
                    "--rounds", str(PAPER_BUDGET_ROUNDS), "--set", *PAPER_BUDGET_SETS]
        commands[method] = cmd
    return commands
