"""The method table (``fedseg.methods``): every list of methods is derived from it, the recipe, objective and strategy
registries read it, and a method is added as ``docs/architecture.md`` says: its objective, strategy and recipe, and
one row of the table. The toy method below is added that way and exported and run for one round in process."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
import torch

from benchmarks.core import tables
from fedseg import methods
from fedseg.fl.controller import FedSegController
from fedseg.methods import MethodSpec, get_method, register_method, unregister_method
from fedseg.objectives.base import BatchOutput, ClientObjective
from fedseg.objectives.registry import OBJECTIVES, OTHER_OBJECTIVES, build_objective
from fedseg.recipes import available_methods, comparison_protocol, get_recipe_class, paper_protocol
from fedseg.recipes.base import FedSegRecipe
from fedseg.recipes.export import export_job
from fedseg.strategies.fedavg import FedAvgStrategy
from fedseg.strategies.registry import STRATEGIES, get_strategy_class
from inprocess import builtin_sites, run_in_process

JOBS = Path(__file__).resolve().parents[1] / "jobs"
#: the five publications the suite implements (``README.md``)
PUBLICATIONS = {"GraphFedSeg", "FedEvi", "FVAC", "PathFL", "FedEFM"}


# ------------------------------------------------------------------------------------------ a toy method
class ToyObjective(ClientObjective):
    """The bundle's segmentation loss plus ``weight`` times the mean squared logit."""

    name = "toy"

    def __init__(self, weight: float = 0.1, seg_loss: Optional[torch.nn.Module] = None):
        super().__init__(seg_loss=seg_loss)
        self.weight = float(weight)

    def loss(self, out: BatchOutput) -> torch.Tensor:
        return super().loss(out) + self.weight * out.logits.pow(2).mean()


class ToyStrategy(FedAvgStrategy):
    """FedAvg that also reports how many sites each round averaged."""

    name = "toy"
    objective = "toy"

    def aggregate(self, round_, updates, exchange) -> Dict[str, Any]:
        return {**super().aggregate(round_, updates, exchange), "toy_sites": len(updates)}


class ToyRecipe(FedSegRecipe):
    """The toy method's job: uniform FedAvg at the server, the toy loss at the sites, the base profiles only."""

    def __init__(self, *, name: str = "toy", profile: str = "default", num_rounds: Optional[int] = None,
                 weight: float = 0.1, **options: Any):
        super().__init__(name=name, method="toy", strategy_args={"weighting": "uniform"},
                         objective_args={"weight": weight}, profile=profile, num_rounds=num_rounds, **options)


TOY = MethodSpec("toy", "Toy", "baseline", recipe=f"{__name__}:ToyRecipe", objective="toy", strategy="toy",
                 objective_class=f"{__name__}:ToyObjective", strategy_class=f"{__name__}:ToyStrategy")


@pytest.fixture
def toy_method():
    register_method(TOY)  # the one line that adds the method
    yield TOY
    unregister_method(TOY.name)


def _controller_args(job: Path) -> Dict[str, Any]:
    """The exported job's ``FedSegController`` arguments, with the defaults NVFlare leaves out of the JSON."""
    config = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    (args,) = [w["args"] for w in config["workflows"] if w["path"].endswith("FedSegController")]
    defaults = {k: p.default for k, p in inspect.signature(FedSegController).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **args}


def test_a_method_added_by_one_row_is_listed_exported_and_runs(toy_method, tmp_path):
    assert "toy" in available_methods() and get_recipe_class("toy") is ToyRecipe
    assert isinstance(build_objective("toy", weight=0.5), ToyObjective) and get_strategy_class("toy") is ToyStrategy

    args = _controller_args(export_job("toy", tmp_path / "jobs", "tiny", weight=0.5))
    assert (args["method"], args["strategy"], args["objective"]) == ("toy", "toy", "toy")
    assert args["objective_args"] == {"weight": 0.5} and args["strategy_args"] == {"weighting": "uniform"}

    sites = builtin_sites("polyp", ["site-1", "site-2"], tmp_path / "data")
    report = run_in_process("toy", sites, tmp_path / "run", num_rounds=1, local_epochs=1)
    assert report["method"] == "toy" and report["config"]["objective_args"] == {"weight": 0.1}
    (round_,) = report["rounds"]
    assert round_["toy_sites"] == 2 and round_["aggregation_weight"] == {"site-1": 0.5, "site-2": 0.5}
    assert all(math.isfinite(round_["metrics"][s]["train_loss"]) for s in sites)


def test_a_removed_row_leaves_every_registry(toy_method):
    unregister_method("toy")
    try:
        assert "toy" not in available_methods() and "toy" not in OBJECTIVES and "toy" not in STRATEGIES
        with pytest.raises(ValueError, match=r"unknown method 'toy'; known: \[.*'fedavg'"):
            get_recipe_class("toy")
    finally:
        register_method(TOY)  # the fixture removes it again


