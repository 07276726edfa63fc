"""A method's options are defined once, in its strategy's and objective's option dataclasses
(``fedseg.method_options``): the constructors, the strategies' ``config()``, the recipes' keywords and the jobs'
arguments all read them."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Optional

import pytest

from fedseg import methods
from fedseg.method_options import JobOptions, MethodOptions, option
from fedseg.objectives.registry import OBJECTIVES
from fedseg.recipes import available_methods, get_recipe_class
from fedseg.recipes.job_options import method_parameters
from fedseg.strategies.registry import STRATEGIES


def _option_classes():
    """Every options dataclass a shipped strategy or objective takes."""
    classes = {}
    for row in methods.SHIPPED_METHODS:
        for component in (STRATEGIES.get(row.strategy), OBJECTIVES.get(row.objective)):
            if component.options_class is not None:
                classes[component.options_class.__name__] = component.options_class
    return sorted(classes.items())


@pytest.mark.parametrize("name, options", _option_classes())
def test_every_option_has_a_type_a_default_and_a_meaning(name, options):
    assert issubclass(options, MethodOptions) and options.__dataclass_params__.frozen
    for field in dataclasses.fields(options):
        assert field.default is not dataclasses.MISSING, f"{name}.{field.name} has no default"
        assert field.metadata.get("doc"), f"{name}.{field.name} says nothing about what it does"
        assert field.type, f"{name}.{field.name} has no type"
    assert options() == options(**options.defaults())  # the defaults pass the checks


@pytest.mark.parametrize("method", available_methods())
def test_a_recipes_keywords_are_its_halves_options_with_their_defaults(method):
    recipe = get_recipe_class(method)
    offered = recipe.method_options()
    parameters = method_parameters(recipe)
    assert set(offered) <= set(parameters)
    for half in (recipe.strategy_options, recipe.objective_options):
        if half is None:
            continue
        defaults = half.options.defaults()
        for name, parameter in half.offered().items():
            assert parameter.default == half.defaults.get(name, defaults[name])
            # an option both halves take has one default (FedDyn's alpha, PathFL's modules, FedEFM's gossip weight)
            assert offered[name].default == parameter.default, f"{method}: {name} has two defaults"
        assert not set(half.fixed) & set(half.offered()), f"{method}: a fixed option is offered too"


@pytest.mark.parametrize("method", available_methods())
def test_the_job_records_what_the_strategy_and_objective_are_built_with(method):
    """The exported arguments build the strategy and the objective as the recipe's defaults say."""
    recipe = get_recipe_class(method)
    row = methods.get_method(method)
    args = recipe.method_args({})
    strategy = STRATEGIES.get(row.strategy)(**(args["strategy_args"] or {}))
    objective = OBJECTIVES.get(row.objective)(**(args["objective_args"] or {}))
    for half, component in ((recipe.strategy_options, strategy), (recipe.objective_options, objective)):
        for name, parameter in (half.offered().items() if half is not None else ()):
            assert getattr(component, name) == parameter.default


def test_an_unknown_option_names_the_nearest_one():
    from fedseg.objectives.registry import build_objective

    with pytest.raises(TypeError, match=r"FVACObjective got unknown options 'bet' \(did you mean 'beta'\?\)"):
        build_objective("fvac", bet=1.0)
    with pytest.raises(TypeError, match=r"unknown options 'gamma'; known: \["):
        build_objective("fvac", gamma=1.0)


def test_a_misspelt_recipe_keyword_names_the_nearest_method_option():
    recipe = get_recipe_class("fedevi")
    with pytest.raises(ValueError, match=r"FedEviRecipe got unknown options 'delt' \(did you mean 'delta'\?\)"):
        recipe.method_args({"delt": 0.5, "local_epochs": 2})
    # a train_config key, a job option and a misspelt train_config key are left to the recipe
    rest = {"local_epochs": 2, "min_clients": 3, "learning_rat": 0.1}
    recipe.method_args(rest)
    assert rest == {"local_epochs": 2, "min_clients": 3, "learning_rat": 0.1}


def test_a_recipe_refuses_a_bad_option_before_any_site_starts():
    with pytest.raises(ValueError, match="clip"):
        get_recipe_class("fedevi").method_args({"clip": 2.0})
    with pytest.raises(ValueError, match="weighting must be"):
        get_recipe_class("scaffold").method_args({"weighting": "by_size"})


@dataclasses.dataclass(frozen=True)
class _Options(MethodOptions):
    rate: float = option(0.5, "a rate")
    windows: Optional[int] = option(8, "windows; None: every whole image")
    fixed: str = option("a", "a fixed value")
    extra: int = option(0, "written only when set")

    def __post_init__(self):
        self._set("rate", float(self.rate))


def test_job_args_fixed_values_own_defaults_profiles_and_none():
    job = JobOptions(_Options, names=("rate", "windows", "extra"), fixed={"fixed": "b"}, defaults={"rate": 0.25},
                     when_set=("extra",))
    assert list(job.offered()) == ["rate", "windows", "extra"]
    assert job.offered()["rate"].default == 0.25 and job.offered()["rate"].kind is inspect.Parameter.KEYWORD_ONLY
    # field order, normalised by the dataclass, the fixed value written, extra only when off its default
    assert job.job_args({}) == {"rate": 0.25, "windows": 8, "fixed": "b"}
    assert list(job.job_args({"extra": 3, "rate": 1})) == ["rate", "windows", "fixed", "extra"]
    assert job.job_args({"rate": 1})["rate"] == 1.0 and isinstance(job.job_args({"rate": 1})["rate"], float)
    # a profile's value replaces the default; a keyword given replaces both; None keeps the profile's value
    assert job.job_args({}, {"rate": 0.75})["rate"] == 0.75
    assert job.job_args({"rate": 0.1}, {"rate": 0.75})["rate"] == 0.1
    assert job.job_args({"rate": None}, {"rate": 0.75})["rate"] == 0.75
    assert job.job_args({"rate": None})["rate"] == 0.25  # None is no rate: the recipe's default
    assert job.job_args({"windows": None})["windows"] is None  # None is a value of windows


def test_the_options_page_is_written_from_the_option_definitions():
    """docs/guide/options.md is what ``python -m fedseg.recipes.option_reference`` writes, and every option on it
    says what it means."""
    from pathlib import Path

    from fedseg.methods import available_methods
    from fedseg.recipes.option_reference import method_option_rows, render_option_reference

    page = Path(__file__).resolve().parents[1] / "docs" / "guide" / "options.md"
    assert page.read_text() == render_option_reference(), "regenerate: python -m fedseg.recipes.option_reference > docs/guide/options.md"
    rows = [row for method in available_methods() for row in method_option_rows(method)]
    assert rows and all(meaning.strip() for _, _, meaning in rows), [r for r in rows if not r[2].strip()]
