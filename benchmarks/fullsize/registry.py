"""A site at full size (``docs/results/fullsize.md``): CT-like volumes as large as a hospital's, the data path's memory
and time within and beyond the cache, and ``fedseg infer`` on one whole volume (``fullsize_ct.py`` beside this module)."""

from __future__ import annotations

from typing import Any, Dict

from benchmarks.fullsize.render import render_fullsize_ct

PAGE = "docs/results/fullsize.md"

RUNS: Dict[str, Dict[str, Any]] = {
    # volumes generated into the output root, then both tables' measurements
    "fullsize-ct": {"out": "fullsize_ct", "result": "fullsize_ct.json", "commands": [
        "python benchmarks/fullsize/fullsize_ct.py all --data {root}/fullsize_ct_data --out {out}"]},
}

TABLES: Dict[str, Dict[str, Any]] = {
    "fullsize-ct-loaders": {"run": "fullsize-ct", "render": "fullsize-ct", "part": "loaders",
                            "title": "A site at full size: training data within and beyond the memory cache"},
    "fullsize-ct-inference": {"run": "fullsize-ct", "render": "fullsize-ct", "part": "infer",
                              "title": "A site at full size: `fedseg infer` on one whole CT volume"},
}

RENDERERS = {"fullsize-ct": render_fullsize_ct}
