"""Importer for the real retinal-vessel benchmark (DRIVE, STARE, CHASE_DB1) and participant splits.

The source folder (the caller's ``src_root``, the CLI's ``--src``; else ``$FEDSEG_DATASETS/retina_vessels``) is
laid out as::

    <src_root>/manifest.csv     site,id,split,image,mask,fov,height,width,vessel_fraction,...
    <src_root>/TERMS.md         licence terms (research use, no redistribution)
    <src_root>/DRIVE/images/01_test.tif, DRIVE/masks/01_test.png, DRIVE/fov/01_test.png, ...

``image``/``mask``/``fov`` in the manifest are relative to ``src_root``. These datasets are
research-licensed, so the importer never copies or converts a pixel: it writes one
``<out_dir>/<site>/datalist.json`` per site whose entries point at the original files by absolute
path. The datalists are the only files written.

Split rules (recorded in each datalist's ``"split_rule"``):

* a site whose manifest rows all carry an official split (DRIVE: ids 01-20 ``test``, 21-40
  ``train``) keeps its official test split; its official training images are divided, seeded, into
  training and validation (``max(1, round(val_fraction * n))`` validation images);
* a site without official splits (STARE, CHASE_DB1) gets a seeded training/validation/test split
  with ``max(1, round(fraction * n))`` test and validation items. CHASE_DB1 holds both eyes of each
  child (``Image_01L``/``Image_01R``); ids that differ only by a trailing ``L``/``R`` are kept in the
  same split so that no subject appears in both training and test.

Every datalist declares ``"spatial_mode": "patch"`` (vessels one or two pixels wide are trained on
native-resolution patches) and its data set's fixed ``"rescale"`` factor (default: CHASE_DB1 at 0.5,
which brings its 999 x 960 images and their wider vessels near DRIVE's and STARE's scale; 1 elsewhere).
Metrics are still computed at each image's own size.
"""

from __future__ import annotations

import csv
import os
import re
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..datalist import SPLITS, DatalistError, load_datalist, read_datalist_json, write_json_atomic
from .sources import resolve_source

__all__ = ["import_retina", "participant_split", "read_manifest", "DEFAULT_RETINA_ROOT", "DEFAULT_RESCALE"]

#: the retina data set's folder under ``$FEDSEG_DATASETS``, read when no source folder is given
#: (:func:`~fedseg.data.importers.sources.resolve_source`)
DEFAULT_RETINA_ROOT = "retina_vessels"

#: one fixed rescale factor per data set (patch mode), stated in the datalist, never guessed per image
DEFAULT_RESCALE = {"CHASE_DB1": 0.5}

_REQUIRED_COLUMNS = ("site", "id", "split", "image", "mask")
_OFFICIAL_TRAIN = {"train", "training"}
_OFFICIAL_VAL = {"val", "validation"}
_OFFICIAL_TEST = {"test", "testing"}


def _stable_rng(*parts: Any) -> np.random.Generator:
    """RNG seeded from a crc32 of the parts (Python's ``hash()`` is salted per process)."""
    return np.random.default_rng(zlib.crc32("/".join(str(p) for p in parts).encode("utf-8")))


