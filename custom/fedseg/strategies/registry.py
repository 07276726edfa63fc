"""Name -> strategy class, imported lazily."""

from __future__ import annotations

import importlib
from typing import Any, Dict, Type

from .base import ServerStrategy

_REGISTRY: Dict[str, str] = {
    "fedavg": "fedseg.strategies.fedavg:FedAvgStrategy",
    "graphfedseg": "fedseg.strategies.graphfedseg:GraphFedSegStrategy",
    "fedevi": "fedseg.strategies.fedevi:FedEviStrategy",
    "pathfl": "fedseg.strategies.pathfl:PathFLStrategy",
    "fedefm": "fedseg.strategies.fedefm:FedEFMStrategy",
    # the papers' baselines (FedProx and MOON aggregate as FedAvg: "fedavg")
    "scaffold": "fedseg.strategies.scaffold:ScaffoldStrategy",
    "fedopt": "fedseg.strategies.fedopt:FedOptStrategy",
    "fedbn": "fedseg.strategies.local_layers:FedBNStrategy",
    "fedrep": "fedseg.strategies.local_layers:FedRepStrategy",
    "ditto": "fedseg.strategies.ditto:DittoStrategy",
    "feddyn": "fedseg.strategies.feddyn:FedDynStrategy",
    "fedce": "fedseg.strategies.fedce:FedCEStrategy",
}


def register_strategy(name: str, target: str) -> None:
    _REGISTRY[name] = target


def get_strategy_class(name: str) -> Type[ServerStrategy]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown server strategy {name!r}; known: {sorted(_REGISTRY)}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_strategy(name: str, **options: Any) -> ServerStrategy:
    return get_strategy_class(name)(**options)