@pytest.mark.parametrize("row, match", [
    (MethodSpec("fedavg", "FedAvg", "fedavg", "fedseg.recipes.fedavg:FedAvgRecipe", "fedavg", "fedavg"),
     "in the method table already"),
    (MethodSpec("toy2", "Toy", "baseline", f"{__name__}:ToyRecipe", "fedprox", "fedavg",
                objective_class=f"{__name__}:ToyObjective"), "objective 'fedprox' is"),
    (MethodSpec("toy2", "Toy", "baseline", f"{__name__}:ToyRecipe", "toy", "fedavg",
                strategy_class=f"{__name__}:ToyStrategy"), "strategy 'fedavg' is"),
    (MethodSpec("toy2", "Toy", "classic", f"{__name__}:ToyRecipe", "fedavg", "fedavg"), "kind must be one of"),
    (MethodSpec("toy2", "Toy", "baseline", f"{__name__}:ToyRecipe", "fedavg", "fedavg", task="detection"),
     "task must be one of"),
    (MethodSpec("toy2", "Toy", "baseline", f"{__name__}.ToyRecipe", "fedavg", "fedavg"), "package.module:Name"),
])
def test_a_row_that_clashes_or_is_malformed_is_refused(row, match):
    with pytest.raises(ValueError, match=match):
        register_method(row)
    assert "toy2" not in available_methods()


def test_unknown_names_are_refused_naming_the_known_ones():
    for lookup, kind, known in ((get_recipe_class, "method", "fvac"), (build_objective, "client objective", "moon"),
                                (get_strategy_class, "server strategy", "fedopt")):
        with pytest.raises(ValueError, match=rf"unknown {kind} 'nope'; known: \[.*'{known}'"):
            lookup("nope")


# ------------------------------------------------------------------------------ the table and the lists
def test_every_method_list_is_the_tables():
    rows = methods.SHIPPED_METHODS
    assert available_methods() == sorted(r.name for r in rows)
    assert [r.name for r in rows if r.kind == "fedavg"] == ["fedavg"]
    # one object, imported where each was defined before
    import fedseg.recipes

    assert fedseg.recipes.PUBLISHED_METHODS is tables.PUBLISHED_METHODS is methods.PUBLISHED_METHODS
    assert methods.PUBLISHED_METHODS == tuple(r.name for r in rows if r.kind == "published")
    assert methods.BASELINES == tuple(r.name for r in rows if r.kind == "baseline")
    assert {n: tables.METHOD_NAMES[n] for n in available_methods()} == {r.name: r.title for r in rows}

    # the five publications: FedEFM is its phase 1 (classification) and its downstream segmentation
    published = [get_method(n) for n in methods.PUBLISHED_METHODS]
    assert {r.title.split()[0] for r in published} == PUBLICATIONS
    assert [r.name for r in published if r.task == "classification"] == ["fedefm"]
    assert {get_method(n).title.split()[0] for n in methods.PROTOCOL_METHODS} == PUBLICATIONS
    assert len(methods.PROTOCOL_METHODS) == len(PUBLICATIONS)


@pytest.mark.parametrize("method", methods.PROTOCOL_METHODS)
def test_each_published_segmentation_method_has_its_authors_protocol(method):
    assert paper_protocol(method)["num_rounds"] > 0
    assert comparison_protocol(["fedavg", "fedprox", method]) == method


def test_a_comparison_with_fedefm_pretraining_shares_fedavgs_protocol():
    assert "fedefm" in methods.PUBLISHED_METHODS and "fedefm" not in methods.PROTOCOL_METHODS
    assert comparison_protocol(["fedavg", "fedefm"]) == "fedavg"


@pytest.mark.parametrize("row", methods.SHIPPED_METHODS, ids=lambda r: r.name)
def test_each_row_names_the_classes_its_job_runs(row):
    recipe = get_recipe_class(row.name)
    assert issubclass(recipe, FedSegRecipe)
    assert inspect.signature(recipe).parameters["name"].default == row.name
    objective, strategy = OBJECTIVES.get(row.objective), STRATEGIES.get(row.strategy)
    assert issubclass(objective, ClientObjective) and objective.name == row.objective
    assert strategy.name == row.strategy
    if row.strategy_class is not None:  # a strategy the row brings pairs with the row's objective
        assert strategy.objective == row.objective
    # the committed job runs what the row names
    args = _controller_args(JOBS / row.name)
    assert (args["method"], args["strategy"], args["objective"]) == (row.name, row.strategy, row.objective)


def test_no_other_objective_shadows_a_rows():
    assert not set(OTHER_OBJECTIVES) & set(methods.OBJECTIVE_CLASSES)
