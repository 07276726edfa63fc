"""Importers for real X-ray angiography data: DCA1 vessel segmentation and ARCADE stenosis crops.

The source folder (the caller's ``src``, the CLI's ``--src``; else ``$FEDSEG_DATASETS/xray_angio``) is laid out as::

    <src_root>/manifest.csv   site,id,split,image,mask,height,width,fg_fraction,task,source[,patient]
    <src_root>/TERMS.md       research use only; cite the papers
    <src_root>/DCA1/images/train_01.png, DCA1/masks/train_01.png, ARCADE/images/train_0001.jpg, ...

* :func:`import_dca1` — DCA1's 40 coronary angiograms (300 x 300 grey) with expert vessel masks as
  FedEFM's real downstream segmentation data. Nothing is copied: datalists point at the original
  files by absolute path. Every mask is checked to be binary ({0, 255} or {0, 1}) and its foreground
  fraction is compared with the manifest's ``fg_fraction`` (an independent record of the same mask), so
  a changed or mis-paired mask is caught at import. Images go to sites and splits by *patient* when the
  manifest has a ``patient`` column, else image by image (DCA1's public release names no patients).
* :func:`arcade_crops` — ARCADE's stenosis annotations turned into a two-class classification
  source: each angiogram gives crops of one class only, alternating over angiograms (so the classes
  stay balanced and one angiogram's crops, a patient's, never span two silos or splits):
  ``arcade/stenosis`` crops centred (with seeded jitter) on its largest annotated stenoses, or
  ``arcade/no-stenosis`` crops that contain no stenosis pixel and (almost) no
  collimator border, chosen among seeded candidates for the most vessel signal (black top-hat: thin dark
  contrast-filled structures) so that "absent" crops show vessels too rather than empty background. Crops are *derived images*: they are written under
  ``out_dir`` (a run folder, never the repository). Images with an empty mask (no stenosis annotated,
  so absence is not established) are skipped, and pixel-identical duplicates (the source has some,
  even across its train/val split) share one group so that they never land in two silos or splits.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from scipy import ndimage

from ..datalist import SPLITS, DatalistError, read_array, validate_pair
from .common import (
    check_fractions, check_site_rows, read_manifest, referenced_in_place, split_groups, stable_rng, write_site_datalist,
    write_site_index,
)
from .sources import resolve_source

__all__ = [
    "DEFAULT_XRAY_ANGIO_ROOT",
    "ARCADE_CLASSES",
    "import_dca1",
    "arcade_crops",
]

logger = logging.getLogger(__name__)

#: the X-ray angiography data set's folder under ``$FEDSEG_DATASETS``, read when no source folder is given
#: (:func:`~fedseg.data.importers.sources.resolve_source`)
DEFAULT_XRAY_ANGIO_ROOT = "xray_angio"

#: the two classes ARCADE contributes to a phase-1 label space
ARCADE_CLASSES = ("arcade/no-stenosis", "arcade/stenosis")

_REQUIRED = ("site", "id", "split", "image", "mask")

#: |mask foreground fraction - manifest fg_fraction| allowed (the manifest rounds to 4-5 digits)
_FG_TOLERANCE = 1e-4


def _rows(root: Path, site: str) -> List[Dict[str, str]]:
    rows = [r for r in read_manifest(root, required=_REQUIRED, what="xray_angio") if r["site"] == site]
    if not rows:
        raise DatalistError(f"no {site} rows in {root / 'manifest.csv'}")
    check_site_rows(rows, root, root / "manifest.csv", site)
    return rows


def _check_mask(row: Dict[str, str], root: Path) -> float:
    """Image/mask agree in size, the mask is binary and matches the manifest's fg_fraction; returns it."""
    info = validate_pair(root / row["image"], root / row["mask"])
    fg = info["foreground_fraction"]
    if row.get("fg_fraction"):
        recorded = float(row["fg_fraction"])
        if abs(fg - recorded) > _FG_TOLERANCE:
            raise DatalistError(
                f"mask {root / row['mask']} has foreground fraction {fg:.5f} but the manifest records {recorded}; "
                "the mask changed or is paired with the wrong image"
            )
    return fg


