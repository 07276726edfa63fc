"""Which method beats FedAvg, where (``docs/results/accuracy.md``): every method on the built-in fundus and polyp
families (against FedAvg, and against FedAvg with FVAC's five local epochs) and FedEvi on the real retina federation.
"""

from __future__ import annotations

from typing import Any, Dict

PAGE = "docs/results/accuracy.md"

RUNS: Dict[str, Dict[str, Any]] = {
    "fundus": {"out": "fundus", "commands": [
        "fedseg bench --family fundus --methods fedavg fedevi graphfedseg fvac pathfl fedavg_e5=fedavg:local_epochs=5 "
        "--references local pooled --seeds 0 1 2 --out {out}"]},
    # every method on the built-in polyp family (FedAvg's and FedEvi's runs are the protocol ablation's suite default);
    # FedAvg with FVAC's five local epochs tells FVAC's aggregation and losses from its extra local steps
    "polyp": {"out": "polyp", "commands": [
        "fedseg bench --family polyp --methods fedavg fedevi graphfedseg fvac pathfl fedavg_e5=fedavg:local_epochs=5 "
        "--references --seeds 0 1 2 --reuse {root}/fedevi_protocol/base --out {out}"]},
}

TABLES: Dict[str, Dict[str, Any]] = {
    "fundus-accuracy": {"run": "fundus", "render": "accuracy", "data": "built-in fundus (rim, cup), 3 sites",
                        "title": "Accuracy on the built-in fundus family (optic disc rim and cup), 3 sites"},
    "polyp-accuracy": {"run": "polyp", "render": "accuracy", "data": "built-in polyp, 3 sites",
                       "title": "Accuracy on the built-in polyp family, 3 sites"},
    # the same runs against FedAvg with FVAC's five local epochs: is FVAC's lead its method or its local steps?
    **{f"{fam}-vs-local-steps": {"run": fam, "render": "accuracy", "baseline": "fedavg_e5",
                                 "title": f"The same runs against FedAvg with five local epochs (FVAC's), built-in {fam}"}
       for fam in ("polyp", "fundus")},
    "retina-accuracy": {"run": "fedevi-protocol-retina-base", "render": "accuracy", "metrics": ["dice_fov@DRIVE"],
                        "data": "real retina (DRIVE / STARE / CHASE_DB1), native resolution",
                        "title": "Accuracy on the real retina federation at native resolution (20 rounds)"},
}

FIGURES: Dict[str, Dict[str, Any]] = {
    "curve-retina": {"kind": "curve", "runs": ["fedevi-protocol-retina-base", "fedevi-protocol-retina-architecture"],
                     "labels": {"fedevi-protocol-retina-base": "suite U-Net",
                                "fedevi-protocol-retina-architecture": "reference U-Net layout"},
                     "title": "Real retina: validation Dice per round (mean over sites and seeds)"},
}
