"""Every table of the results pages from one stored command: ``python benchmarks/reproduce.py TABLE [--run]``.

The registry (``benchmarks/registry.py``: one module per results page, ``benchmarks/<page>/registry.py``) names each
table: the run that makes its data (the exact commands, run from the repository root; the last one writes the
output, earlier ones prepare its data), the output it reads, its renderer and its page. A table is one markdown table
with a one-line caption above it: data, seeds, budget, machine, date and the code version, all read from the output
(``results.json`` of a ``fedseg bench`` run, or a benchmark script's JSON).

Usage:
    python benchmarks/reproduce.py --list                   # tables, their pages, records and commands
    python benchmarks/reproduce.py fundus-accuracy          # render from its committed record (benchmarks/results)
    python benchmarks/reproduce.py fundus-accuracy --run    # run its commands (into --out-root), record, render
    python benchmarks/reproduce.py fundus-accuracy --record # record an output made earlier (or on a GPU machine)
    python benchmarks/reproduce.py --all                    # every table, and the figures (--figures DIR)
    python benchmarks/reproduce.py --check-page README.md docs/benchmarks.md docs/results/*.md  # pages = renders?
    python benchmarks/reproduce.py --update-page README.md docs/benchmarks.md docs/results/*.md # rewrite their tables
    python benchmarks/reproduce.py glance                   # "Results at a glance", linked to each table's page
    ... --records DIR      read records from DIR (an output root has the same layout, so it can be named too)
    ... --out-root DIR     where --run writes its outputs (default $FEDSEG_BENCH_OUT, else ./bench_out)
    ... --data-root DIR    the real data sets' parent folder for the import commands (default $FEDSEG_DATASETS)

Records (``benchmarks/core/records.py``): a run's tables need its ``results.json`` and per-run records only; those
are committed under ``benchmarks/results/`` with the output root written as ``{root}``. Workspaces, logs, generated
data, plots and weights stay in the output root, out of git.

Adding a table: a run in its page's ``RUNS`` (output folder or file relative to the output root, and its commands,
with ``{out}`` for that output and ``{root}`` for the output root) if its run is new, then one entry in its page's
``TABLES``: ``{"run": RUN, "render": "accuracy" | "cost" | ..., "title": ...}`` (``benchmarks/core/renderers.py``
lists the renderers' options), then its block on the page: ``<a id="TABLE"></a>`` followed by this command's output
without its first line (``--update-page`` writes it). A new page: ``benchmarks/registry.py``.

A stored output made by another command than the registry's is refused (the registry or the output is stale):
fix the registry or re-run; ``--ignore-command`` renders it anyway and says so in the caption. The value of
``--out`` is not compared (an output made elsewhere, e.g. under /tmp on a GPU machine, and recorded is the same run),
nor the output root's own path (``{root}``); every other word is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
# `benchmarks` is this folder, imported from the repository root: the root goes first on the path, ahead of the
# top-level `benchmarks` another distribution installs (opacus)
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))


def _own_package() -> None:
    """Import ``benchmarks`` and check that it is this folder.

    Raises:
        ImportError: another ``benchmarks`` was imported earlier in this process (before the repository root was on
            the path); its modules are left in place (code that imported them may hold them), so the process
            cannot import this one under the same name.
    """
    import benchmarks

    here = REPO / "benchmarks"
    if [Path(p).resolve() for p in getattr(benchmarks, "__path__", [])] != [here]:
        raise ImportError(f"the package 'benchmarks' of this process is {getattr(benchmarks, '__file__', benchmarks)!r}, "
                          f"not {here}: it was imported before {__file__} put the repository root first on sys.path; "
                          "load reproduce.py (or put the repository root on sys.path) before anything imports "
                          "'benchmarks'")


_own_package()

from benchmarks.core import registry as _registry  # noqa: E402
from benchmarks.core.cli import main as _main  # noqa: E402
from benchmarks.core.outputs import (DEFAULT_ROOT, OUT_ROOT, load_output as _load_output, record_run,  # noqa: E402,F401
                                     same_but_seeds, select_seeds, stored_command_matches)
from benchmarks.core.registry import MissingOutput, ReproduceError, commands, result_path, run_ids  # noqa: E402,F401
from benchmarks.core.render import render as _render  # noqa: E402
from benchmarks.registry import FIGURES, RENDERERS, RUNS, TABLES  # noqa: E402,F401


def check_registry(runs: Mapping[str, Mapping[str, Any]] = RUNS, tables: Mapping[str, Mapping[str, Any]] = TABLES) -> None:
    """:func:`benchmarks.core.registry.check_registry` with every page's renderers (default: every page's registry)."""
    _registry.check_registry(runs, tables, RENDERERS)


def render(table_id: str, root: Path = Path(DEFAULT_ROOT), run: bool = False, link: Optional[str] = None,
           ignore_command: bool = False, runs: Mapping[str, Mapping[str, Any]] = RUNS,
           tables: Mapping[str, Mapping[str, Any]] = TABLES, out_root: Optional[Path] = None,
           record: bool = False) -> str:
    """:func:`benchmarks.core.render.render` over every page's registry (or the ``runs`` / ``tables`` given)."""
    return _render(table_id, root, run, link, ignore_command, runs=runs, tables=tables, out_root=out_root, record=record)


def load_output(run_id: str, root: Path = Path(DEFAULT_ROOT), runs: Mapping[str, Mapping[str, Any]] = RUNS,
                ignore_command: bool = False, **options: Any):
    """:func:`benchmarks.core.outputs.load_output` over every page's runs (or the ``runs`` given)."""
    return _load_output(run_id, root, runs, ignore_command, **options)


def main(argv: Optional[Sequence[str]] = None, runs: Mapping[str, Mapping[str, Any]] = RUNS,
         tables: Mapping[str, Mapping[str, Any]] = TABLES) -> int:
    return _main(argv, runs, tables, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
