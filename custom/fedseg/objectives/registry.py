"""Name -> objective class. Methods register themselves here so a job config can name them."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

from .base import ClientObjective

_REGISTRY: Dict[str, str] = {
    # name -> "module:Class"; imported lazily so a site only imports the method it runs
    "fedavg": "fedseg.objectives.base:ClientObjective",
    "graphfedseg": "fedseg.objectives.graphfedseg:GraphFedSegObjective",
    "fedevi": "fedseg.objectives.fedevi:FedEviObjective",
    "fvac": "fedseg.objectives.fvac:FVACObjective",
    "pathfl": "fedseg.objectives.pathfl:PathFLObjective",
    "fedefm": "fedseg.objectives.fedefm:FedEFMObjective",
    "cross_entropy": "fedseg.objectives.fedefm:CrossEntropyObjective",
    # the papers' baselines
    "fedprox": "fedseg.objectives.fedprox:FedProxObjective",
    "scaffold": "fedseg.objectives.scaffold:ScaffoldObjective",
    "fedbn": "fedseg.objectives.local_layers:FedBNObjective",
    "fedrep": "fedseg.objectives.fedrep:FedRepObjective",
    "ditto": "fedseg.objectives.ditto:DittoObjective",
    "moon": "fedseg.objectives.moon:MOONObjective",
    "feddyn": "fedseg.objectives.feddyn:FedDynObjective",
    "fedce": "fedseg.objectives.fedce:FedCEObjective",
}


def register_objective(name: str, target: str) -> None:
    """Register ``target`` ("package.module:Class") under ``name``."""
    _REGISTRY[name] = target


def build_objective(name: str, **options: Any) -> ClientObjective:
    if name not in _REGISTRY:
        raise ValueError(f"unknown client objective {name!r}; known: {sorted(_REGISTRY)}")
    module, cls = _REGISTRY[name].split(":")
    factory: Callable[..., ClientObjective] = getattr(importlib.import_module(module), cls)
    return factory(**options)
