"""Renderers of a federated statistics run (``fedseg stats``'s ``stats.json``): the per-site table, and the sites'
intensity distances with the run's plain-language summary."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from benchmarks.core.renderers import remake


def render_site_statistics(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]],
                           **_) -> List[str]:
    """One row per site and the pooled one (:func:`fedseg.fl.site_differences.site_table`)."""
    from benchmarks.core.tables import caption
    from fedseg.fl.site_differences import site_table
    from fedseg.markdown import markdown_table

    data = outputs[0]
    headers, rows = site_table(data)
    note = f"{table.get('note', '')} Made by `{data['command']}`. {remake(table_id)}"
    return [caption(data, table["title"], note.strip()), "", *markdown_table(headers, rows)]


def render_site_distances(table_id: str, table: Mapping[str, Any], outputs: Sequence[Optional[Dict[str, Any]]],
                          **_) -> List[str]:
    """The sites' intensity Earth mover's distance, mean over channels (intensity units), then the summary."""
    from benchmarks.core.tables import caption
    from fedseg.fl.site_differences import distance_rows, mean_intensity_distance
    from fedseg.markdown import markdown_table

    data = outputs[0]
    sites = data["sites"]
    summary = " ".join(data.get("summary") or [])
    note = (f"Earth mover's distance between two sites' intensity histograms (POT), mean over channels, in intensity "
            f"units. Summary of the run: {summary} {remake(table_id)}")
    return [caption(data, table["title"], note.strip()), "",
            *markdown_table(["site", *sites], distance_rows(sites, mean_intensity_distance(data).tolist()))]
