"""Importer for real H&E nucleus segmentation data (MoNuSeg, TNBC): cross-source or cross-organ sites.

The source folder (the caller's ``src_root``, the CLI's ``--src``; else ``$FEDSEG_DATASETS/nuclei_he``) is laid
out as::

    <src_root>/manifest.csv   site,id,split,image,mask,height,width,fg_fraction,slide,organ,magnification,source
    <src_root>/TERMS.md       licence terms (research use, no redistribution)
    <src_root>/MoNuSeg/images/TCGA-...-DX1.jpg, MoNuSeg/masks/TCGA-...-DX1.png, TNBC/images/..., ...

``image``/``mask`` are relative to ``src_root``; masks are single-channel 0/255 (255 = nucleus). ``split``
is the official split where the data set has one (MoNuSeg: ``train``/``test``; TNBC: empty) and
``slide`` the patient / source slide. The data are research-licensed, so, as for the retina importer,
no pixel is copied or converted: the importer writes one ``<out_dir>/<site>/datalist.json`` per site
whose entries point at the original files by absolute path, plus ``<out_dir>/site_datalists.json``.

Layouts (``layout``):

* ``"source"`` — one site per data set (the cross-source setting of PathFL-style benchmarks):
  ``MoNuSeg`` and ``TNBC``;
* ``"organ"`` — the MoNuSeg organs as sites (cross-organ). Without ``organs`` the sites are the organs
  with at least ``min_images`` images (default 6: breast, kidney, liver, prostate); such an organ that
  still cannot be split is skipped with a logged reason. Organs named in ``organs`` are taken whatever
  their image count, and one that cannot be split is an error.

Split rules (recorded in each datalist's ``"split_rule"``); images of one ``slide`` never land in two
splits:

* a site with official test images (MoNuSeg; breast, kidney, prostate in the organ layout) keeps its
  official test split; its official training images are divided by slide, seeded, into training and
  validation (``max(1, round(val_fraction * slides))`` validation slides);
* a site without official test images (TNBC; liver in the organ layout) gets a seeded slide-grouped
  training/validation/test split with ``max(1, round(fraction * slides))`` test and validation slides.

Every split must be non-empty, else :class:`DatalistError`. Both data sets are scanned at 40x, so every
datalist declares ``"rescale": 1.0`` (the importer refuses a selection that mixes magnifications) and
``"spatial_mode": "patch"``: nuclei a few to ~30 pixels across are trained on native-resolution patches.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..datalist import SPLITS, DatalistError
from .common import (
    OFFICIAL_TEST, OFFICIAL_TRAIN, OFFICIAL_VAL, RESEARCH_LICENSED_TERMS, check_fractions, check_site_rows, read_manifest, referenced_in_place,
    split_groups, stable_rng, write_site_datalist, write_site_index,
)
from .sources import resolve_source

__all__ = ["import_nuclei", "LAYOUTS", "DEFAULT_NUCLEI_ROOT", "DEFAULT_ORGAN_MIN_IMAGES"]

logger = logging.getLogger(__name__)

#: the nuclei data set's folder under ``$FEDSEG_DATASETS``, read when no source folder is given
#: (:func:`~fedseg.data.importers.sources.resolve_source`)
DEFAULT_NUCLEI_ROOT = "nuclei_he"

LAYOUTS = ("source", "organ")

#: organ layout without ``organs``: organs with at least this many images become sites
DEFAULT_ORGAN_MIN_IMAGES = 6

_REQUIRED_COLUMNS = ("site", "id", "split", "image", "mask", "slide")


def _slide(row: Dict[str, str]) -> str:
    """Grouping key: the row's slide/patient, or its id where the manifest gives none."""
    return row.get("slide") or row["id"]


def _group(rows: List[Dict[str, str]]) -> "OrderedDict[str, List[Dict[str, str]]]":
    """Rows by slide, slides and their rows in id order (so the seeded permutation alone decides)."""
    groups: "OrderedDict[str, List[Dict[str, str]]]" = OrderedDict()
    for row in sorted(rows, key=lambda r: (_slide(r), r["id"])):
        groups.setdefault(_slide(row), []).append(row)
    return groups


