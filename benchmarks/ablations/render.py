"""Renderer of the loss terms' sizes round by round (``term_sizes.py``'s output): how much of the loss and of its
gradient one term carries, in the runs of an ablation bench."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

from benchmarks.core.renderers import remake

#: the rounds a term-size table shows (those a bench ran), then every round together
TERM_ROUNDS = (1, 2, 3, 5, 10, 15, 20)


def _values(runs: Mapping[str, Any], metric: str, rounds: Sequence[int]) -> List[float]:
    """Every site's and seed's value of ``metric`` in ``rounds`` (1-based)."""
    return [v for run in runs.values() for r in rounds if r <= len(run["rounds"])
            for v in (site.get(metric) for site in run["rounds"][r - 1].values()) if v is not None]


def _cell(values: Sequence[float], percent: bool, fixed: bool = False) -> str:
    """``mean (min – max)`` of ``values``: as percentages, else to 3 decimals (``fixed``) or 3 significant digits."""
    if not values:
        return "-"
    f = (lambda v: f"{100 * v:.2f} %") if percent else (lambda v: f"{v:.3f}") if fixed else (lambda v: f"{v:.3g}")
    return f"{f(statistics.fmean(values))} ({f(min(values))} – {f(max(values))})"


def render_term_sizes(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]],
                      **_) -> List[str]:
    """One row per round of :data:`TERM_ROUNDS` and one for every round; per approach of ``labels`` (its
    ``titles``), one column per ``columns`` entry ``(metric, header, percent)``: the mean over sites and seeds and its
    range."""
    from benchmarks.core.tables import caption
    from fedseg.markdown import markdown_table

    data = outputs[0]
    labels, columns = list(table["labels"]), [tuple(c) for c in table["columns"]]
    titles = table.get("titles", {})
    n_rounds = max(len(run["rounds"]) for label in labels for run in data["runs"][label].values())
    head = ["round"] + [f"{titles.get(label, label)}: {header}" for label in labels for _, header, _ in columns]
    rows = [(str(r), [r]) for r in TERM_ROUNDS if r <= n_rounds] + [(f"all {n_rounds}", list(range(1, n_rounds + 1)))]
    lines = markdown_table(head, ([name] + [_cell(_values(data["runs"][label], metric, rounds), percent)
                                            for label in labels for metric, _, percent in columns]
                                  for name, rounds in rows))
    note = (f"{table.get('note', '')} Cells: mean over sites and seeds of each site's round mean (over its batches), "
            f"and the range. Read from the sites' train metrics of the bench's runs (`{data['command']}`). "
            f"{remake(table_id)}")
    return [caption(data["bench"], table["title"], note.strip()), "", *lines]


def _ssa_site_weights(runs: Mapping[str, Any], site: str) -> List[float]:
    """Every seed's, round's and stratum's SSA weight of ``site``."""
    return [weights[site] for run in runs.values() for strata in run["rounds"] for weights in strata.values()
            if site in weights]


def render_ssa_weights(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]],
                       **_) -> List[str]:
    """One row per site: its training images, the sample-count weight and 1/K that SSA replaces, then per approach of
    ``labels`` (its ``titles``) the SSA weight: the mean over seeds, rounds and strata, and its range."""
    from benchmarks.core.tables import caption
    from fedseg.markdown import markdown_table

    data = outputs[0]
    labels, titles = list(table["labels"]), table.get("titles", {})
    counts = {site: (data["bench"].get("data") or {}).get(site, {}).get("training") for site in data["bench"]["sites"]}
    total = sum(c for c in counts.values() if c) or None
    head = ["site", "training images", "by samples", "1/K"] + [f"{titles.get(label, label)}: SSA weight" for label in labels]
    rows = [[site, str(n) if n else "-", f"{n / total:.3f}" if n and total else "-", f"{1 / len(counts):.3f}"]
            + [_cell(_ssa_site_weights(data["runs"][label], site), percent=False, fixed=True) for label in labels]
            for site, n in counts.items()]
    note = (f"{table.get('note', '')} SSA cells: mean over seeds, rounds and the network's strata of the site's "
            f"weight, and the range. Read from the server reports of the bench's runs (`{data['command']}`). "
            f"{remake(table_id)}")
    return [caption(data["bench"], table["title"], note.strip()), "", *markdown_table(head, rows)]
