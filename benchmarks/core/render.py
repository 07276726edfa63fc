"""A table's markdown from its registry entry and its run's stored output: ``python benchmarks/reproduce.py TABLE``.

:data:`RENDERERS` maps a table entry's ``"render"`` to its renderer: the ones every page may use
(:mod:`benchmarks.core.renderers`), and those a page's registry adds (``benchmarks/registry.py`` registers them). A
renderer is ``f(table_id, table, outputs, *, root, tables, runs, link, ignore_command) -> lines``: the caption (one
bold line), a blank line, the markdown table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

from benchmarks.core.outputs import DEFAULT_ROOT, OUT_ROOT, load_output, record_run, run_commands
from benchmarks.core.registry import (FROM_TABLES, MissingOutput, check_registry, commands, get_table, result_path,
                                      run_ids)
from benchmarks.core.renderers import GENERIC

Renderer = Callable[..., List[str]]
#: renderer name -> renderer: every page's (``GENERIC``) and each page's own (:func:`register_renderers`)
RENDERERS: Dict[str, Renderer] = dict(GENERIC)


def register_renderers(renderers: Mapping[str, Renderer]) -> None:
    """Add a page's renderers to :data:`RENDERERS`.

    Raises:
        ValueError: a name that is taken by another renderer.
    """
    for name, renderer in renderers.items():
        if RENDERERS.get(name, renderer) is not renderer:
            raise ValueError(f"renderer {name!r} is registered twice ({RENDERERS[name].__module__}, {renderer.__module__})")
        RENDERERS[name] = renderer


def render(table_id: str, root: Path = Path(DEFAULT_ROOT), run: bool = False, link: Optional[str] = None,
           ignore_command: bool = False, *, runs: Mapping[str, Mapping[str, Any]],
           tables: Mapping[str, Mapping[str, Any]], out_root: Optional[Path] = None, record: bool = False,
           renderers: Optional[Mapping[str, Renderer]] = None) -> str:
    """The markdown of table ``table_id``: a comment naming it, the caption, a blank line, the table.

    Args:
        table_id: a key of ``tables``.
        root: the records root the registry's outputs are read from.
        run: run the table's commands first into ``out_root`` (a ``fedseg bench`` resumes: finished runs are
            skipped), then record them into ``root``.
        link: one page for the glance's links to every source table (default: each source's own page).
        ignore_command: render an output made by another command than the registry's (the caption says so).
        runs, tables: the registry (``benchmarks.registry``'s, or a test's).
        out_root: where ``run`` writes and ``record`` reads outputs (default :data:`OUT_ROOT`).
        record: record the table's outputs from ``out_root`` into ``root`` first (made earlier, or elsewhere).
        renderers: renderer name -> renderer (default :data:`RENDERERS`).

    Raises:
        ReproduceError: unknown table, bad registry entry, failed command, unreadable or stale output;
            :class:`MissingOutput` where the output does not exist.
    """
    renderers = RENDERERS if renderers is None else renderers
    table = get_table(table_id, tables)
    sources = [t for t in table.get("from", []) if t in tables]
    related = sources + [b for t in [table_id, *sources] for b in tables[t].get("baselines_from", []) if b in tables]
    check_registry(runs, {table_id: table, **{t: tables[t] for t in related}}, renderers)
    from_tables = table["render"] in FROM_TABLES
    out_root = Path(out_root or OUT_ROOT)
    to_make = [r for t in related for r in run_ids(tables[t])] if from_tables else run_ids(table)
    for run_id in dict.fromkeys(to_make) if run or record else ():
        if run:
            run_commands(run_id, out_root, runs)
        try:
            record_run(run_id, out_root, root, runs)
        except MissingOutput:
            if not table.get("missing_ok"):
                raise
    context = {"root": Path(root), "tables": tables, "runs": runs, "link": link, "ignore_command": ignore_command}
    if from_tables:
        lines = renderers[table["render"]](table_id, table, [], **context)
    else:
        outputs = []
        for run_id in run_ids(table):
            try:
                outputs.append(load_output(run_id, root, runs, ignore_command, seeds=table.get("seeds"),
                                           baseline=table.get("baseline")))
            except MissingOutput:
                if not table.get("missing_ok"):
                    raise
                outputs.append(None)  # a point of a curve not run yet: the renderer says so
        if not any(o is not None for o in outputs):
            raise MissingOutput(f"table {table_id!r}: none of its runs has an output yet: "
                                + ", ".join(str(result_path(runs[r], root)) for r in run_ids(table)))
        lines = renderers[table["render"]](table_id, table, outputs, **context)
    return "\n".join([f"<!-- python benchmarks/reproduce.py {table_id} -->", *lines]) + "\n"


def listing(root: Path, runs: Mapping[str, Mapping[str, Any]], tables: Mapping[str, Mapping[str, Any]],
            out_root: Optional[Path] = None) -> str:
    """Every table: id, title, renderer, its page, whether its record exists under ``root``, and the commands
    ``--run`` runs (outputs under ``out_root``)."""
    out = []
    for table_id, table in tables.items():
        out.append(f"{table_id}: {table['title']} [{table['render']}]" + (f" on {table['page']}" if table.get("page") else ""))
        if table["render"] in FROM_TABLES:
            out.append(f"  from: {', '.join(table['from'])}")
            continue
        if table.get("baselines_from"):
            out.append(f"  more baselines from: {', '.join(table['baselines_from'])}")
        for run_id in run_ids(table):
            path = result_path(runs[run_id], root)
            out.append(f"  run {run_id}: {path} ({'recorded' if path.is_file() else 'no record'})")
            out += [f"    {c}" for c in commands(runs[run_id], Path(out_root or OUT_ROOT))]
    return "\n".join(out) + "\n"