def read_manifest(
    src_root: str | os.PathLike, required: Sequence[str] = _REQUIRED_COLUMNS, what: str = "retina"
) -> List[Dict[str, str]]:
    """Rows of ``<src_root>/manifest.csv`` as dicts of strings.

    Args:
        required: columns the manifest must have (default: the retina importer's).
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


def _subject(image_id: str) -> str:
    """Grouping key: CHASE_DB1-style ``Image_01L``/``Image_01R`` map to the same subject."""
    m = re.fullmatch(r"(.*\d)[LR]", image_id)
    return m.group(1) if m else image_id


def _n_of(fraction: float, n: int) -> int:
    return max(1, int(round(fraction * n)))


def _split_groups(
    groups: List[str], rng: np.random.Generator, fractions: Mapping[str, float], splits: Sequence[str]
) -> Dict[str, List[str]]:
    """Seeded split of group keys: every split in ``fractions`` gets ``max(1, round(f * n))``
    groups; the remaining split in ``splits`` (listed first) takes the rest."""
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


def _site_splits(
    site: str, rows: List[Dict[str, str]], seed: int, val_fraction: float, test_fraction: float, manifest: Path
) -> Tuple[Dict[str, List[Dict[str, str]]], str]:
    """Assign a site's manifest rows to training/validation/test; returns (splits, rule text)."""
    official = [r["split"].lower() for r in rows]
    rng = _stable_rng("retina", site, seed)
    by_id = {r["id"]: r for r in rows}
    if all(official):
        unknown = sorted(set(official) - _OFFICIAL_TRAIN - _OFFICIAL_VAL - _OFFICIAL_TEST)
        if unknown:
            raise DatalistError(f"manifest {manifest}: site {site} has unknown split value(s) {unknown}")
        test = [r for r in rows if r["split"].lower() in _OFFICIAL_TEST]
        val = [r for r in rows if r["split"].lower() in _OFFICIAL_VAL]
        pool = sorted(r["id"] for r in rows if r["split"].lower() in _OFFICIAL_TRAIN)
        if not test or not pool:
            raise DatalistError(f"manifest {manifest}: site {site} needs official train and test rows")
        if not val:
            if len(pool) < 2:
                raise DatalistError(f"manifest {manifest}: site {site} has too few official training rows")
            chosen = set(_split_groups(pool, rng, {"validation": val_fraction}, ("training", "validation"))["validation"])
            val = [by_id[i] for i in pool if i in chosen]
            pool = [i for i in pool if i not in chosen]
            rule = (
                f"official test split kept ({len(test)} images); official training split divided by seeded "
                f"permutation (seed={seed}) into {len(pool)} training / {len(val)} validation "
                f"(validation = max(1, round({val_fraction} * {len(pool) + len(val)})))"
            )
        else:
            rule = "official training/validation/test splits kept"
        train = [by_id[i] for i in pool]
        return {"training": train, "validation": val, "test": test}, rule
    if any(official):
        raise DatalistError(
            f"manifest {manifest}: site {site} has an official split on some rows but not others; "
            "give every row a split or none"
        )
    subjects: "OrderedDict[str, List[str]]" = OrderedDict()
    for image_id in sorted(by_id):
        subjects.setdefault(_subject(image_id), []).append(image_id)
    keys = list(subjects)
    if len(keys) < 3:
        raise DatalistError(f"manifest {manifest}: site {site} has {len(keys)} subject(s); need >= 3 to split")
    grouped = _split_groups(
        keys, rng, {"validation": val_fraction, "test": test_fraction}, ("training", "validation", "test")
    )
    splits = {s: [by_id[i] for k in sorted(grouped[s]) for i in subjects[k]] for s in SPLITS}
    paired = len(keys) < len(by_id)
    rule = (
        f"no official split: seeded permutation (seed={seed}) of {len(keys)} "
        f"{'subjects (L/R eyes of one subject kept together)' if paired else 'images'} into "
        f"test = max(1, round({test_fraction} * n)), validation = max(1, round({val_fraction} * n)), "
        f"training = rest: {len(splits['training'])}/{len(splits['validation'])}/{len(splits['test'])} images"
    )
    return splits, rule


def _entry(row: Dict[str, str], root: Path) -> Dict[str, str]:
    """Datalist entry with absolute paths to the original files (never copies)."""
    entry = {"image": str(root / row["image"]), "label": str(root / row["mask"])}
    if row.get("fov"):
        entry["fov"] = str(root / row["fov"])
    entry["id"] = row["id"]
    return entry


def _check_sources(rows: List[Dict[str, str]], root: Path, manifest: Path) -> None:
    """Every referenced image/mask/fov exists; the error lists the missing files."""
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


def import_retina(
    src_root: Optional[str | os.PathLike],
    out_dir: str | os.PathLike,
    seed: int = 0,
    sites: Sequence[str] = ("DRIVE", "STARE", "CHASE_DB1"),
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    check_files: bool = False,
    rescale: Mapping[str, float] = DEFAULT_RESCALE,
) -> Dict[str, Path]:
    """Write ``out_dir/<site>/datalist.json`` for each site, pointing at the original files.

    Args:
        src_root: folder with ``manifest.csv`` (see module docstring); ``None``: ``$FEDSEG_DATASETS/retina_vessels``.
        out_dir: where the per-site datalists go; nothing else is written there.
        seed: split seed; the same seed gives identical datalists.
        sites: manifest ``site`` values to import, in order.
        val_fraction, test_fraction: used for sites without an official split (and the validation
            share of an official training split).
        check_files: also open every image/mask/fov and validate them (size agreement, binary
            masks) via :func:`fedseg.data.datalist.load_datalist`; existence is always checked.
        rescale: ``{site: factor}`` written as the datalist's ``"rescale"`` (1 for sites not named).

    Returns:
        ``{site: datalist path}``.

    Raises:
        DatalistError: no source folder (neither ``src_root`` nor ``FEDSEG_DATASETS``), a missing folder,
            missing manifest/columns/files, an unknown site, or an impossible split.
    """
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError(f"need 0 < val_fraction, test_fraction and their sum < 1; got {val_fraction}, {test_fraction}")
    root = resolve_source(src_root, DEFAULT_RETINA_ROOT, "retina")
    manifest = root / "manifest.csv"
    rows = read_manifest(root)
    out: Dict[str, Path] = {}
    # validate every requested site before writing anything, so a failure leaves out_dir untouched
    plans = {}
    for site in sites:
        site_rows = [r for r in rows if r["site"] == site]
        if not site_rows:
            known = sorted({r["site"] for r in rows})
            raise DatalistError(f"site {site!r} has no rows in {manifest}; sites there: {known}")
        ids = [r["id"] for r in site_rows]
        if len(set(ids)) != len(ids):
            raise DatalistError(f"manifest {manifest}: site {site} lists an id twice")
        _check_sources(site_rows, root, manifest)
        plans[site] = _site_splits(site, site_rows, seed, val_fraction, test_fraction, manifest)

    for site, (splits, rule) in plans.items():
        datalist = {
            "name": f"retina-{site}",
            "site": site,
            "source": str(root),
            "terms": "research-licensed; referenced in place, never copied (see TERMS.md in source)",
            # the entries point at the source folder, outside this datalist's (fedseg.data.checks)
            "allow_external_paths": True,
            "seed": int(seed),
            "val_fraction": float(val_fraction),
            "test_fraction": float(test_fraction),
            "split_rule": rule,
            "labels": {"0": "background", "1": "vessel"},
            "spatial_mode": "patch",
            "rescale": float(rescale.get(site, 1.0)),
        }
        for split in SPLITS:
            datalist[split] = [_entry(r, root) for r in splits[split]]
        path = write_json_atomic(Path(out_dir) / site / "datalist.json", datalist)
        if check_files:
            load_datalist(path, check_files=True)
        out[site] = path
    return out


