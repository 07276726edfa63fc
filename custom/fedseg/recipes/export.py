"""Write a method's recipe as an NVFlare job folder (``jobs/<method>``: ``meta.json`` + ``app/config/*.json``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def export_job(method: str, out_dir: os.PathLike, profile: str = "default", **recipe_args) -> Path:
    """Export ``method``'s recipe into ``out_dir/<method>`` (replacing an older export)."""
    from fedseg.recipes import get_recipe_class

    return write_job(get_recipe_class(method)(profile=profile, **recipe_args), out_dir)


def write_job(recipe, out_dir: os.PathLike) -> Path:
    """Export a built recipe into ``out_dir/<job name>`` (replacing an older export), byte-stable; returns the folder."""
    target = Path(out_dir) / recipe.name
    if target.exists():
        shutil.rmtree(target)
    recipe.export(str(out_dir))
    for config in target.rglob("*.json"):
        canonicalise(config)
    return target


def canonicalise(path: Path) -> None:
    """NVFlare writes filter task lists from a set (order varies per process): sort them so that
    exports are byte-stable and the committed jobs can be checked for drift."""

    def sort_tasks(node):
        if isinstance(node, dict):
            return {k: (sorted(v) if k == "tasks" and isinstance(v, list) else sort_tasks(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [sort_tasks(v) for v in node]
        return node

    path.write_text(json.dumps(sort_tasks(json.loads(path.read_text())), indent=4))
