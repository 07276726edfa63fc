"""Importer for fundus optic disc / cup and prostate MRI slice samples: one site per domain, read in place.

The source folder (the caller's ``src``, the CLI's ``--src``; else ``$FEDSEG_DATASETS/odoc_prostate_samples``) is laid
out as::

    <src>/manifest.csv   task,site,split,image,mask,height,width,image_mode,mask_shape,mask_values,source
    <src>/TERMS.md       research use only; cite the original providers
    <src>/fundus_odoc/<domain>/{images,masks}/*.png            Drishti-GS, RIM-ONE-r3, REFUGE-train, REFUGE-val
    <src>/prostate_mri_slices/<site>/{images,masks}/*.png      BIDMC, BMC, HK, I2CVB, RUNMC, UCL

:func:`import_odoc` writes one datalist per domain (site) pointing at the original files (nothing is copied) and
``site_datalists.json``. Each datalist declares its label space (:mod:`fedseg.data.labels`):

* ``task="fundus"``: 800 x 800 RGB optic-disc crops; masks are RGB with identical channels storing **0 = cup,
  128 = rim, 255 = background** (an inverted encoding), so ``labels`` = background / rim / cup,
  ``label_values`` = ``{"255": 0, "128": 1, "0": 2}`` and ``regions`` = disc (rim + cup) and cup — the REFUGE
  evaluation convention.
* ``task="prostate"``: 384 x 384 grey axial T2 slices, masks 0 = background, 255 = prostate (binary, declared
  ``{"background": 0, "prostate": 1}`` with ``label_values`` ``{"0": 0, "255": 1}``).

Every mask is decoded at import (undeclared values, RGB channels that differ and image/mask size mismatches are
errors naming the file) and its stored values are compared with the manifest's ``mask_values``, an independent
record of the same file. Splits: the manifest's ``test`` rows stay test; its ``train`` rows are divided into
training and validation (seeded, at least one each). A file the manifest lists in both splits (the prostate samples:
the source's train and test folders reuse file names, and the sample folder holds one copy of each name) is used
once, in the manifest's test split when it has one there, else in training, so no image is in two splits; a site
left with fewer than one file per split is refused. These are format samples (3 + 3 pairs a site): they prove the
encodings load end to end, not accuracy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from ..datalist import SPLITS, DatalistError, read_array, validate_pair
from ..labels import LabelSpace
from .common import check_sources, read_manifest, referenced_in_place, stable_rng, write_site_datalist, write_site_index
from .sources import resolve_source

__all__ = ["ODOC_FOLDER", "ODOC_TASKS", "import_odoc"]

#: the samples' folder under ``$FEDSEG_DATASETS``, read when no source folder is given
#: (:func:`~fedseg.data.importers.sources.resolve_source`)
ODOC_FOLDER = "odoc_prostate_samples"

#: manifest task name and declared label space of each importable task
ODOC_TASKS: Dict[str, Dict[str, object]] = {
    "fundus": {
        "manifest_task": "fundus_odoc",
        "labels": {"background": 0, "rim": 1, "cup": 2},
        "label_values": {"255": 0, "128": 1, "0": 2},
        "regions": {"disc": ["rim", "cup"], "cup": ["cup"]},
        "terms": "Drishti-GS / RIM-ONE r3 / REFUGE: research use only, cite the original providers; referenced in place, never copied",
    },
    "prostate": {
        "manifest_task": "prostate_mri_slices",
        "labels": {"background": 0, "prostate": 1},
        "label_values": {"0": 0, "255": 1},
        "terms": "multi-site prostate MRI (NCI-ISBI 2013, I2CVB, PROMISE12): research use only, cite the original "
                 "providers; referenced in place, never copied",
    },
}

_REQUIRED = ("task", "site", "split", "image", "mask")


def _check_row(row: Dict[str, str], root: Path, space: LabelSpace) -> None:
    """The pair decodes under ``space`` and its stored values are the manifest's ``mask_values``."""
    image, mask = root / row["image"], root / row["mask"]
    validate_pair(image, mask, space)
    if row.get("mask_values"):
        stored = np.unique(read_array(mask, "label"))
        recorded = sorted(float(v) for v in row["mask_values"].split())
        if sorted(float(v) for v in stored.tolist()) != recorded:
            raise DatalistError(
                f"mask {mask} stores values {stored.tolist()} but the manifest records {row['mask_values']!r}; "
                "the mask changed or is paired with the wrong image"
            )
    if row.get("height") and row.get("width"):
        shape = read_array(image, "image").shape[:2]
        if shape != (int(row["height"]), int(row["width"])):
            raise DatalistError(f"image {image} is {shape[0]} x {shape[1]}, the manifest records {row['height']} x {row['width']}")


