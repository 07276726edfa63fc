"""A FedEFM phase-1 silo set from real labels that exist, plus the built-in X-ray classes.

The global label space is assembled from the sources given, in this order (each block sorted):

========================  =====================================================  ==========================
class                     what the label is                                       group (never split)
========================  =====================================================  ==========================
``retina/<data set>``     acquisition source of a fundus image: ``DRIVE``,        subject (CHASE_DB1 L/R eyes)
                          ``STARE``, ``CHASE_DB1`` (camera, site, population)
``nuclei/monuseg-<organ>``organ of a MoNuSeg H&E tile (bladder, breast, ...)      slide
``nuclei/tnbc``           a TNBC H&E tile (breast, another centre)                 patient
``arcade/stenosis``,      ARCADE angiogram crop with / without an annotated        angiogram (and its duplicates)
``arcade/no-stenosis``    stenosis (:func:`fedseg.data.importers.xray_angio.arcade_crops`)
``xray/<scanner>/<dev>``  built-in synthetic fluoroscopy: scanner style x device   image
                          (:mod:`fedseg.data.synthetic.xray_builtin`)
========================  =====================================================  ==========================

Classes are dealt to silos by :func:`fedseg.data.silos.assign_classes` with the unseen proportion, and
each class's groups are divided among the silos holding it (:func:`~fedseg.data.silos.make_silos`).
A class needs 3 groups per silo holding it (one per split); classes that cannot be split are dropped
before the final assignment, one at a time, smallest first (dropping a class changes the assignment,
after which others may fit), and listed
under ``"skipped"`` in ``<out>/label_space.json``, which also records every class's source, image and
group counts and the silo assignment.

Real images are referenced in place by absolute path (nothing is copied); ARCADE crops and the built-in
X-ray images are generated under ``<out>`` (a run folder, never the repository).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..datalist import DatalistError, write_json_atomic
from ..silos import assign_classes, make_silos, write_silos
from ..synthetic.files import save_png_atomic, site_seed
from ..synthetic.xray import DEVICES, xray_frame
from ..synthetic.xray_builtin import FOUNDATION_IMAGE_SIZES, FOUNDATION_PER_CLASS, builtin_label_space, scanner_anatomy
from .nuclei import DEFAULT_NUCLEI_ROOT
from .common import check_sources, read_manifest
from .retina import DEFAULT_RETINA_ROOT, retina_subject
from .sources import resolve_source
from .xray_angio import arcade_crops

__all__ = ["retina_items", "nuclei_items", "builtin_xray_items", "build_foundation"]

logger = logging.getLogger(__name__)


def retina_items(src: str | os.PathLike) -> List[Dict[str, str]]:
    """Fundus images labelled by their data set, ``retina/<site>``; group = subject."""
    root = resolve_source(src, DEFAULT_RETINA_ROOT, "retina")
    rows = read_manifest(root, required=("site", "id", "image"), what="retina")
    check_sources([{**r, "mask": r.get("mask") or r["image"]} for r in rows], root, root / "manifest.csv")
    return [
        {"image": str(root / r["image"]), "label": f"retina/{r['site']}", "group": f"{r['site']}/{retina_subject(r['id'])}"}
        for r in rows
    ]


def nuclei_items(src: str | os.PathLike) -> List[Dict[str, str]]:
    """H&E tiles labelled ``nuclei/monuseg-<organ>`` or ``nuclei/tnbc``; group = slide / patient."""
    root = resolve_source(src, DEFAULT_NUCLEI_ROOT, "nuclei")
    rows = read_manifest(root, required=("site", "id", "image", "slide", "organ"), what="nuclei")
    check_sources([{**r, "mask": r.get("mask") or r["image"]} for r in rows], root, root / "manifest.csv")
    items = []
    for r in rows:
        if r["site"] == "TNBC":
            label = "nuclei/tnbc"
        elif r["site"] == "MoNuSeg" and r["organ"]:
            label = f"nuclei/monuseg-{r['organ'].lower()}"
        else:
            raise DatalistError(f"nuclei manifest row {r['site']}/{r['id']}: unknown data set or no organ")
        items.append({"image": str(root / r["image"]), "label": label, "group": f"{r['site']}/{r['slide'] or r['id']}"})
    return items


def builtin_xray_items(
    out: str | os.PathLike, classes: Dict[str, int], seed: int = 0, image_size: int = 96
) -> List[Dict[str, str]]:
    """Render ``{class name: image count}`` built-in ``xray/<scanner>/<device>`` images under ``out/xray_classes``.

    Image ``i`` of a class is a pure function of (scanner, device, i, seed, image_size); existing files are kept.
    """
    folder = Path(out) / "xray_classes"
    folder.mkdir(parents=True, exist_ok=True)
    items = []
    for name, n in classes.items():
        _, scanner, device = name.split("/")
        anatomy = scanner_anatomy(scanner, seed)
        base = site_seed("xray-foundation", scanner, seed)
        for i in range(int(n)):
            path = folder / f"{scanner}_{device}_{image_size}_{i:04d}.png"
            if not path.is_file():
                # stream key 2: distinct from the built-in silos' per-silo streams
                image, _ = xray_frame(np.random.default_rng([base, 2, DEVICES.index(device), i]), image_size, anatomy, device)
                save_png_atomic(image, path)
            items.append({"image": str(path.absolute()), "label": name, "group": path.name})
    return items


def _groups_per_class(items: Sequence[Dict[str, Any]]) -> Dict[str, int]:
    return {c: len(g) for c, g in _group_sets(items).items()}


def _group_sets(items: Sequence[Dict[str, Any]]) -> Dict[str, set]:
    out: Dict[str, set] = {}
    for it in items:
        out.setdefault(it["label"], set()).add(it.get("group", it["image"]))
    return out


def build_foundation(
    out: str | os.PathLike,
    sites: Sequence[str],
    unseen: float = 1.0,
    seed: int = 0,
    retina: Optional[str | os.PathLike] = None,
    nuclei: Optional[str | os.PathLike] = None,
    arcade: Optional[str | os.PathLike] = None,
    xray_scanners: Optional[int] = None,
    profile: str = "default",
    n_per_class: Optional[int] = None,
    arcade_limit: Optional[int] = None,
    log: Optional[Callable[[str], None]] = None,
) -> Dict[str, Path]:
    """Assemble and write a phase-1 silo set; returns ``{site: classification datalist path}``.

    Args:
        out: output folder: ``<out>/<site>/datalist.json``, ``site_datalists.json``, ``label_space.json``,
            generated ARCADE crops and built-in X-ray images.
        sites: silo names.
        unseen: unseen proportion (1.0 = disjoint label sets).
        retina, nuclei, arcade: source folders (each with ``manifest.csv``); None leaves a source out.
        xray_scanners: scanner styles of built-in X-ray classes (4 classes each); default ``len(sites)``,
            0 for none.
        profile: image size and images per class and silo of the built-in classes.
        n_per_class: built-in images per class and silo holding it (>= 3).
        arcade_limit: use only the first angiograms of ARCADE (quick checks).

    Raises:
        ValueError: no classes at all, or too few left for every silo to hold two.
    """
    log = log or logger.info
    sites = list(sites)
    items: List[Dict[str, Any]] = []
    source_of: Dict[str, str] = {}
    for name, src, fn in (
        ("retina", retina, retina_items),
        ("nuclei", nuclei, nuclei_items),
        ("arcade", arcade, lambda s: arcade_crops(s, out, seed=seed, limit=arcade_limit, log=log)),
    ):
        if src is None:
            continue
        got = fn(src)
        items.extend(got)
        source_of.update({it["label"]: f"{name}: {Path(src).absolute()}" for it in got})
    n_scanners = len(sites) if xray_scanners is None else int(xray_scanners)
    xray_classes = builtin_label_space(n_scanners) if n_scanners > 0 else []
    per_class = int(n_per_class if n_per_class is not None else FOUNDATION_PER_CLASS[profile])
    if per_class < 3:
        raise ValueError(f"n_per_class must be >= 3 (one image per split), got {per_class}")

    real_space = sorted({it["label"] for it in items}, key=lambda c: (["retina", "nuclei", "arcade"].index(c.split("/")[0]), c))
    groups = _groups_per_class(items)
    skipped: Dict[str, str] = {}
    space = real_space + xray_classes
    while True:
        if not space:
            raise ValueError("no classes: give at least one source or built-in X-ray scanners")
        assignment = assign_classes(space, len(sites), unseen, seed)
        holders = Counter(c for held in assignment for c in held)
        bad = [c for c in real_space if c in space and groups[c] < 3 * holders[c]]
        if not bad:
            break
        # drop the smallest failing class only: the assignment changes, and others may then fit
        c = min(bad, key=lambda name: (groups[name], name))
        skipped[c] = f"{groups[c]} group(s), need {3 * holders[c]} (3 per silo holding it)"
        log(f"foundation: class {c} skipped: {skipped[c]}")
        space = [name for name in space if name != c]

    size = FOUNDATION_IMAGE_SIZES[profile]
    holders = Counter(c for held in assignment for c in held)
    items.extend(builtin_xray_items(out, {c: per_class * holders[c] for c in xray_classes}, seed=seed, image_size=size))
    for c in xray_classes:
        source_of[c] = f"built-in synthetic X-ray ({size} px)"
    items = [it for it in items if it["label"] in space]
    silos = make_silos(items, sites, unseen=unseen, seed=seed, label_space=space)
    paths = write_silos(silos, out)
    counts = Counter(it["label"] for it in items)
    group_counts = _groups_per_class(items)
    write_json_atomic(
        Path(out) / "label_space.json",
        {
            "label_space": space,
            "unseen": float(unseen),
            "seed": int(seed),
            "classes": {c: {"source": source_of[c], "images": counts[c], "groups": group_counts[c]} for c in space},
            "assignment": {s: d["classes"] for s, d in silos.items()},
            "skipped": skipped,
        },
    )
    return paths
