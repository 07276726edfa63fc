"""What a registry entry is, and the checks and paths every page's registry shares.

A results page's registry (``benchmarks/<page>/registry.py``) declares

* ``RUNS``: run id -> ``{"out": output (folder or .json file, relative to the output root), "commands": [...]}``
  (the exact commands, run from the repository root; the last one writes ``{out}``, earlier ones prepare its data;
  ``{root}`` is the output root, ``{data}`` the real data sets' folder; ``"result"``: the JSON file inside an output
  folder, default ``results.json``);
* ``TABLES``: table id -> ``{"run": RUN or [RUN, ...], "render": RENDERER, "title": ...}`` and the renderer's options
  (:mod:`benchmarks.core.render` lists them);
* ``RENDERERS`` (renderers only its page uses) and ``FIGURES`` (:mod:`benchmarks.core.figures`), where it has any.

``benchmarks/registry.py`` gathers every page's. This module knows no page.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

#: the folder holding the real data sets (retina_vessels/, nuclei_he/, ...) for the import commands; ``--data-root``
#: sets it
DATA_ROOT = os.environ.get("FEDSEG_DATASETS") or ""


#: the renderers whose table is drawn from other tables (``"from"``: accuracy tables) rather than from runs
FROM_TABLES = ("glance", "verdicts")


class ReproduceError(ValueError):
    """A bad table id, registry entry, stored output or failed command; the message names it."""


class MissingOutput(ReproduceError):
    """A table's output does not exist yet; the message gives the commands that make it."""


def check_registry(runs: Mapping[str, Mapping[str, Any]], tables: Mapping[str, Mapping[str, Any]],
                   renderers: Mapping[str, Any]) -> None:
    """Every table names known runs, a known renderer and a title; every run has an output and commands ending in
    the one that writes ``{out}``.

    Raises:
        ReproduceError: naming the table or run that is wrong.
    """
    for run_id, run in runs.items():
        if not run.get("out") or not run.get("commands"):
            raise ReproduceError(f"run {run_id!r}: needs 'out' and 'commands'")
        if "{out}" not in run["commands"][-1]:
            raise ReproduceError(f"run {run_id!r}: its last command must write the output ('{{out}}'): {run['commands'][-1]}")
    for table_id, table in tables.items():
        if table.get("render") not in renderers:
            raise ReproduceError(f"table {table_id!r}: unknown renderer {table.get('render')!r}; known: {sorted(renderers)}")
        if not table.get("title"):
            raise ReproduceError(f"table {table_id!r}: needs a 'title'")
        for key in ("from", "baselines_from"):  # tables drawn from other tables: accuracy tables
            bad = [t for t in table.get(key) or [] if t not in tables or tables[t].get("render") != "accuracy"]
            if bad or (key == "from" and table["render"] in FROM_TABLES and not table.get("from")):
                raise ReproduceError(f"table {table_id!r}: {key!r} must list accuracy tables, got {table.get(key)} (bad: {bad})")
        if table["render"] in FROM_TABLES:
            continue
        unknown = [r for r in run_ids(table) if r not in runs]
        if unknown or not run_ids(table):
            raise ReproduceError(f"table {table_id!r}: unknown run(s) {unknown or table.get('run')}; known: {sorted(runs)}")


def run_ids(table: Mapping[str, Any]) -> List[str]:
    run = table.get("run") or []
    return [run] if isinstance(run, str) else list(run)


def get_table(table_id: str, tables: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    if table_id not in tables:
        raise ReproduceError(f"unknown table {table_id!r}; known tables: {', '.join(sorted(tables))} (see --list)")
    return tables[table_id]


def output_path(run: Mapping[str, Any], root: Path) -> Path:
    """The run's output under ``root`` (what ``{out}`` stands for)."""
    return Path(root) / run["out"]


def result_path(run: Mapping[str, Any], root: Path) -> Path:
    """The JSON a table reads: ``out`` itself when it is a .json file, else ``out/<result or results.json>``."""
    out = output_path(run, root)
    if run.get("result"):
        return out / run["result"]
    return out if out.suffix == ".json" else out / "results.json"


def commands(run: Mapping[str, Any], root: Path, data_root: Optional[str] = None) -> List[str]:
    """The run's commands with ``{out}``, ``{root}`` and ``{data}`` (the real data sets' folder: ``data_root``, else
    ``$FEDSEG_DATASETS`` / ``--data-root``, else left as ``{data}`` for the reader to fill in) filled in."""
    data = data_root or DATA_ROOT or "{data}"
    return [c.format(out=output_path(run, root), root=Path(root), data=data) for c in run["commands"]]


# ------------------------------------------------------------------ shared by the pages' registries
#: the real federations read in place: the import command and the site datalists it writes
REAL_DATA = {
    "retina": ("fedseg data retina --src {data}/retina_vessels --out {root}/cost/retina_data",
               "{root}/cost/retina_data/site_datalists.json"),
    "nuclei": ("fedseg data nuclei --src {data}/nuclei_he --out {root}/cost/nuclei_data",
               "{root}/cost/nuclei_data/site_datalists.json"),
}


def real_bench(federation: str, out: str, options: str) -> Dict[str, Any]:
    """A run of ``fedseg bench`` on a real federation at native resolution: import, then the bench with ``options``
    (methods, references, seeds, rounds), one local epoch and the 0.2 s task request interval."""
    import_data, datalists = REAL_DATA[federation]
    return {"out": out, "commands": [import_data, f"fedseg bench --site-datalists {datalists} {options} --local-epochs 1 "
                                                  "--task-request-interval 0.2 --out {out}"]}
