"""What every importer of a real data set shares: its manifest, the files it lists, seeded grouped splits.

Each data set's folder holds a ``manifest.csv`` whose rows name files relative to that folder
(:func:`read_manifest`, :func:`check_sources`). A row's ``split`` column, when filled, is the data set's official
split in one of the spellings of :data:`OFFICIAL_TRAIN`, :data:`OFFICIAL_VAL`, :data:`OFFICIAL_TEST`. Where an
importer draws a split itself it permutes groups (subjects, slides, angiograms), never single images, with a
generator seeded from the data set, the site and the caller's seed (:func:`stable_rng`, :func:`split_groups`), so
the same seed writes the same datalists on any machine.
"""

from __future__ import annotations

import csv
import os
import zlib
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

from ..errors import DatalistError

__all__ = [
    "OFFICIAL_TRAIN",
    "OFFICIAL_VAL",
    "OFFICIAL_TEST",
    "read_manifest",
    "check_sources",
    "stable_rng",
    "split_groups",
]

#: a manifest's ``split`` values (lower-cased) that name a data set's official training split
OFFICIAL_TRAIN = frozenset({"train", "training"})
#: ... its official validation split
OFFICIAL_VAL = frozenset({"val", "validation"})
#: ... its official test split
OFFICIAL_TEST = frozenset({"test", "testing"})


def read_manifest(src_root: str | os.PathLike, required: Sequence[str], what: str) -> List[Dict[str, str]]:
    """Rows of ``<src_root>/manifest.csv`` as dicts of strings, each value stripped (an empty cell is ``""``).

    Args:
        src_root: the data set's folder.
        required: columns the manifest must have.
        what: the data set's name for error messages.

    Raises:
        DatalistError: the manifest is missing, empty, or lacks a required column.
    """
    manifest = Path(src_root) / "manifest.csv"
    if not manifest.is_file():
        raise DatalistError(f"{what} manifest not found: {manifest}")
    with open(manifest, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise DatalistError(f"manifest {manifest} lacks column(s) {missing}; has {reader.fieldnames}")
        rows = [{k: (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
    if not rows:
        raise DatalistError(f"manifest {manifest} has no rows")
    return rows


def check_sources(rows: List[Dict[str, str]], root: Path, manifest: Path) -> None:
    """Check that every row's ``image`` and ``mask`` (and ``fov`` where given) is a file under ``root``.

    Args:
        rows: manifest rows (:func:`read_manifest`).
        root: the folder the rows' paths are relative to.
        manifest: the manifest's path, for messages.

    Raises:
        DatalistError: a row has no ``image`` or ``mask``, or listed files are missing (the first five are named).
    """
    missing = []
    for row in rows:
        for key in ("image", "mask", "fov"):
            if key == "fov" and not row.get("fov"):
                continue
            if not row.get(key):
                raise DatalistError(f"manifest {manifest}: row {row.get('site')}/{row.get('id')} has no {key}")
            if not (root / row[key]).is_file():
                missing.append(str(root / row[key]))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DatalistError(f"{len(missing)} file(s) listed in {manifest} are missing: {shown}")


def stable_rng(*parts: Any) -> np.random.Generator:
    """A generator seeded from the crc32 of ``"/".join(parts)``: the same parts give the same draws in every process.

    Python's ``hash()`` of a string is salted per process, so it cannot seed a split that must repeat.
    """
    return np.random.default_rng(zlib.crc32("/".join(str(p) for p in parts).encode("utf-8")))


def _n_of(fraction: float, n: int) -> int:
    """``max(1, round(fraction * n))``: a split's share of ``n`` groups, never empty."""
    return max(1, int(round(fraction * n)))


def split_groups(
    groups: List[str], rng: np.random.Generator, fractions: Mapping[str, float], splits: Sequence[str]
) -> Dict[str, List[str]]:
    """A seeded split of group keys (subjects, slides): ``{split: [group key, ...]}``.

    The keys are permuted by ``rng``; each of ``splits[1:]`` in turn takes the next ``max(1, round(f * n))``
    of them (``f = fractions[split]``, ``n = len(groups)``) and ``splits[0]`` takes the rest.

    Raises:
        DatalistError: nothing is left for ``splits[0]``.
    """
    order = [groups[i] for i in rng.permutation(len(groups))]
    out: Dict[str, List[str]] = {}
    start = 0
    for split in splits[1:]:
        k = _n_of(fractions[split], len(groups))
        out[split] = order[start : start + k]
        start += k
    out[splits[0]] = order[start:]
    if not out[splits[0]]:
        raise DatalistError(f"too few subjects ({len(groups)}) for a non-empty {'/'.join(splits)} split")
    return out
