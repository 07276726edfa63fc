"""One entry point for a site's engine: the task decides which.

``task`` comes from the job's ``train_config["task"]`` where set, else from the datalist's top-level
``"task"`` (absent = ``"segmentation"``, every datalist written before classification existed). Both
set and different is an error: a site whose data does not fit the job must fail loudly, not train a
segmentation network on class indices.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import torch

from fedseg.data.classification import datalist_task
from fedseg.data.datalist import read_datalist_json
from fedseg.engine.base import TASKS, LocalEngine

__all__ = ["build_engine", "resolve_task"]


def resolve_task(datalist: os.PathLike, train_config: Dict[str, Any]) -> str:
    """The task of this site: ``train_config["task"]`` if set, else the datalist's (see module docstring)."""
    path, info = read_datalist_json(datalist)
    declared = datalist_task(info)
    wanted = train_config.get("task")
    if wanted is not None and wanted != declared:
        raise ValueError(f"the job's task is {wanted!r} but the datalist {path} is a {declared!r} datalist")
    task = wanted or declared
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} in {path}; expected one of {TASKS}")
    return task


def build_engine(
    site: str,
    datalist: Optional[os.PathLike],
    train_config: Dict[str, Any],
    bundle_dir: Optional[os.PathLike] = None,
    device: Optional[torch.device] = None,
) -> LocalEngine:
    """``SegEngine`` (with the MONAI bundle ``bundle_dir``) or ``ClassificationEngine`` (network from
    ``vit_profile``; ``bundle_dir`` does not apply) for ``site``'s ``datalist``; a user's bundle
    (``train_config["bundle"]`` a folder: ``fedseg.bundle.is_bundle_path``) gets ``BundleEngine``, which reads its data
    from the bundle (``datalist`` unused; ``bundle_dir``: where the bundle is at this site, default the job's path)."""
    from fedseg.bundle import is_bundle_path

    if is_bundle_path(train_config.get("bundle")):
        from fedseg.engine.bundle_engine import BundleEngine

        return BundleEngine(site, train_config, bundle_dir=bundle_dir, device=device)
    task = resolve_task(datalist, train_config)
    if task == "classification":
        from fedseg.engine.classification import ClassificationEngine

        return ClassificationEngine(site, datalist, train_config, device=device)
    from fedseg.engine.engine import SegEngine

    return SegEngine(site, datalist, train_config, bundle_dir=bundle_dir, device=device)