def import_odoc(
    src: Optional[str | os.PathLike],
    out: str | os.PathLike,
    task: str = "fundus",
    sites: Optional[Sequence[str]] = None,
    seed: int = 0,
    val_fraction: float = 0.34,
    log: Callable[[str], None] = lambda msg: None,
) -> Dict[str, Path]:
    """Write one datalist per domain of ``task``; returns ``{site: datalist path}`` (manifest order).

    Args:
        src: folder with ``manifest.csv`` and the files it lists; ``None``: ``$FEDSEG_DATASETS/odoc_prostate_samples``.
        out: datalists go to ``out/<site>/datalist.json`` (and ``out/site_datalists.json``).
        task: ``"fundus"`` (optic disc / cup, three classes) or ``"prostate"`` (binary); :data:`ODOC_TASKS`.
        sites: domains to import (default: every domain of the task in the manifest).
        seed: seed of the training / validation division.
        val_fraction: share of a domain's training rows moved to validation (at least one).
        log: receives one line per domain, and one per file listed in both splits.

    Raises:
        DatalistError: no source folder (neither ``src`` nor ``FEDSEG_DATASETS``), a missing folder, missing
            files, undeclared or changed mask values, RGB masks whose channels differ, an
            unknown site, or a domain with too few files for three non-empty splits.
    """
    if task not in ODOC_TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(ODOC_TASKS)}")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    spec = ODOC_TASKS[task]
    root = resolve_source(src, ODOC_FOLDER, "odoc")
    manifest = root / "manifest.csv"
    rows = [r for r in read_manifest(root, required=_REQUIRED, what="odoc_prostate_samples") if r["task"] == spec["manifest_task"]]
    if not rows:
        raise DatalistError(f"no {spec['manifest_task']} rows in {manifest}")
    check_sources(rows, root, manifest)
    declared = {k: spec[k] for k in ("labels", "label_values", "regions") if k in spec}
    space = LabelSpace.from_datalist(declared, f"the {task} label space")
    available = list(dict.fromkeys(r["site"] for r in rows))
    chosen = list(sites) if sites else available
    unknown = [s for s in chosen if s not in available]
    if unknown:
        raise DatalistError(f"{manifest} has no {spec['manifest_task']} site(s) {unknown}; sites: {available}")
    paths: Dict[str, Path] = {}
    for site in chosen:
        site_rows = [r for r in rows if r["site"] == site]
        for row in site_rows:
            _check_row(row, root, space)
        splits, notes = _site_splits(site, site_rows, seed, val_fraction, manifest)
        for note in notes:
            log(note)
        rule = (
            f"manifest test rows kept as test ({len(splits['test'])}); its train rows divided by seeded permutation "
            f"(seed={seed}) into {len(splits['training'])} training / {len(splits['validation'])} validation "
            f"(validation = max(1, round({val_fraction} * n)))" + (f"; {len(notes)} file(s) listed in both manifest "
            "splits used once" if notes else "")
        )
        fields = {
            "name": f"odoc-{task}-{site}",
            "site": site,
            **referenced_in_place(root, spec["terms"], seed),
            "split_rule": rule,
            **declared,
            "spatial_mode": "resize",
        }
        paths[site] = write_site_datalist(
            out, site, fields, splits,
            lambda r: {"image": str(root / r["image"]), "label": str(root / r["mask"]), "id": Path(r["image"]).stem},
        )
        log(f"{site}: {'/'.join(str(len(splits[s])) for s in SPLITS)} training/validation/test images")
    write_site_index(out, paths)
    return paths


def _site_splits(site: str, rows: List[Dict[str, str]], seed: int, val_fraction: float, manifest: Path):
    """``({split: rows}, notes)``: test rows as listed, train rows split into training / validation; a file listed
    in both manifest splits is kept once (in test) and named in ``notes``."""
    test, train, notes = [], [], []
    test_files = {r["image"] for r in rows if r["split"].lower() == "test"}
    seen = set()
    for row in rows:
        split = row["split"].lower()
        if split not in ("train", "test"):
            raise DatalistError(f"manifest {manifest}: {site} row {row['image']} has split {row['split']!r}; expected train or test")
        if row["image"] in seen:
            continue
        seen.add(row["image"])
        if split == "test" or row["image"] in test_files:
            if split == "train":
                notes.append(f"{site}: {row['image']} is listed in the manifest's train and test splits; used once, as test")
            test.append(row)
        else:
            train.append(row)
    if len(train) < 2:
        # the manifest's own train rows cannot give both training and validation: move test files in, seeded
        rng = stable_rng("odoc", site, "test", seed)
        need = 2 - len(train)
        if len(test) - need < 1:
            raise DatalistError(f"{site}: {len(rows)} rows name {len(seen)} distinct files; need >= 3 for non-empty splits")
        moved = [test[i] for i in sorted(rng.permutation(len(test))[:need])]
        test = [r for r in test if r not in moved]
        train += moved
        notes.append(f"{site}: {need} test file(s) moved to training/validation so that every split is non-empty")
    order = [train[i] for i in stable_rng("odoc", site, seed).permutation(len(train))]
    n_val = max(1, int(round(val_fraction * len(train))))
    return {"training": order[n_val:], "validation": order[:n_val], "test": test}, notes
