"""Load and validate a site's image-classification datalist (FedEFM phase 1).

Format (written by ``fedseg.data.silos`` / the built-in X-ray silos, or by hand)::

    {
      "task": "classification",
      "label_space": ["xray/a/catheter", "xray/a/guidewire", ...],   # the GLOBAL class names
      "training":   [{"image": "img/0001.png", "label": 3}, ...],
      "validation": [...],
      "test":       [...]
    }

``label`` is an integer index into the global ``label_space`` (every silo carries the same list, so a
class means the same output unit everywhere, even at a silo that never sees it). Paths are resolved
against the datalist's folder exactly as in :mod:`fedseg.data.datalist` (absolute paths stay). Every
error is a :class:`~fedseg.data.datalist.DatalistError` naming the file and the split/index.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

from fedseg.data.datalist import SPLITS, DatalistError, read_array, read_datalist_json

__all__ = [
    "CLASSIFICATION_TASK",
    "datalist_task",
    "label_space",
    "load_classification_datalist",
]

CLASSIFICATION_TASK = "classification"


def datalist_task(info: Mapping[str, Any]) -> str:
    """The task a parsed datalist declares: its ``"task"`` (``"segmentation"`` when absent)."""
    task = info.get("task", "segmentation")
    if not isinstance(task, str):
        raise DatalistError(f"datalist 'task' must be a string, got {task!r}")
    return task


def label_space(info: Mapping[str, Any], path: os.PathLike = "<datalist>") -> List[str]:
    """The datalist's global class names: a non-empty list of distinct, non-empty strings."""
    space = info.get("label_space")
    if not isinstance(space, list) or not space:
        raise DatalistError(f"classification datalist {path} needs a non-empty 'label_space' list of class names")
    if not all(isinstance(c, str) and c for c in space):
        raise DatalistError(f"'label_space' of {path} must hold non-empty strings, got {space!r}")
    if len(set(space)) != len(space):
        dup = sorted({c for c in space if space.count(c) > 1})
        raise DatalistError(f"'label_space' of {path} names classes twice: {dup}")
    return list(space)


def _check_entry(entry: Any, split: str, i: int, n_classes: int, path: Path) -> None:
    where = f"{split}[{i}] in {path}"
    if not isinstance(entry, dict):
        raise DatalistError(f"{where} must be an object, got {type(entry).__name__}")
    if not isinstance(entry.get("image"), str) or not entry["image"]:
        raise DatalistError(f"{where} has no 'image' path")
    label = entry.get("label")
    # bool is an int in Python; a true/false label is a malformed file, not class 1/0
    if isinstance(label, bool) or not isinstance(label, int):
        raise DatalistError(f"{where} needs an integer 'label' (index into label_space), got {label!r}")
    if not 0 <= label < n_classes:
        raise DatalistError(f"{where} has label {label} outside the label space 0..{n_classes - 1}")


def load_classification_datalist(
    path: os.PathLike, check_files: bool = True, splits: Sequence[str] = SPLITS
) -> Dict[str, List[Dict[str, Any]]]:
    """``{split: [{"image": absolute path, "label": int, ...}]}`` of a classification datalist.

    Args:
        path: the datalist JSON (or the folder holding ``datalist.json``).
        check_files: also decode every image (catches truncated files before training starts);
            without it only existence is checked.
        splits: splits that must be present and non-empty.
    Raises:
        DatalistError: wrong/missing ``task`` or ``label_space``, a missing or empty split, a label that
            is not an integer within the label space, a missing/unreadable image, or an image listed twice.
    """
    path, info = read_datalist_json(path)
    if datalist_task(info) != CLASSIFICATION_TASK:
        raise DatalistError(f"{path} is not a classification datalist (task {info.get('task')!r}); expected task 'classification'")
    n_classes = len(label_space(info, path))
    out: Dict[str, List[Dict[str, Any]]] = {}
    seen: Dict[str, str] = {}
    for split in splits:
        entries = info.get(split)
        if not isinstance(entries, list) or not entries:
            raise DatalistError(f"split '{split}' of {path} is missing or empty")
        resolved = []
        for i, entry in enumerate(entries):
            _check_entry(entry, split, i, n_classes, path)
            item = dict(entry)
            item["image"] = os.path.normpath(os.path.join(str(path.parent), entry["image"]))
            where = f"{split}[{i}] of {path}"
            if item["image"] in seen:
                raise DatalistError(f"image {item['image']} is listed twice in {path}: {seen[item['image']]} and {split}[{i}]")
            seen[item["image"]] = f"{split}[{i}]"
            try:
                if check_files:
                    read_array(item["image"], "image")
                elif not Path(item["image"]).is_file():
                    raise DatalistError(f"image file not found: {item['image']}")
            except DatalistError as exc:
                raise DatalistError(f"{exc} ({where})") from exc
            resolved.append(item)
        out[split] = resolved
    return out
