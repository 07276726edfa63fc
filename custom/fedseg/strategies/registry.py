"""Name -> strategy class, imported lazily.

Every strategy is brought by a row of the method table (:mod:`fedseg.methods`): a method's own strategy is named in
its row; FedProx, MOON and FVAC aggregate with FedAvg's ``fedavg``, FedAvgM with FedAdam's ``fedopt``.
"""

from __future__ import annotations

from typing import Any, Type

from fedseg.methods import STRATEGY_CLASSES
from fedseg.registry import LazyRegistry

from .base import ServerStrategy

#: every strategy a job may name
STRATEGIES = LazyRegistry("server strategy", STRATEGY_CLASSES)


def get_strategy_class(name: str) -> Type[ServerStrategy]:
    """The strategy class registered under ``name`` (ValueError naming the known ones if none)."""
    return STRATEGIES.get(name)


def build_strategy(name: str, **options: Any) -> ServerStrategy:
    return get_strategy_class(name)(**options)
