"""Name -> strategy class, imported lazily."""

from __future__ import annotations

import importlib
from typing import Any, Dict

from .base import ServerStrategy

_REGISTRY: Dict[str, str] = {
    "fedavg": "fedseg.strategies.fedavg:FedAvgStrategy",
    "graphfedseg": "fedseg.strategies.graphfedseg:GraphFedSegStrategy",
    "fedevi": "fedseg.strategies.fedevi:FedEviStrategy",
}


def register_strategy(name: str, target: str) -> None:
    _REGISTRY[name] = target


def build_strategy(name: str, **options: Any) -> ServerStrategy:
    if name not in _REGISTRY:
        raise ValueError(f"unknown server strategy {name!r}; known: {sorted(_REGISTRY)}")
    module, cls = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)
