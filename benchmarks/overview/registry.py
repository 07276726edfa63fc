"""The overview (``docs/benchmarks.md``): the figures, "Results at a glance" and, on the README, which approach to use
on each federation.

The glance draws its rows from the questions' accuracy tables (``"from"``); a source whose bench has no row of some
baseline names the bench that has it (``"baselines_from"`` in the source's entry, on its own page's registry).
"""

from __future__ import annotations

from typing import Any, Dict

PAGE = "docs/benchmarks.md"

RUNS: Dict[str, Dict[str, Any]] = {}

#: the accuracy tables whose rows make the glance, one per federation
GLANCE_SOURCES = ["polyp-accuracy", "fundus-accuracy", "retina-server-step", "nuclei-server-step", "fedefm-downstream"]

TABLES: Dict[str, Dict[str, Any]] = {
    "glance": {"render": "glance", "title": "Results at a glance", "from": GLANCE_SOURCES},
    # the glance's verdict lines on the README, each linking to its source table
    "which-to-use": {"render": "verdicts", "title": "Which to use", "from": GLANCE_SOURCES, "glance": "glance",
                     "page": "README.md"},
}

_POLYP = [("polyp", "graphfedseg", "GraphFedSeg"), ("polyp", "graphfedseg (personalised)", "GraphFedSeg (personalised)"),
          ("polyp", "fvac", "FVAC (5 local epochs)"), ("polyp", "fedavg_e5", "FedAvg, 5 local epochs"),
          ("polyp", "pathfl", "PathFL"), ("polyp", "fedevi", "FedEvi"),
          ("fedevi-protocol-architecture", "fedevi", "FedEvi, reference U-Net layout"),
          ("fedevi-protocol-network", "fedevi", "FedEvi, reference U-Net + Kaiming init"),
          ("fedevi-protocol-authors", "fedevi", "FedEvi, authors' protocol"),
          ("fedevi-protocol-authors-30", "fedevi", "FedEvi, authors' protocol, 30 rounds")]
_RETINA = [("fedevi-protocol-retina-base", "fedevi", "FedEvi, suite protocol"),
           ("fedevi-protocol-retina-architecture", "fedevi", "FedEvi, reference U-Net layout"),
           ("fedevi-protocol-retina-authors", "fedevi", "FedEvi, authors' protocol")]
_FUNDUS = [("fundus", "fedevi", "FedEvi"), ("fundus", "graphfedseg", "GraphFedSeg"),
           ("fundus", "graphfedseg (personalised)", "GraphFedSeg (personalised)"),
           ("fundus", "fvac", "FVAC (5 local epochs)"), ("fundus", "fedavg_e5", "FedAvg, 5 local epochs"),
           ("fundus", "pathfl", "PathFL"),
           ("fundus", "local", "local only"), ("fundus", "pooled", "pooled")]

#: figure id -> kind, title, rows (and the papers' claimed gains over FedAvg, Dice as a fraction, with their source)
FIGURES: Dict[str, Dict[str, Any]] = {
    "forest-polyp": {"kind": "forest", "rows": _POLYP, "title": "Built-in polyp, 3 sites: Dice − FedAvg's",
                     "paper": {"fedevi": (0.098, "FedEvi paper T1 (4 polyp sites, 200 rounds)"),
                               "graphfedseg": (0.041, "GraphFedSeg paper T2 (polyp)"),
                               "fvac": (0.009, "FVAC paper T1 (fundus vessels)"),
                               "pathfl": (0.017, "PathFL paper T2 (H&E)")}},
    "forest-retina": {"kind": "forest", "rows": _RETINA,
                      "title": "Real retina (DRIVE / STARE / CHASE_DB1), 20 rounds: Dice − FedAvg's",
                      "paper": {"fedevi": (0.098, "FedEvi paper T1 (polyp)")}},
    "forest-fundus": {"kind": "forest", "rows": _FUNDUS, "title": "Built-in fundus (rim, cup), 3 sites: Dice − FedAvg's",
                      "paper": {"fedevi": (0.028, "FedEvi paper T1 (fundus: 87.91 -> 90.69)"),
                                "graphfedseg": (0.041, "GraphFedSeg paper T2 (polyp)"),
                                "fvac": (0.009, "FVAC paper T1 (fundus vessels)"),
                                "pathfl": (0.017, "PathFL paper T2 (H&E)")}},
    "cost-gain": {"kind": "cost-gain",
                  "rows": [("polyp", "fedevi", "FedEvi, polyp"), ("polyp", "graphfedseg", "GraphFedSeg, polyp"),
                           ("polyp", "fvac", "FVAC, polyp"), ("polyp", "pathfl", "PathFL, polyp"),
                           ("fedevi-protocol-retina-base", "fedevi", "FedEvi, retina"),
                           ("fundus", "fedevi", "FedEvi, fundus"), ("fundus", "graphfedseg", "GraphFedSeg, fundus"),
                           ("fundus", "fvac", "FVAC, fundus"), ("fundus", "pathfl", "PathFL, fundus")],
                  "title": "Cost against gain: round wall over FedAvg's vs Dice − FedAvg's (same bench)"},
}