def _split_by_slide(
    where: str, rows: List[Dict[str, str]], rng, fractions: Dict[str, float], splits: Sequence[str]
) -> Dict[str, List[Dict[str, str]]]:
    """Seeded slide-grouped split of ``rows`` into ``splits`` (the first takes the rest)."""
    groups = _group(rows)
    if len(groups) < len(splits):
        raise DatalistError(
            f"{where} has {len(rows)} image(s) from {len(groups)} slide(s); need at least {len(splits)} slides "
            f"for non-empty {'/'.join(splits)} splits (images of one slide stay in one split)"
        )
    try:
        chosen = split_groups(list(groups), rng, fractions, splits)
    except DatalistError as exc:
        raise DatalistError(f"{where}: {exc} (fractions {fractions})") from None
    return {s: [r for g in sorted(chosen[s]) for r in groups[g]] for s in splits}


def _site_splits(
    site: str, rows: List[Dict[str, str]], rng_key: Tuple, seed: int, val_fraction: float, test_fraction: float,
    manifest: Path,
) -> Tuple[Dict[str, List[Dict[str, str]]], str]:
    """Assign a site's rows to training/validation/test; returns (splits, rule text)."""
    where = f"manifest {manifest}: site {site}"
    rng = stable_rng(*rng_key, seed)
    official = [r["split"].lower() for r in rows]
    unknown = sorted(set(official) - OFFICIAL_TRAIN - OFFICIAL_VAL - OFFICIAL_TEST - {""})
    if unknown:
        raise DatalistError(f"{where} has unknown split value(s) {unknown}")
    if any(official) and not all(official):
        raise DatalistError(f"{where} has an official split on some rows but not others; give every row a split or none")
    test = [r for r in rows if r["split"].lower() in OFFICIAL_TEST]
    if test:
        train = [r for r in rows if r["split"].lower() in OFFICIAL_TRAIN]
        val = [r for r in rows if r["split"].lower() in OFFICIAL_VAL]
        if not train:
            raise DatalistError(
                f"{where} has {len(test)} official test image(s) but no official training images to train on"
            )
        shared = sorted({_slide(r) for r in test} & {_slide(r) for r in train + val})
        if shared:
            raise DatalistError(f"{where}: slide(s) {shared} appear in the official test split and in training")
        if val:
            splits = {"training": train, "validation": val, "test": test}
            rule = "official training/validation/test splits kept"
        else:
            parts = _split_by_slide(
                f"{where} (official training images)", train, rng, {"validation": val_fraction}, ("training", "validation")
            )
            splits = {**parts, "test": test}
            n_slides = len(_group(train))
            rule = (
                f"official test split kept ({len(test)} images); official training split ({len(train)} images, "
                f"{n_slides} slides) divided by seeded slide permutation (seed={seed}) into "
                f"{len(parts['training'])} training / {len(parts['validation'])} validation images "
                f"(validation slides = max(1, round({val_fraction} * {n_slides})))"
            )
    else:
        splits = _split_by_slide(
            where, rows, rng, {"validation": val_fraction, "test": test_fraction}, ("training", "validation", "test")
        )
        n_slides = len(_group(rows))
        rule = (
            f"{'no official test split' if any(official) else 'no official split'}: seeded slide permutation "
            f"(seed={seed}) of {n_slides} slides ({len(rows)} images) into test = max(1, round({test_fraction} * n)), "
            f"validation = max(1, round({val_fraction} * n)) slides, training = rest: "
            f"{len(splits['training'])}/{len(splits['validation'])}/{len(splits['test'])} images"
        )
    for split in SPLITS:
        splits[split] = sorted(splits[split], key=lambda r: r["id"])
    return splits, rule + "; images of one slide are never in two splits"


