"""One recipe per method, listed in the method table (:mod:`fedseg.methods`): ``get_recipe_class(name)`` is the
class; ``fedseg export`` writes ``jobs/<name>`` (:func:`fedseg.recipes.export.export_job`)."""

from __future__ import annotations

import importlib
from typing import Any, Dict, Optional, Sequence

from fedseg.methods import PROTOCOL_METHODS, PUBLISHED_METHODS, RECIPES, available_methods

__all__ = ["PROTOCOL_METHODS", "PUBLISHED_METHODS", "available_methods", "comparison_protocol", "get_recipe_class",
           "paper_protocol"]


def get_recipe_class(method: str):
    """``method``'s recipe class (its module imported now; ValueError naming the known methods if none)."""
    return RECIPES.get(method)


def paper_protocol(method: str, spatial_dims: Optional[int] = None, spatial_mode: Optional[str] = None) -> Dict[str, Any]:
    """The local training protocol of ``method``'s ``paper`` profile: ``{"num_rounds", "train_config"}`` with every
    key of :data:`fedseg.config.LOCAL_PROTOCOL_KEYS` (the base value where the profile leaves one unset), so that a
    method given these as overrides trains exactly as the protocol says, whatever its own profile sets.

    ``spatial_dims`` 3 (and ``spatial_mode``): the protocol of a volume job, whose network and patches are the volume
    ones where the profile leaves them (:data:`fedseg.config.VOLUME_PAPER_DEFAULTS`: 96^3 patches).

    Raises:
        ValueError: an unknown method, or one without a ``paper`` profile.
    """
    from fedseg.config import LOCAL_PROTOCOL_KEYS, resolve_profile

    module = _recipe_module(method) if method in RECIPES else None
    profiles = getattr(module, "PAPER_PROFILES", None) if module is not None else None
    if not profiles or "paper" not in profiles:
        raise ValueError(f"method {method!r} has no paper profile to take a local protocol from; "
                         f"methods with one: {[m for m in available_methods() if _has_paper_profile(m)]}")
    resolved = resolve_profile("paper", profiles, spatial_dims=spatial_dims, spatial_mode=spatial_mode)
    return {"num_rounds": resolved["num_rounds"],
            "train_config": {k: resolved["train_config"][k] for k in LOCAL_PROTOCOL_KEYS}}


def _recipe_module(method: str):
    """The module of ``method``'s recipe, where its ``PAPER_PROFILES`` are."""
    return importlib.import_module(RECIPES.target(method).split(":")[0])


def _has_paper_profile(method: str) -> bool:
    return "paper" in (getattr(_recipe_module(method), "PAPER_PROFILES", None) or {})


def comparison_protocol(methods: Sequence[str], protocol: Optional[str] = None) -> str:
    """The method whose ``paper`` protocol a comparison of ``methods`` shares: ``protocol`` when given, else the one
    published segmentation method among ``methods`` (:data:`fedseg.methods.PROTOCOL_METHODS`), else ``fedavg``'s.

    Raises:
        ValueError: ``protocol`` is unknown, or ``methods`` hold several published methods and no ``protocol``.
    """
    if protocol is not None:
        get_recipe_class(protocol)
        return protocol
    published = sorted({m for m in methods if m in PROTOCOL_METHODS})
    if len(published) > 1:
        raise ValueError(f"the methods {published} each have their authors' local protocol; name the one this comparison "
                         "uses (fedseg bench --protocol METHOD)")
    return published[0] if published else "fedavg"
