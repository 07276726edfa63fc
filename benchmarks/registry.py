"""Every results page's registry, gathered: the runs, tables, renderers and figures ``reproduce.py`` knows.

Each page (``docs/benchmarks.md``, ``docs/results/<question>.md``) has one registry module,
``benchmarks/<page>/registry.py``, declaring ``PAGE`` (the page's path in the repository), ``RUNS``, ``TABLES`` and,
where it has any, ``RENDERERS`` and ``FIGURES`` (``benchmarks/core/registry.py`` says what an entry is). A new page:
its folder with that module (and the scripts that make its records), one line in :data:`PAGES`, and the page itself.
Every table gets its page as ``"page"`` (its entry may name another: the README's), which the glance links to.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, Sequence

from benchmarks.ablations import registry as ablations
from benchmarks.accuracy import registry as accuracy
from benchmarks.core.figures import FIGURES, register_figures
from benchmarks.core.render import RENDERERS, register_renderers
from benchmarks.cost import registry as cost
from benchmarks.fedefm import registry as fedefm
from benchmarks.fedevi_protocol import registry as fedevi_protocol
from benchmarks.fullsize import registry as fullsize
from benchmarks.graphfedseg_protocol import registry as graphfedseg_protocol
from benchmarks.gpu import registry as gpu
from benchmarks.overview import registry as overview
from benchmarks.server_step import registry as server_step
from benchmarks.sites import registry as sites

#: the results pages' registries, in the order of the overview's questions
PAGES: Sequence[ModuleType] = (overview, accuracy, fedevi_protocol, graphfedseg_protocol, server_step, ablations, sites,
                                cost, fullsize, gpu, fedefm)


def gather(pages: Sequence[ModuleType]):
    """``(runs, tables)`` of every page, each table with its ``"page"``; the pages' renderers and figures registered.

    Raises:
        ValueError: a run, table, renderer or figure id that two pages declare.
    """
    runs: Dict[str, Dict[str, Any]] = {}
    tables: Dict[str, Dict[str, Any]] = {}
    for page in pages:
        for kind, found, into in (("run", page.RUNS, runs), ("table", page.TABLES, tables)):
            twice = sorted(set(found) & set(into))
            if twice:
                raise ValueError(f"{page.__name__}: {kind} id(s) {twice} declared by another page too")
            into.update(found)
        for table in page.TABLES.values():
            table.setdefault("page", page.PAGE)
        register_renderers(getattr(page, "RENDERERS", {}))
        register_figures(getattr(page, "FIGURES", {}))
    return runs, tables


RUNS, TABLES = gather(PAGES)

__all__ = ["PAGES", "RUNS", "TABLES", "RENDERERS", "FIGURES", "gather"]
