"""FedEFM (``docs/results/fedefm.md``): the foundation model's downstream segmentation against the same network from
scratch and against the suite's U-Net, and its pre-training with server averaging (CFL) against gossip (DFL).

A table joins the page as everywhere else: its run in ``RUNS`` (the exact commands), its entry in ``TABLES`` (an
``accuracy`` table of the downstream bench, with ``"data"``, joins the glance through ``overview/registry.py``),
its block on the page (``<a id="TABLE"></a>`` + ``python benchmarks/reproduce.py TABLE``). The scripts beside this
module check the foundation classifier on the built-in X-ray silos.
"""

from __future__ import annotations

from typing import Any, Dict

PAGE = "docs/results/fedefm.md"

RUNS: Dict[str, Dict[str, Any]] = {}

TABLES: Dict[str, Dict[str, Any]] = {}