def _entry(row: Dict[str, str], root: Path) -> Dict[str, str]:
    """Datalist entry with absolute paths to the original files (never copies)."""
    entry = {"image": str(root / row["image"]), "label": str(root / row["mask"]), "id": row["id"]}
    entry["slide"] = _slide(row)
    entry["dataset"] = row["site"]
    if row.get("organ"):
        entry["organ"] = row["organ"]
    return entry


def _site_rows(
    rows: List[Dict[str, str]], layout: str, sites: Sequence[str], organs: Optional[Sequence[str]], min_images: int,
    organ_source: str, manifest: Path, log: Callable[[str], None],
) -> Tuple["OrderedDict[str, List[Dict[str, str]]]", bool]:
    """``({site: rows}, explicit)``; ``explicit`` is False for the organ layout's automatic organ choice."""
    out: "OrderedDict[str, List[Dict[str, str]]]" = OrderedDict()
    known_sites = sorted({r["site"] for r in rows})
    if layout == "source":
        for site in sites:
            out[site] = [r for r in rows if r["site"] == site]
            if not out[site]:
                raise DatalistError(f"site {site!r} has no rows in {manifest}; sites there: {known_sites}")
        return out, True
    source_rows = [r for r in rows if r["site"] == organ_source]
    if not source_rows:
        raise DatalistError(f"organ layout: no {organ_source!r} rows in {manifest}; sites there: {known_sites}")
    if any(not r.get("organ") for r in source_rows):
        missing = [r["id"] for r in source_rows if not r.get("organ")]
        raise DatalistError(f"organ layout: {organ_source} row(s) {missing[:5]} in {manifest} have no organ")
    counts: Dict[str, int] = {}
    for r in source_rows:
        counts[r["organ"]] = counts.get(r["organ"], 0) + 1
    if organs:
        unknown = [o for o in organs if o not in counts]
        if unknown:
            raise DatalistError(f"organ(s) {unknown} have no {organ_source} rows in {manifest}; organs there: {counts}")
        chosen = list(dict.fromkeys(organs))
    else:
        chosen = []
        for organ in sorted(counts):
            if counts[organ] >= min_images:
                chosen.append(organ)
            else:
                log(f"organ {organ}: skipped, {counts[organ]} image(s) < min_images={min_images}")
    for organ in chosen:
        out[organ] = [r for r in source_rows if r["organ"] == organ]
    return out, bool(organs)


