"""Run an exported job in NVFlare's simulator from a test and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

from fedseg.fl.component_policy import prepare_simulator_workspace


def run_simulator(job: Path, workspace: Path, n_clients: int = 3, timeout: int = 900, clients: Optional[List[str]] = None) -> Dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    prepare_simulator_workspace(workspace)  # jobs carry no code: the simulated sites allow fedseg's components
    cmd = ["nvflare", "simulator", str(job), "-w", str(workspace), "-t", str(len(clients) if clients else n_clients)]
    cmd += ["-c", ",".join(clients)] if clients else ["-n", str(n_clients)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    reports = list(workspace.rglob("report.json"))
    assert len(reports) == 1, f"expected one report.json under {workspace}, found {reports}\n{log[-3000:]}"
    return json.loads(reports[0].read_text()) | {"_path": str(reports[0]), "_log": log}


def read_audit(report: Dict) -> List[Dict]:
    path = Path(report["_path"]).parent / "privacy_audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
