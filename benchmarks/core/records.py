"""Run records that ship with the repository: the compact part of a benchmark output that its tables are drawn from.

A ``fedseg bench`` output holds workspaces, jobs, logs, generated data and plots (gigabytes); its tables need only
``results.json`` and the per-run records ``runs/<id>.json`` (final scores, per-image scores for the paired tests,
per-round curves, timings, the command, code version, machine and date). :func:`record_output` copies those into
``benchmarks/results/<output>/`` with every path under the output root written as ``{root}``, so that a record
names no folder of the machine that made it. A benchmark script's output (one JSON file) is copied the same way.

The records folder has the layout of an output root, so ``reproduce.py`` reads either.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator, List

REPO = Path(__file__).resolve().parents[2]
#: the committed records, read by default
RECORDS_ROOT = REPO / "benchmarks" / "results"
#: what an output root's path becomes in a record
ROOT_TOKEN = "{root}"
#: the records folder's size budget (a test keeps it): tables and figures, never weights, images or logs
SIZE_BUDGET_MB = 10.0

#: an absolute POSIX path inside a string (a folder such as ``/srv/data/x``); URLs (``https://``) are not paths
_ABSOLUTE = re.compile(r"(?<![\w:/.{}])/(?:[\w.-]+/)+[\w.-]*")


def sanitise(value: Any, root: str) -> Any:
    """``value`` (JSON-like) with ``root`` (an output root's absolute path) written as ``{root}`` in every string."""
    root = str(root).rstrip("/")
    if isinstance(value, str):
        return value.replace(root, ROOT_TOKEN) if root else value
    if isinstance(value, list):
        return [sanitise(v, root) for v in value]
    if isinstance(value, dict):
        return {sanitise(k, root): sanitise(v, root) for k, v in value.items()}
    return value


def absolute_paths(value: Any) -> Iterator[str]:
    """Every absolute path found in the strings of ``value`` (JSON-like): a record must hold none."""
    if isinstance(value, str):
        yield from _ABSOLUTE.findall(value)
    elif isinstance(value, list):
        for v in value:
            yield from absolute_paths(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from absolute_paths(k)
            yield from absolute_paths(v)


def _write(data: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot record {path}: {e}") from None


def record_output(result: Path, out_root: Path, records_root: Path = RECORDS_ROOT) -> List[Path]:
    """Copy one output's record from ``out_root`` to the same place under ``records_root``.

    Args:
        result: the output's JSON (``<output>/results.json`` of a bench, or a script's ``<output>.json``), under
            ``out_root``.
        out_root: the output root the run wrote under; its path becomes ``{root}`` in the record.
        records_root: where records live (the repository's ``benchmarks/results`` by default).

    Returns:
        The files written: the result JSON and, for a bench, each ``runs/<id>.json`` beside it.

    Raises:
        ValueError: ``result`` is not under ``out_root``, is missing or not JSON, or a path outside ``out_root``
            would remain in the record (it names the path).
    """
    result, out_root = Path(result).resolve(), Path(out_root).resolve()
    try:
        relative = result.relative_to(out_root)
    except ValueError:
        raise ValueError(f"{result} is not under the output root {out_root}") from None
    sources = [result]
    runs = result.parent / "runs"
    if result.name == "results.json" and runs.is_dir():
        sources += sorted(runs.glob("*.json"))
    written = []
    for source in sources:
        data = sanitise(_read(source), str(out_root))
        left = sorted(set(absolute_paths(data)))
        if left:
            raise ValueError(f"cannot record {source}: it names paths outside the output root: {', '.join(left[:3])}")
        target = Path(records_root) / source.relative_to(out_root)
        _write(data, target)
        written.append(target)
    if result.name == "results.json":  # a bench: a run the output no longer has leaves the record too
        for old in set((Path(records_root) / relative.parent / "runs").glob("*.json")) - set(written[1:]):
            old.unlink()
    return written


def folder_size_mb(root: Path = RECORDS_ROOT) -> float:
    """The records folder's size in MB (files only)."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file()) / 1e6