def import_nuclei(
    src_root: Optional[str | os.PathLike],
    out_dir: str | os.PathLike,
    layout: str = "source",
    seed: int = 0,
    val_fraction: float = 0.15,
    test_fraction: float = 0.2,
    sites: Sequence[str] = ("MoNuSeg", "TNBC"),
    organs: Optional[Sequence[str]] = None,
    min_images: int = DEFAULT_ORGAN_MIN_IMAGES,
    organ_source: str = "MoNuSeg",
    check_files: bool = False,
    log: Optional[Callable[[str], None]] = None,
) -> Dict[str, Path]:
    """Write ``out_dir/<site>/datalist.json`` per site (pointing at the original files) and
    ``out_dir/site_datalists.json``.

    Args:
        src_root: folder with ``manifest.csv`` (see module docstring); ``None``: ``$FEDSEG_DATASETS/nuclei_he``.
        out_dir: where the datalists go; nothing else is written there.
        layout: ``"source"`` (one site per data set in ``sites``) or ``"organ"`` (one site per organ of
            ``organ_source``).
        seed: split seed; the same seed gives identical datalists.
        val_fraction, test_fraction: validation / test share of slides where they are drawn.
        sites: manifest ``site`` values for the source layout, in order.
        organs: organ layout: the organs to import (each must be splittable); default: every organ with
            at least ``min_images`` images, skipping (with a logged reason) one that cannot be split.
        min_images: see ``organs``; ignored for organs named explicitly and for the source layout.
        organ_source: the data set whose organs become sites.
        check_files: also open every image/mask and validate them (size agreement, binary masks) via
            :func:`fedseg.data.datalist.load_datalist`; existence is always checked.
        log: where skip notices go (default: this module's logger at WARNING).

    Returns:
        ``{site: datalist path}`` in site order.

    Raises:
        DatalistError: no source folder (neither ``src_root`` nor ``FEDSEG_DATASETS``), a missing folder,
            missing manifest/columns/files, unknown site or organ, mixed magnifications, or a
            site whose slides cannot fill non-empty training/validation/test splits.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if organs and layout != "organ":
        raise ValueError(f"organs={list(organs)} needs layout='organ'")
    check_fractions(val_fraction, test_fraction)
    log = log or logger.warning
    root = resolve_source(src_root, DEFAULT_NUCLEI_ROOT, "nuclei")
    manifest = root / "manifest.csv"
    required = _REQUIRED_COLUMNS + (("organ",) if layout == "organ" else ())
    rows = read_manifest(root, required=required, what="nuclei")
    per_site, explicit = _site_rows(rows, layout, sites, organs, int(min_images), organ_source, manifest, log)
    # every site is validated before anything is written, so a failure leaves out_dir untouched
    plans = _plan_sites(per_site, root, manifest, layout, seed, val_fraction, test_fraction, explicit, log)
    magnification = _common_magnification([r for site in plans for r in per_site[site]], manifest)
    out: Dict[str, Path] = {}
    for site, (splits, rule) in plans.items():
        fields = {
            "name": f"nuclei-{site}",
            "site": site,
            "layout": layout,
            "datasets": sorted({r["site"] for part in splits.values() for r in part}),
            **referenced_in_place(root, RESEARCH_LICENSED_TERMS, seed),
            "val_fraction": float(val_fraction),
            "test_fraction": float(test_fraction),
            "split_rule": rule,
            "labels": {"0": "background", "1": "nucleus"},
            "spatial_mode": "patch",
            "rescale": 1.0,
        }
        if magnification:
            fields["magnification"] = magnification
        out[site] = write_site_datalist(out_dir, site, fields, splits, lambda r: _entry(r, root), check_files)
    write_site_index(out_dir, out)
    return out


def _plan_sites(
    per_site: Mapping[str, List[Dict[str, str]]], root: Path, manifest: Path, layout: str, seed: int,
    val_fraction: float, test_fraction: float, explicit: bool, log: Callable[[str], None],
) -> "OrderedDict[str, Tuple[Dict[str, List[Dict[str, str]]], str]]":
    """``{site: (splits, rule)}`` (:func:`_site_splits`) for every site of ``per_site`` whose rows check out
    (:func:`~fedseg.data.importers.common.check_site_rows`). A site that cannot be split is an error where the sites
    were named (``explicit``), else skipped with a logged reason; no site left is an error."""
    plans: "OrderedDict[str, Tuple[Dict[str, List[Dict[str, str]]], str]]" = OrderedDict()
    for site, site_rows in per_site.items():
        check_site_rows(site_rows, root, manifest, f"site {site}")
        try:
            plans[site] = _site_splits(
                site, site_rows, ("nuclei", layout, site), seed, val_fraction, test_fraction, manifest
            )
        except DatalistError as exc:
            if explicit:
                raise
            log(f"organ {site}: skipped, {exc}")
    if not plans:
        raise DatalistError(f"no site of the {layout} layout could be split (see the skip notices); try organs=...")
    return plans


def _common_magnification(rows: List[Dict[str, str]], manifest: Path) -> str:
    """The one scanning magnification of the imported ``rows`` (``""`` where the manifest records none); a mix is a
    :class:`DatalistError`: the datalists declare a fixed rescale of 1.0."""
    mags = sorted({r.get("magnification", "") for r in rows})
    if len(mags) > 1:
        raise DatalistError(
            f"manifest {manifest}: the selected images mix magnifications {mags}; a fixed rescale of 1.0 would "
            "be wrong: import them separately or state a rescale per data set"
        )
    return mags[0] if mags else ""