def participant_split(
    datalists: Mapping[str, str | os.PathLike],
    counts: Mapping[str, int],
    out_dir: str | os.PathLike,
    seed: int = 0,
) -> Dict[str, Path]:
    """Split each domain's training data among ``counts[domain]`` participants.

    The FVAC setting, e.g. ``counts={"DRIVE": 3, "STARE": 1, "CHASE_DB1": 1}``: DRIVE's training
    images are shared out among ``DRIVE_1``, ``DRIVE_2``, ``DRIVE_3``; STARE and CHASE_DB1 stay one
    participant each (no suffix when the count is 1). Domains missing from ``counts`` get 1.

    * training: a seeded partition into ``k`` near-equal disjoint shares that together cover the
      domain's training images exactly;
    * validation: partitioned the same way when the domain has at least ``k`` validation images,
      otherwise every participant keeps the domain's whole validation split (it is never trained
      on, and each participant needs one for model selection);
    * test: every participant keeps the domain's full test split, so per-domain scores compare.

    Args:
        datalists: ``{domain: datalist path}`` (e.g. from :func:`import_retina` or
            :func:`fedseg.data.synthetic.generate_federation`).
        counts: ``{domain: number of participants}`` (>= 1, <= number of training images).
        out_dir: participant datalists go to ``out_dir/<participant>/datalist.json``.
        seed: partition seed.

    Returns:
        ``{participant: datalist path}`` ordered by domain then share index.
    """
    unknown = sorted(set(counts) - set(datalists))
    if unknown:
        raise ValueError(f"counts name domain(s) {unknown} that are not in datalists {sorted(datalists)}")
    plans: Dict[str, Dict[str, Any]] = {}
    for domain, path in datalists.items():
        k = int(counts.get(domain, 1))
        if k < 1:
            raise ValueError(f"counts[{domain!r}] must be >= 1, got {k}")
        splits = load_datalist(path, check_files=False)
        _, source = read_datalist_json(path)
        n_train, n_val = len(splits["training"]), len(splits["validation"])
        if k > n_train:
            raise DatalistError(f"cannot split {n_train} training images of {path} among {k} participants")
        rng = _stable_rng("participants", domain, seed)
        train_shares = np.array_split(rng.permutation(n_train), k)
        val_shares = np.array_split(rng.permutation(n_val), k) if n_val >= k else [np.arange(n_val)] * k
        for j in range(k):
            name = f"{domain}_{j + 1}" if k > 1 else domain
            if name in plans:
                raise ValueError(f"participant name {name!r} is produced twice; rename a domain")
            rule = (
                f"share {j + 1}/{k} of domain {domain}: seeded partition (seed={seed}) of its training images"
                + ("; validation partitioned likewise" if n_val >= k else "; validation shared by all shares (fewer images than shares)")
                + "; test = the domain's full test split"
            )
            plans[name] = {
                "name": f"participant-{name}",
                "participant": name,
                "domain": domain,
                "share_index": j,
                "num_shares": k,
                "seed": int(seed),
                "source_datalist": str(Path(path).absolute()),
                "allow_external_paths": True,  # the shares point at the domain's files
                "split_rule": rule,
                # the domain's spatial settings travel with its shares
                **{k: source[k] for k in ("spatial_mode", "rescale", "spacing") if k in source},
                "training": [splits["training"][i] for i in sorted(train_shares[j].tolist())],
                "validation": [splits["validation"][i] for i in sorted(val_shares[j].tolist())],
                "test": list(splits["test"]),
            }
    return {name: write_json_atomic(Path(out_dir) / name / "datalist.json", plan) for name, plan in plans.items()}