def import_dca1(
    src: Optional[str | os.PathLike],
    out: str | os.PathLike,
    sites: Sequence[str] = ("DCA1",),
    seed: int = 0,
    val_fraction: float = 0.15,
    test_fraction: float = 0.25,
    limit: Optional[int] = None,
) -> Dict[str, Path]:
    """Write segmentation datalists for DCA1, divided among ``sites``; returns ``{site: datalist path}``.

    Args:
        src: folder with ``manifest.csv`` (DCA1 rows) and the files it lists; ``None``: ``$FEDSEG_DATASETS/xray_angio``.
        out: datalists go to ``out/<site>/datalist.json`` (and ``out/site_datalists.json``).
        sites: site names; the groups (patients, else images) are dealt to sites by a seeded permutation.
        seed: division and split seed.
        val_fraction, test_fraction: per site, ``max(1, round(f * groups))`` groups each; training the rest.
        limit: use only the first ``limit`` images in id order (quick checks).

    Raises:
        DatalistError: no source folder (neither ``src`` nor ``FEDSEG_DATASETS``), a missing folder, missing
            files, a non-binary or changed mask, or a site with fewer than 3 groups.
    """
    check_fractions(val_fraction, test_fraction)
    sites = list(sites)
    if not sites or len(set(sites)) != len(sites):
        raise ValueError(f"need distinct site names, got {sites}")
    root = resolve_source(src, DEFAULT_XRAY_ANGIO_ROOT, "xray_angio")
    rows = sorted(_rows(root, "DCA1"), key=lambda r: r["id"])
    if limit is not None:
        rows = rows[: int(limit)]
    for row in rows:
        _check_mask(row, root)
    by_patient = any(r.get("patient") for r in rows)
    if by_patient and not all(r.get("patient") for r in rows):
        raise DatalistError(f"manifest {root / 'manifest.csv'}: some DCA1 rows name a patient and others do not")
    groups: "OrderedDict[str, List[Dict[str, str]]]" = OrderedDict()
    for r in rows:
        groups.setdefault(r["patient"] if by_patient else r["id"], []).append(r)
    keys = list(groups)
    order = [keys[i] for i in stable_rng("dca1", "sites", seed).permutation(len(keys))]
    unit = "patients" if by_patient else "images"
    plans = {}
    for k, site in enumerate(sites):
        share = sorted(order[k :: len(sites)])
        if len(share) < 3:
            raise DatalistError(
                f"DCA1 site {site!r} gets {len(share)} {unit} ({len(keys)} for {len(sites)} sites); need >= 3 for "
                "non-empty training/validation/test splits"
            )
        chosen = split_groups(
            share, stable_rng("dca1", site, seed), {"validation": val_fraction, "test": test_fraction},
            ("training", "validation", "test"),
        )
        plans[site] = {s: [r for g in sorted(chosen[s]) for r in groups[g]] for s in SPLITS}
    paths: Dict[str, Path] = {}
    for site, splits in plans.items():
        rule = (
            f"seeded permutation (seed={seed}) of {len(keys)} {unit} dealt round-robin to {len(sites)} site(s); "
            f"per site test = max(1, round({test_fraction} * n)), validation = max(1, round({val_fraction} * n)), "
            f"training = rest: {'/'.join(str(len(splits[s])) for s in SPLITS)} images"
            + ("; images of one patient are never in two splits or sites" if by_patient else
               "; the manifest names no patients, so the split is image-level")
        )
        fields = {
            "name": f"dca1-{site}",
            "site": site,
            **referenced_in_place(root, "DCA1: research use, cite Cervantes-Sanchez et al. 2019; referenced in place, "
                                        "never copied", seed),
            "split_rule": rule,
            "labels": {"0": "background", "1": "vessel"},
            "spatial_mode": "patch",
            "rescale": 1.0,
        }
        paths[site] = write_site_datalist(
            out, site, fields, splits,
            lambda r: {"image": str(root / r["image"]), "label": str(root / r["mask"]), "id": r["id"]},
        )
    write_site_index(out, paths)
    return paths


def _crop_box(cy: float, cx: float, size: int, shape: Tuple[int, int]) -> Tuple[int, int]:
    """Top-left corner of a ``size`` window centred near (cy, cx), kept inside the image."""
    y0 = int(round(cy - size / 2))
    x0 = int(round(cx - size / 2))
    return min(max(0, y0), shape[0] - size), min(max(0, x0), shape[1] - size)


