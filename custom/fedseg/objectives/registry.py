"""Name -> objective class, imported lazily so that a site only imports the method it runs.

A method's own objective is named in its row of the method table (:mod:`fedseg.methods`); the entries here are the
objectives no row brings.
"""

from __future__ import annotations

from collections import ChainMap
from typing import Any, Dict

from fedseg.methods import OBJECTIVE_CLASSES
from fedseg.registry import LazyRegistry

from .base import ClientObjective

#: objectives that no method row brings: name -> "module:Class"
OTHER_OBJECTIVES: Dict[str, str] = {
    # FedEFM's overseas experts and its plain-CE classification baseline (an option of the fedefm method)
    "cross_entropy": "fedseg.objectives.fedefm:CrossEntropyObjective",
}

#: every objective a job may name: the method table's and the others
OBJECTIVES = LazyRegistry("client objective", ChainMap(OBJECTIVE_CLASSES, OTHER_OBJECTIVES))


def build_objective(name: str, **options: Any) -> ClientObjective:
    """The objective registered under ``name``, built with ``options`` (ValueError naming the known ones if none)."""
    return OBJECTIVES.get(name)(**options)
