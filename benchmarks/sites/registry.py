"""How different the real sites are (``docs/results/sites.md``): NVFlare's federated statistics of each site's
training images and labels (``fedseg stats``: only aggregates leave a site, after NVFlare's privacy filter), per site
and pooled, and the sites' intensity distances, on the real federations the other pages train on."""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.core.registry import REAL_DATA
from benchmarks.sites.render import render_site_distances, render_site_statistics

PAGE = "docs/results/sites.md"


def stats_run(federation: str, out: str) -> Dict[str, Any]:
    """The import of a real federation, then ``fedseg stats`` over its datalists (its defaults: the training split,
    64 intensity bins over 0-256, NVFlare's minimum count 10)."""
    import_data, datalists = REAL_DATA[federation]
    return {"out": out, "result": "stats.json",
            "commands": [import_data, f"fedseg stats --site-datalists {datalists} --out {{out}}"]}


RUNS: Dict[str, Dict[str, Any]] = {
    "retina-site-stats": stats_run("retina", "retina_site_stats"),
    "nuclei-site-stats": stats_run("nuclei", "nuclei_site_stats"),
}

_NOTE = ("Training split; NVFlare's min/max carry its privacy noise; the pooled row is the count-weighted combination "
         "of the sites that sent each statistic.")

TABLES: Dict[str, Dict[str, Any]] = {
    "retina-site-stats": {"run": "retina-site-stats", "render": "site-statistics", "note": _NOTE,
                          "title": "The retina sites (DRIVE / STARE / CHASE_DB1), federated statistics"},
    "retina-site-distances": {"run": "retina-site-stats", "render": "site-distances",
                              "title": "How far apart the retina sites' intensities are"},
    "nuclei-site-stats": {"run": "nuclei-site-stats", "render": "site-statistics", "note": _NOTE,
                          "title": "The nuclei sites (MoNuSeg / TNBC), federated statistics"},
    "nuclei-site-distances": {"run": "nuclei-site-stats", "render": "site-distances",
                              "title": "How far apart the nuclei sites' intensities are"},
}

RENDERERS = {"site-statistics": render_site_statistics, "site-distances": render_site_distances}
