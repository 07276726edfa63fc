"""What ``jobs/job.py`` makes of its command line: a method's own recipe options, and the sites, site datalists and
``train_config`` fields of a job (the same checks as ``fedseg run``)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

#: recipe parameters every method shares, set by job.py's own options (not offered again as method options)
SHARED_PARAMETERS = ("self", "name", "profile", "num_rounds")


def method_parameters(recipe_class) -> Dict[str, inspect.Parameter]:
    """A recipe's own keyword options (GraphFedSeg's ``alpha``, ``uncertainty``, ...): name -> parameter. Its strategy's
    and objective's options (``FedSegRecipe.method_options``: their dataclasses' defaults), then the keywords of its
    signature (FedEFM's ``unseen``)."""
    own = {
        name: p for name, p in inspect.signature(recipe_class.__init__).parameters.items()
        if name not in SHARED_PARAMETERS and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }
    return {**recipe_class.method_options(), **own}


def read_site_datalists(path: Path) -> Dict[str, str]:
    """``{site: absolute datalist path}`` from a JSON map (paths relative to the map's folder)."""
    src = Path(path).resolve()
    if not src.is_file():
        raise ValueError(f"site datalists file {src} does not exist: give a JSON map site -> datalist "
                         "(fedseg data ... writes one, site_datalists.json)")
    mapping = json.loads(src.read_text())
    if not isinstance(mapping, dict) or not mapping:
        raise ValueError(f"{src} must map site names to datalist paths, got {type(mapping).__name__}")
    return {site: str((src.parent / p).resolve()) for site, p in mapping.items()}


def federation_fields(mapping: Optional[Dict[str, str]], family: Optional[str], overrides: Dict[str, Any],
                      data_profile: Optional[str] = None) -> Dict[str, Any]:
    """The label-space (and, for volumes, volume) ``train_config`` fields of a federation's segmentation datalists (or of
    the built-in ``family``), checked before a job starts (``fedseg.data.checks.check_federation``); keys ``overrides``
    sets are left out; ``{}`` for classification datalists. ``data_profile``: the built-in family's profile (a volume
    family's target spacing depends on it). ``fedseg run`` / ``bench`` / ``export`` and ``jobs/job.py`` share it.

    Raises:
        ValueError: a datalist or the federation is unusable (every problem named).
    """
    from fedseg.data.checks import check_federation

    explicit = dict(overrides)
    if data_profile and "data_profile" not in explicit:
        explicit["data_profile"] = data_profile
    if mapping:
        from fedseg.bench.runs import federation_task

        if federation_task(mapping) != "segmentation":
            return {}
    fields = check_federation(mapping, family=None if mapping else (family or "polyp"), explicit=explicit)
    return {k: v for k, v in fields.items() if overrides.get(k) is None}


def data_fields(mapping: Optional[Dict[str, str]], family: Optional[str], overrides: Dict[str, Any],
                data_profile: Optional[str]) -> Dict[str, Any]:
    """:func:`federation_fields` plus the spatial mode every datalist declares (recorded in the job's train_config, so
    that the checkpoint says how to run the model).

    Raises:
        ValueError: a datalist or the federation is unusable (every problem named).
    """
    from fedseg.data.datalist import common_spatial_mode

    fields = federation_fields(mapping, family, overrides, data_profile)
    if mapping and overrides.get("spatial_mode") is None:
        from fedseg.bench.runs import federation_task

        mode = common_spatial_mode(mapping.values()) if federation_task(mapping) == "segmentation" else None
        if mode:
            fields = {"spatial_mode": mode, **fields}
    return fields


def profile_data(profile: str) -> Optional[str]:
    """The built-in data profile a training profile generates (``tiny`` -> ``tiny``; None = the family's default)."""
    from fedseg.config import PROFILES

    return (PROFILES.get(profile) or {}).get("train_config", {}).get("data_profile")


def bundle_options(bundle: str, site_overrides: Optional[str], sets: Dict[str, Any]) -> Tuple[Dict[str, Any], str, Optional[list]]:
    """A run on a user's MONAI bundle, checked before anything starts: ``(train overrides, the sites' script
    arguments, the sites)``. ``sets`` (``--set`` items, parsed) split into the bundle's config ids (every site) and
    ``train_config`` keys (``fedseg.bundle.split_bundle_sets``); ``site_overrides``: a JSON file ``{site: {config id:
    value}}`` whose keys are the sites, each checked to name ids the bundle has and to give it training images.

    Raises:
        fedseg.bundle.BundleError: the bundle lacks a MONAI property, an id it does not have, a site without images.
    """
    from fedseg.bundle import check_site_overrides, read_bundle, split_bundle_sets

    root = Path(bundle).resolve()
    # the required properties, before any site starts
    bundle_sets, train = split_bundle_sets(read_bundle(root, initialize=False), sets)
    sites = None
    script_args = ""
    if site_overrides:
        path = Path(site_overrides).resolve()
        mapping = json.loads(path.read_text())
        if not isinstance(mapping, dict) or not mapping:
            raise ValueError(f"{path}: expected a JSON object {{site: {{config id: value}}}} with at least one site")
        check_site_overrides(root, mapping, bundle_sets)
        sites = sorted(mapping)
        script_args = f"--site_overrides {path}"
    return {**train, "bundle": str(root), "bundle_overrides": bundle_sets or None}, script_args, sites
