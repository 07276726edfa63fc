"""One recipe per method. ``RECIPES[name]`` is the class; ``fedseg export`` writes ``jobs/<name>``
(:func:`fedseg.recipes.export.export_job`)."""

from __future__ import annotations

import importlib
from typing import Dict

_RECIPES: Dict[str, str] = {
    "fedavg": "fedseg.recipes.fedavg:FedAvgRecipe",
    "fedefm": "fedseg.recipes.fedefm:FedEFMRecipe",
    "fedefm_downstream": "fedseg.recipes.fedefm_downstream:FedEFMDownstreamRecipe",
    "fedevi": "fedseg.recipes.fedevi:FedEviRecipe",
    "fvac": "fedseg.recipes.fvac:FVACRecipe",
    "graphfedseg": "fedseg.recipes.graphfedseg:GraphFedSegRecipe",
    "pathfl": "fedseg.recipes.pathfl:PathFLRecipe",
    # the papers' baselines
    "fedprox": "fedseg.recipes.fedprox:FedProxRecipe",
    "scaffold": "fedseg.recipes.scaffold:ScaffoldRecipe",
    "fedadam": "fedseg.recipes.fedadam:FedAdamRecipe",
    "fedavgm": "fedseg.recipes.fedavgm:FedAvgMRecipe",
    "fedbn": "fedseg.recipes.fedbn:FedBNRecipe",
    "ditto": "fedseg.recipes.ditto:DittoRecipe",
    "fedrep": "fedseg.recipes.fedrep:FedRepRecipe",
    "moon": "fedseg.recipes.moon:MOONRecipe",
    "feddyn": "fedseg.recipes.feddyn:FedDynRecipe",
    "fedce": "fedseg.recipes.fedce:FedCERecipe",
}


def get_recipe_class(method: str):
    if method not in _RECIPES:
        raise ValueError(f"unknown method {method!r}; known: {sorted(_RECIPES)}")
    module, cls = _RECIPES[method].split(":")
    return getattr(importlib.import_module(module), cls)


def available_methods():
    return sorted(_RECIPES)
