"""The method table: one :class:`MethodSpec` row per method the suite ships, and every list of methods derived from it.

A row names the method's recipe (``fedseg export`` writes its job), the client objective and the server strategy its
jobs run, and its kind: FedAvg, one of the published methods, or a baseline. A component a method brings is named by
its class in that method's row (``objective_class`` / ``strategy_class``); the objective and strategy registries
(:mod:`fedseg.objectives.registry`, :mod:`fedseg.strategies.registry`) read those from here, so adding a method is its
modules plus one row. A component several methods share is brought by one row and named in the others (FedProx, MOON
and FVAC aggregate with FedAvg's ``fedavg`` strategy).

The five published methods are GraphFedSeg, FedEvi, FVAC, PathFL and FedEFM. FedEFM is two rows of kind
``"published"``: ``fedefm``, its phase 1 (the federated foundation encoder, an image classification:
``task="classification"``) and ``fedefm_downstream``, its phase 2 (segmentation fine-tuned from that encoder). Hence
:data:`PUBLISHED_METHODS` (six names: what the results page shows beside the baselines) and
:data:`PROTOCOL_METHODS` (the five segmentation ones, whose ``paper`` profile is their authors' local training
protocol, which a comparison with them shares: :func:`fedseg.recipes.comparison_protocol`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from fedseg.registry import LazyRegistry, check_target, unknown_name

#: ``MethodSpec.kind``: the reference every method is compared with, a method of the five publications, a baseline
KINDS = ("fedavg", "published", "baseline")
#: ``MethodSpec.task``: what the method's jobs train
TASKS = ("segmentation", "classification")


@dataclass(frozen=True)
class MethodSpec:
    """One method of the suite.

    Args:
        name: the method's name: ``fedseg export --method NAME``, ``jobs/NAME``, ``report.json``'s ``method``.
        title: its name on the results page ("GraphFedSeg", "FedEFM downstream").
        kind: one of :data:`KINDS`.
        recipe: its recipe class, ``"package.module:Class"`` (a ``fedseg.recipes.base.FedSegRecipe`` subclass).
        objective: name of the client objective its jobs run (``fedseg.objectives.registry``).
        strategy: name of the server strategy its jobs run (``fedseg.strategies.registry``).
        objective_class: ``"package.module:Class"`` of the objective when this method brings it (registered under
            ``objective``); None when ``objective`` is brought by another row or is one of the registry's own.
        strategy_class: the same for the strategy.
        task: one of :data:`TASKS`.
    """

    name: str
    title: str
    kind: str
    recipe: str
    objective: str
    strategy: str
    objective_class: Optional[str] = None
    strategy_class: Optional[str] = None
    task: str = "segmentation"


_TABLE: Dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> None:
    """Add ``spec`` to the table of this process: ``available_methods``, ``get_recipe_class`` and the objective and
    strategy registries know it from now on (a shipped method is a row of :data:`SHIPPED_METHODS` instead; the name
    lists :data:`PUBLISHED_METHODS`, :data:`PROTOCOL_METHODS` and :data:`BASELINES` are the shipped rows').

    Raises:
        ValueError: the name is taken, a field has no allowed value, a target is not ``"package.module:Class"``, or
            the row brings an objective or strategy under a name another row brought as a different class.
    """
    if spec.name in _TABLE:
        raise ValueError(f"method {spec.name!r} is in the method table already")
    if spec.kind not in KINDS:
        raise ValueError(f"MethodSpec.kind must be one of {KINDS}, got {spec.kind!r} ({spec.name})")
    if spec.task not in TASKS:
        raise ValueError(f"MethodSpec.task must be one of {TASKS}, got {spec.task!r} ({spec.name})")
    for target in (spec.recipe, spec.objective_class, spec.strategy_class):
        if target is not None:
            check_target(target)
    for field, brought in (("objective", OBJECTIVE_CLASSES), ("strategy", STRATEGY_CLASSES)):
        name, target = getattr(spec, field), getattr(spec, f"{field}_class")
        if target is not None and brought.get(name, target) != target:
            raise ValueError(f"{spec.name}: {field} {name!r} is {brought[name]!r} already, not {target!r}")
    _TABLE[spec.name] = spec


def unregister_method(name: str) -> MethodSpec:
    """Remove ``name`` from the table of this process (with the components its row brought); returns its row."""
    if name not in _TABLE:
        raise unknown_name("method", name, _TABLE)
    return _TABLE.pop(name)


def get_method(name: str) -> MethodSpec:
    """``name``'s row (ValueError naming the known methods if none)."""
    if name not in _TABLE:
        raise unknown_name("method", name, _TABLE)
    return _TABLE[name]


def method_names(kind: Optional[str] = None, task: Optional[str] = None) -> Tuple[str, ...]:
    """The names of the table's methods, in table order; only those of ``kind`` / ``task`` when given."""
    return tuple(s.name for s in _TABLE.values() if kind in (None, s.kind) and task in (None, s.task))


class _Column(Mapping):
    """A live view of two fields of the table's rows, ``{row.<key>: row.<value>}`` over the rows whose value is set:
    what a :class:`~fedseg.registry.LazyRegistry` reads, so that a method registered later is seen there too."""

    def __init__(self, key: str, value: str):
        self.key, self.value = key, value

    def _current(self) -> Dict[str, str]:
        return {getattr(s, self.key): getattr(s, self.value) for s in _TABLE.values() if getattr(s, self.value)}

    def __getitem__(self, name: str) -> str:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())