def _absent_box(
    rng: np.random.Generator, vesselness: np.ndarray, outside: np.ndarray, lesion: np.ndarray, size: int,
    taken: List[Tuple[int, int]], candidates: int = 48,
) -> Optional[Tuple[int, int]]:
    """A window with no stenosis pixel (mask dilated by 4 px), at most 5 % outside the collimated field,
    not overlapping an earlier one by more than half, with the most vessel signal among seeded candidates."""
    h, w = vesselness.shape
    blocked = ndimage.binary_dilation(lesion, iterations=4)
    best, best_score = None, -1.0
    for _ in range(candidates):
        y0, x0 = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
        window = (slice(y0, y0 + size), slice(x0, x0 + size))
        if blocked[window].any() or outside[window].mean() > 0.05:
            continue
        if any(abs(y0 - ty) < size // 2 and abs(x0 - tx) < size // 2 for ty, tx in taken):
            continue
        score = float(vesselness[window].mean())
        if score > best_score:
            best, best_score = (y0, x0), score
    return best


def _vesselness(image: np.ndarray) -> np.ndarray:
    """Black top-hat (grey closing minus image, 15 px): high on thin dark structures (contrast-filled
    vessels), low on flat regions and on the black collimator border."""
    img = image.astype(np.float32)
    return ndimage.grey_closing(img, size=(15, 15)) - img


def arcade_crops(
    src: Optional[str | os.PathLike],
    out: str | os.PathLike,
    crop_size: int = 128,
    per_image: int = 1,
    seed: int = 0,
    limit: Optional[int] = None,
    log: Optional[Callable[[str], None]] = None,
) -> List[Dict[str, str]]:
    """Stenosis-present/absent crops of ARCADE angiograms, written as PNG under ``out/arcade_crops/``.

    Args:
        src: folder with ``manifest.csv`` (ARCADE rows) and the files it lists; ``None``: ``$FEDSEG_DATASETS/xray_angio``.
        out: output root (a run folder; the crops are derived images and never belong in a repository).
        crop_size: square crop side in pixels (<= the image size).
        per_image: crops per angiogram: its largest stenoses (at most this many) or this many
            stenosis-free windows (not overlapping each other by more than half).
        seed: jitter and candidate-window seed.
        limit: use only the first ``limit`` angiograms in id order (quick checks).
        log: called with a line for each skipped angiogram (default: the module logger).

    Returns:
        Items ``{"image": crop path, "label": class in ARCADE_CLASSES, "group", "id", "box": [y0, x0, size]}`` for
        :func:`fedseg.data.silos.make_silos`; ``group`` is shared by the crops of one angiogram and of
        its pixel-identical duplicates, which all have one class.

    Raises:
        DatalistError: missing files, a non-binary mask, or a mask that disagrees with the manifest.
    """
    log = log or logger.info
    if int(crop_size) != crop_size or crop_size < 16:
        raise ValueError(f"crop_size must be an integer >= 16, got {crop_size!r}")
    if int(per_image) != per_image or per_image < 1:
        raise ValueError(f"per_image must be a positive integer, got {per_image!r}")
    root = resolve_source(src, DEFAULT_XRAY_ANGIO_ROOT, "xray_angio")
    rows = sorted(_rows(root, "ARCADE"), key=lambda r: r["id"])
    if limit is not None:
        rows = rows[: int(limit)]
    folder = Path(out) / "arcade_crops"
    folder.mkdir(parents=True, exist_ok=True)
    digests: Dict[str, str] = {}
    classes: Dict[str, str] = {}  # group -> its class
    items: List[Dict[str, str]] = []
    for row in rows:
        fg = _check_mask(row, root)
        if fg == 0.0:
            log(f"ARCADE {row['id']}: empty stenosis mask (absence not established), skipped")
            continue
        image = read_array(root / row["image"], "image")
        image = image if image.ndim == 2 else image[..., :3].mean(axis=-1).astype(np.uint8)
        if min(image.shape) < crop_size:
            raise ValueError(f"crop_size {crop_size} exceeds ARCADE image {root / row['image']} of shape {image.shape}")
        lesion = read_array(root / row["mask"], "label") > 0
        # duplicates share a group: the first id with these pixels names it
        group = digests.setdefault(hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest(), f"arcade/{row['id']}")
        if group not in classes:
            classes[group] = ARCADE_CLASSES[(len(classes) + int(seed)) % 2]  # alternate over angiograms
        label = classes[group]
        rng = stable_rng("arcade", row["id"], seed)
        boxes: List[Tuple[int, int]] = []
        if label == ARCADE_CLASSES[1]:
            labelled, n = ndimage.label(lesion)
            sizes = ndimage.sum(lesion, labelled, index=range(1, n + 1))
            centres = ndimage.center_of_mass(lesion, labelled, index=range(1, n + 1))
            for comp in np.argsort(-np.asarray(sizes))[: int(per_image)]:
                jitter = rng.uniform(-crop_size / 4, crop_size / 4, size=2)
                boxes.append(_crop_box(centres[comp][0] + jitter[0], centres[comp][1] + jitter[1], crop_size, image.shape))
        else:
            vesselness = _vesselness(image)
            outside = ndimage.uniform_filter(image.astype(np.float32), size=9) < 12  # collimator: near-black
            for _ in range(int(per_image)):
                box = _absent_box(rng, vesselness, outside, lesion, crop_size, boxes)
                if box is None:
                    log(f"ARCADE {row['id']}: no stenosis-free window of {crop_size} px found")
                    break
                boxes.append(box)
        for rank, (by, bx) in enumerate(boxes):
            crop = image[by : by + crop_size, bx : bx + crop_size]
            name = f"{row['id']}_{rank}_{label.split('/')[1]}.png"
            Image.fromarray(np.ascontiguousarray(crop)).save(folder / name)
            items.append({"image": str((folder / name).absolute()), "label": label, "group": group,
                          "id": f"{row['id']}/{rank}", "box": [int(by), int(bx), int(crop_size)]})
    if not items:
        raise DatalistError(f"no ARCADE crops could be made from {root / 'manifest.csv'}")
    return items
