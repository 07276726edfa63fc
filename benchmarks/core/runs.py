"""A ``fedseg bench`` output's per-run records (``runs/method-*.json``), read as the renderers and scripts need them."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Dict, List

from benchmarks.core.registry import ReproduceError


def load_runs(out: Path) -> Dict[str, List[Dict[str, Any]]]:
    """``{label: [run record, ...]}`` of the bench's method runs, in seed order.

    Raises:
        ReproduceError: the bench folder holds no method run.
    """
    by_label: Dict[str, List[Dict[str, Any]]] = {}
    for path in sorted((Path(out) / "runs").glob("method-*.json")):
        record = json.loads(path.read_text())
        by_label.setdefault(record["label"], []).append(record)
    if not by_label:
        raise ReproduceError(f"no method runs under {Path(out) / 'runs'}")
    for records in by_label.values():
        records.sort(key=lambda r: r["seed"])
    return by_label


def per_image(records: List[Dict[str, Any]]) -> Dict[int, Dict[str, List[Dict[str, Any]]]]:
    """Seed -> site -> the global model's per-image test rows."""
    return {r["seed"]: r["per_image"]["global"] for r in records}


def median_round_wall(records: List[Dict[str, Any]]) -> float:
    """The median round wall over every run's rounds but the first (the sites' set-up)."""
    walls = [w for r in records for w in (r.get("round_walls") or [])[1:]]
    return statistics.median(walls)