#: method -> its recipe class (``fedseg.recipes.get_recipe_class``)
RECIPES = LazyRegistry("method", _Column("name", "recipe"))
#: objective name -> class, for the objectives the table's rows bring (``fedseg.objectives.registry``)
OBJECTIVE_CLASSES: Mapping = _Column("objective", "objective_class")
#: strategy name -> class, for the strategies the table's rows bring (``fedseg.strategies.registry``)
STRATEGY_CLASSES: Mapping = _Column("strategy", "strategy_class")


#: every method the suite ships: FedAvg, the published methods, the baselines
SHIPPED_METHODS: Tuple[MethodSpec, ...] = (
    MethodSpec("fedavg", "FedAvg", "fedavg", "fedseg.recipes.fedavg:FedAvgRecipe", "fedavg", "fedavg",
               objective_class="fedseg.objectives.base:ClientObjective",
               strategy_class="fedseg.strategies.fedavg:FedAvgStrategy"),
    # the published methods
    MethodSpec("graphfedseg", "GraphFedSeg", "published", "fedseg.recipes.graphfedseg:GraphFedSegRecipe",
               "graphfedseg", "graphfedseg",
               objective_class="fedseg.objectives.graphfedseg:GraphFedSegObjective",
               strategy_class="fedseg.strategies.graphfedseg:GraphFedSegStrategy"),
    MethodSpec("fedevi", "FedEvi", "published", "fedseg.recipes.fedevi:FedEviRecipe", "fedevi", "fedevi",
               objective_class="fedseg.objectives.fedevi:FedEviObjective",
               strategy_class="fedseg.strategies.fedevi:FedEviStrategy"),
    MethodSpec("fvac", "FVAC", "published", "fedseg.recipes.fvac:FVACRecipe", "fvac", "fedavg",
               objective_class="fedseg.objectives.fvac:FVACObjective"),
    MethodSpec("pathfl", "PathFL", "published", "fedseg.recipes.pathfl:PathFLRecipe", "pathfl", "pathfl",
               objective_class="fedseg.objectives.pathfl:PathFLObjective",
               strategy_class="fedseg.strategies.pathfl:PathFLStrategy"),
    MethodSpec("fedefm", "FedEFM", "published", "fedseg.recipes.fedefm:FedEFMRecipe", "fedefm", "fedefm",
               objective_class="fedseg.objectives.fedefm:FedEFMObjective",
               strategy_class="fedseg.strategies.fedefm:FedEFMStrategy", task="classification"),
    MethodSpec("fedefm_downstream", "FedEFM downstream", "published",
               "fedseg.recipes.fedefm_downstream:FedEFMDownstreamRecipe", "fedavg", "fedavg"),
    # the papers' baselines
    MethodSpec("fedprox", "FedProx", "baseline", "fedseg.recipes.fedprox:FedProxRecipe", "fedprox", "fedavg",
               objective_class="fedseg.objectives.fedprox:FedProxObjective"),
    MethodSpec("scaffold", "SCAFFOLD", "baseline", "fedseg.recipes.scaffold:ScaffoldRecipe", "scaffold", "scaffold",
               objective_class="fedseg.objectives.scaffold:ScaffoldObjective",
               strategy_class="fedseg.strategies.scaffold:ScaffoldStrategy"),
    MethodSpec("fedadam", "FedAdam", "baseline", "fedseg.recipes.fedadam:FedAdamRecipe", "fedavg", "fedopt",
               strategy_class="fedseg.strategies.fedopt:FedOptStrategy"),
    MethodSpec("fedavgm", "FedAvgM", "baseline", "fedseg.recipes.fedavgm:FedAvgMRecipe", "fedavg", "fedopt"),
    MethodSpec("fedbn", "FedBN", "baseline", "fedseg.recipes.fedbn:FedBNRecipe", "fedbn", "fedbn",
               objective_class="fedseg.objectives.local_layers:FedBNObjective",
               strategy_class="fedseg.strategies.local_layers:FedBNStrategy"),
    MethodSpec("ditto", "Ditto", "baseline", "fedseg.recipes.ditto:DittoRecipe", "ditto", "ditto",
               objective_class="fedseg.objectives.ditto:DittoObjective",
               strategy_class="fedseg.strategies.ditto:DittoStrategy"),
    MethodSpec("fedrep", "FedRep", "baseline", "fedseg.recipes.fedrep:FedRepRecipe", "fedrep", "fedrep",
               objective_class="fedseg.objectives.fedrep:FedRepObjective",
               strategy_class="fedseg.strategies.local_layers:FedRepStrategy"),
    MethodSpec("moon", "MOON", "baseline", "fedseg.recipes.moon:MOONRecipe", "moon", "fedavg",
               objective_class="fedseg.objectives.moon:MOONObjective"),
    MethodSpec("feddyn", "FedDyn", "baseline", "fedseg.recipes.feddyn:FedDynRecipe", "feddyn", "feddyn",
               objective_class="fedseg.objectives.feddyn:FedDynObjective",
               strategy_class="fedseg.strategies.feddyn:FedDynStrategy"),
    MethodSpec("fedce", "FedCE", "baseline", "fedseg.recipes.fedce:FedCERecipe", "fedce", "fedce",
               objective_class="fedseg.objectives.fedce:FedCEObjective",
               strategy_class="fedseg.strategies.fedce:FedCEStrategy"),
)

for _spec in SHIPPED_METHODS:
    register_method(_spec)
del _spec

#: the published methods' rows (FedEFM's two phases included): every other method is FedAvg or a baseline
PUBLISHED_METHODS: Tuple[str, ...] = method_names(kind="published")
#: the published methods whose ``paper`` profile is their authors' local segmentation protocol
PROTOCOL_METHODS: Tuple[str, ...] = method_names(kind="published", task="segmentation")
#: every baseline the suite ships
BASELINES: Tuple[str, ...] = method_names(kind="baseline")


def method_titles() -> Dict[str, str]:
    """method -> its name on the results page."""
    return {s.name: s.title for s in _TABLE.values()}


def available_methods() -> List[str]:
    """Every method's name, sorted."""
    return RECIPES.names()
