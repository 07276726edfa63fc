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

import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..datalist import SPLITS, DatalistError, load_datalist, read_datalist_json, write_json_atomic
from .common import (
    OFFICIAL_TEST, OFFICIAL_TRAIN, OFFICIAL_VAL, RESEARCH_LICENSED_TERMS, check_fractions, check_site_rows, read_manifest,
    referenced_in_place, split_groups, stable_rng, write_site_datalist,
)
from .sources import resolve_source

__all__ = ["import_retina", "participant_split", "retina_subject", "DEFAULT_RETINA_ROOT", "DEFAULT_RESCALE"]

#: the retina data set's folder under ``$FEDSEG_DATASETS``, read when no source folder is given
#: (:func:`~fedseg.data.importers.sources.resolve_source`)
DEFAULT_RETINA_ROOT = "retina_vessels"

#: one fixed rescale factor per data set (patch mode), stated in the datalist, never guessed per image
DEFAULT_RESCALE = {"CHASE_DB1": 0.5}

_REQUIRED_COLUMNS = ("site", "id", "split", "image", "mask")


def retina_subject(image_id: str) -> str:
    """The subject an image id belongs to: CHASE_DB1-style ``Image_01L``/``Image_01R`` (both eyes) give ``Image_01``.

    An id not ending in a digit then ``L`` or ``R`` is its own subject.
    """
    m = re.fullmatch(r"(.*\d)[LR]", image_id)
    return m.group(1) if m else image_id


def _site_splits(
    site: str, rows: List[Dict[str, str]], seed: int, val_fraction: float, test_fraction: float, manifest: Path
) -> Tuple[Dict[str, List[Dict[str, str]]], str]:
    """Assign a site's manifest rows to training/validation/test; returns (splits, rule text)."""
    official = [r["split"].lower() for r in rows]
    rng = stable_rng("retina", site, seed)
    by_id = {r["id"]: r for r in rows}
    if all(official):
        unknown = sorted(set(official) - OFFICIAL_TRAIN - OFFICIAL_VAL - OFFICIAL_TEST)
        if unknown:
            raise DatalistError(f"manifest {manifest}: site {site} has unknown split value(s) {unknown}")
        test = [r for r in rows if r["split"].lower() in OFFICIAL_TEST]
        val = [r for r in rows if r["split"].lower() in OFFICIAL_VAL]
        pool = sorted(r["id"] for r in rows if r["split"].lower() in OFFICIAL_TRAIN)
        if not test or not pool:
            raise DatalistError(f"manifest {manifest}: site {site} needs official train and test rows")
        if not val:
            if len(pool) < 2:
                raise DatalistError(f"manifest {manifest}: site {site} has too few official training rows")
            chosen = set(split_groups(pool, rng, {"validation": val_fraction}, ("training", "validation"))["validation"])
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
        subjects.setdefault(retina_subject(image_id), []).append(image_id)
    keys = list(subjects)
    if len(keys) < 3:
        raise DatalistError(f"manifest {manifest}: site {site} has {len(keys)} subject(s); need >= 3 to split")
    grouped = split_groups(
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
    check_fractions(val_fraction, test_fraction)
    root = resolve_source(src_root, DEFAULT_RETINA_ROOT, "retina")
    manifest = root / "manifest.csv"
    rows = read_manifest(root, _REQUIRED_COLUMNS, "retina")
    out: Dict[str, Path] = {}
    # validate every requested site before writing anything, so a failure leaves out_dir untouched
    plans = {}
    for site in sites:
        site_rows = [r for r in rows if r["site"] == site]
        if not site_rows:
            known = sorted({r["site"] for r in rows})
            raise DatalistError(f"site {site!r} has no rows in {manifest}; sites there: {known}")
        check_site_rows(site_rows, root, manifest, f"site {site}")
        plans[site] = _site_splits(site, site_rows, seed, val_fraction, test_fraction, manifest)

    for site, (splits, rule) in plans.items():
        fields = {
            "name": f"retina-{site}",
            "site": site,
            **referenced_in_place(root, RESEARCH_LICENSED_TERMS, seed),
            "val_fraction": float(val_fraction),
            "test_fraction": float(test_fraction),
            "split_rule": rule,
            "labels": {"0": "background", "1": "vessel"},
            "spatial_mode": "patch",
            "rescale": float(rescale.get(site, 1.0)),
        }
        out[site] = write_site_datalist(out_dir, site, fields, splits, lambda r: _entry(r, root), check_files)
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
        rng = stable_rng("participants", domain, seed)
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
