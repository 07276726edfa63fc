"""What every importer of a real data set shares: its manifest, the files it lists, seeded grouped splits, and the
datalists it writes.

Each data set's folder holds a ``manifest.csv`` whose rows name files relative to that folder
(:func:`read_manifest`, :func:`check_sources`). A row's ``split`` column, when filled, is the data set's official
split in one of the spellings of :data:`OFFICIAL_TRAIN`, :data:`OFFICIAL_VAL`, :data:`OFFICIAL_TEST`. Where an
importer draws a split itself it permutes groups (subjects, slides, angiograms), never single images, with a
generator seeded from the data set, the site and the caller's seed (:func:`stable_rng`, :func:`split_groups`), so
the same seed writes the same datalists on any machine. Each site's datalist points at the data set's own files
(:func:`referenced_in_place`, :func:`write_site_datalist`), and ``site_datalists.json`` maps the sites to them
(:func:`write_site_index`).
"""

from __future__ import annotations

import csv
import os
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Sequence

import numpy as np

from ..datalist import SPLITS, load_datalist, write_json_atomic
from ..errors import DatalistError

__all__ = [
    "OFFICIAL_TRAIN",
    "OFFICIAL_VAL",
    "OFFICIAL_TEST",
    "RESEARCH_LICENSED_TERMS",
    "read_manifest",
    "check_sources",
    "check_site_rows",
    "check_fractions",
    "stable_rng",
    "split_groups",
    "referenced_in_place",
    "write_site_datalist",
    "write_site_index",
]

#: a manifest's ``split`` values (lower-cased) that name a data set's official training split
OFFICIAL_TRAIN = frozenset({"train", "training"})
#: ... its official validation split
OFFICIAL_VAL = frozenset({"val", "validation"})
#: ... its official test split
OFFICIAL_TEST = frozenset({"test", "testing"})

#: the ``terms`` of a datalist over research-licensed files (MoNuSeg, TNBC, DRIVE, ...): referenced, never copied
RESEARCH_LICENSED_TERMS = "research-licensed; referenced in place, never copied (see TERMS.md in source)"


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


def check_site_rows(rows: List[Dict[str, str]], root: Path, manifest: Path, where: str) -> None:
    """Check one site's manifest rows: no ``id`` twice, and every file they list present (:func:`check_sources`).

    Args:
        rows: the site's manifest rows.
        root: the folder the rows' paths are relative to.
        manifest: the manifest's path, for messages.
        where: the site as messages name it (``"site MoNuSeg"``).

    Raises:
        DatalistError: an id listed twice, or a missing file.
    """
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise DatalistError(f"manifest {manifest}: {where} lists an id twice")
    check_sources(rows, root, manifest)


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """Raise ``ValueError`` unless the validation and test shares are each in (0, 1) and leave training a share."""
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(f"need 0 < val_fraction, test_fraction and their sum < 1; got {val_fraction}, {test_fraction}")


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


def referenced_in_place(root: Path, terms: str, seed: int) -> Dict[str, Any]:
    """The fields of a datalist whose entries point at a data set's own files (referenced in place, never copied):
    ``source`` (the data set's folder), its ``terms``, ``allow_external_paths`` and the split ``seed``."""
    return {
        "source": str(root),
        "terms": terms,
        # the entries point at the source folder, outside this datalist's (fedseg.data.checks)
        "allow_external_paths": True,
        "seed": int(seed),
    }


def write_site_datalist(
    out_dir: str | os.PathLike,
    site: str,
    fields: Mapping[str, Any],
    splits: Mapping[str, List[Dict[str, str]]],
    entry: Callable[[Dict[str, str]], Dict[str, str]],
    check_files: bool = False,
) -> Path:
    """Write ``<out_dir>/<site>/datalist.json``: ``fields`` (name, source, split rule, label space, ...), then every
    split of :data:`fedseg.data.datalist.SPLITS` as the entries ``entry(row)`` of its manifest rows ``splits[split]``.

    Args:
        out_dir: the importer's output folder.
        site: the site, the datalist's folder name.
        fields: the datalist's fields before its splits, in the order they are written.
        splits: ``{split: manifest rows}`` for every split.
        entry: a manifest row's datalist entry (absolute paths to the original files).
        check_files: also open every image/mask and validate them (:func:`fedseg.data.datalist.load_datalist`).

    Returns:
        The datalist's path.
    """
    datalist = dict(fields)
    for split in SPLITS:
        datalist[split] = [entry(r) for r in splits[split]]
    path = write_json_atomic(Path(out_dir) / site / "datalist.json", datalist)
    if check_files:
        load_datalist(path, check_files=True)
    return path


def write_site_index(out_dir: str | os.PathLike, paths: Mapping[str, Path]) -> Path:
    """Write ``<out_dir>/site_datalists.json``, the ``{site: absolute datalist path}`` map ``--site-datalists`` reads."""
    return write_json_atomic(Path(out_dir) / "site_datalists.json", {s: str(Path(p).resolve()) for s, p in paths.items()})
