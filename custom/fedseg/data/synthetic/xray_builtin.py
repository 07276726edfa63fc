"""Built-in FedEFM data: phase-1 X-ray classification silos and phase-2 device segmentation sites.

Phase 1 (foundation training) — :func:`builtin_foundation_silos`. The global label space is
``xray/<scanner>/<device>``: ``n_scanners`` scanner styles (default: one per site) times the four
device classes of :data:`~fedseg.data.synthetic.xray.DEVICES` (``none``, ``catheter``, ``guidewire``,
``both``), e.g. 3 x 4 = 12 classes for 3 sites, scanner-major::

    xray/scanner-1/none, xray/scanner-1/catheter, ..., xray/scanner-3/both

A classifier must tell the acquisition style (contrast, dose/noise, device thickness, background)
*and* the device. Classes are given to silos by :func:`fedseg.data.silos.assign_classes` with the
unseen proportion (1.0 = disjoint label sets). Every image is a pure function of
``(scanner, device, silo, index, seed, profile, image_size)``: scanner ``k``'s appearance is drawn
from ``crc32("xray-foundation/scanner-k/<seed>")`` and image ``i`` of a class in silo ``site`` from
its own RNG stream, so a site process given ``only_site`` generates only its own silo and still
agrees byte for byte with a full generation, and on the label space. A class shared by several silos
gets different images in each.

Phase 2 (downstream) — :func:`builtin_downstream_sites`: catheter/guidewire segmentation sites whose
scanner styles come from ``crc32("xray-downstream/<site>/<seed>")``, a seed domain phase 1 never
draws from, so the downstream data are unseen by the foundation model in appearance as well as in
images.

:func:`builtin_probe_sites` is the downstream classification probe: the four device classes
(``device/<device>``) on the downstream sites' scanner styles, other images than the segmentation sites.

Layouts::

    out_dir/<site>/images/c03_007.png   phase 1: grey uint8 (H, W); class 3, image 7
    out_dir/<site>/datalist.json        {"task": "classification", "label_space": [...], "classes": [...], ...}
    out_dir/<site>/images/000.png, labels/000.png, datalist.json   phase 2 (segmentation, masks {0, 255})
    out_dir/site_datalists.json         {site: datalist path} (not written for an only_site call)

Datalists are written last and carry a fingerprint; a call that finds a complete folder with the same
fingerprint reuses it.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..datalist import SPLITS, write_json_atomic
from ..silos import assign_classes, classification_datalist
from .families import GENERATOR_VERSION
from .files import (check_site_name, existing_datalist, generator_fields, prepare_site_folder, save_png_atomic,
                    seeded_splits, site_fingerprint, site_seed, split_counts)
from .xray import DEVICES, SEGMENTATION_DEVICES, TARGETS, XRAY_IMAGE_SIZES, draw_xray_anatomy, xray_frame

__all__ = [
    "FOUNDATION_IMAGE_SIZES",
    "FOUNDATION_PER_CLASS",
    "DOWNSTREAM_NUM_IMAGES",
    "scanner_names",
    "builtin_label_space",
    "builtin_assignment",
    "scanner_anatomy",
    "builtin_foundation_silos",
    "builtin_downstream_sites",
    "probe_label_space",
    "builtin_probe_sites",
]

#: bump when the phase-1/phase-2 layout or pixels change (with GENERATOR_VERSION in the fingerprint)
BUILTIN_VERSION = 1

#: phase-1 frame size per profile: classification needs less resolution than device segmentation
FOUNDATION_IMAGE_SIZES: Dict[str, int] = {"tiny": 64, "default": 96, "paper": 224}

#: phase-1 images per class and silo (>= 3: one per split). `default` 96: with 12 or 32 training images per class
#: the tiny ViT memorises its silo (noise included) and stays near chance on validation; 48 generalise (benchmarks/fedefm/vit_from_scratch.py)
FOUNDATION_PER_CLASS: Dict[str, int] = {"tiny": 4, "default": 96, "paper": 120}

#: phase-2 images per site
DOWNSTREAM_NUM_IMAGES: Dict[str, int] = {"tiny": 6, "default": 40, "paper": 200}

_FOUNDATION_DOMAIN = "xray-foundation"
_DOWNSTREAM_DOMAIN = "xray-downstream"


def scanner_names(n_scanners: int) -> List[str]:
    """``["scanner-1", ..., "scanner-N"]``."""
    if int(n_scanners) != n_scanners or n_scanners < 1:
        raise ValueError(f"n_scanners must be a positive integer, got {n_scanners!r}")
    return [f"scanner-{k + 1}" for k in range(int(n_scanners))]


def builtin_label_space(n_scanners: int) -> List[str]:
    """The phase-1 global label space ``xray/<scanner>/<device>``, scanner-major."""
    return [f"xray/{scanner}/{device}" for scanner in scanner_names(n_scanners) for device in DEVICES]


def builtin_assignment(
    sites: Sequence[str], unseen: float = 1.0, seed: int = 0, n_scanners: Optional[int] = None
) -> Dict[str, List[str]]:
    """``{site: class names}`` of :func:`builtin_foundation_silos` (computed without generating anything)."""
    sites = _check_sites(sites)
    space = builtin_label_space(n_scanners if n_scanners is not None else len(sites))
    return dict(zip(sites, assign_classes(space, len(sites), unseen, seed)))


def scanner_anatomy(scanner: str, seed: int = 0, domain: str = _FOUNDATION_DOMAIN) -> Dict[str, Any]:
    """A scanner style's appearance parameters (:func:`~fedseg.data.synthetic.xray.draw_xray_anatomy`)."""
    return draw_xray_anatomy(np.random.default_rng([site_seed(domain, scanner, seed), 0]))


def _check_sites(sites: Sequence[str], only_site: Optional[str] = None) -> List[str]:
    """The federation's site names as a list: at least one, distinct, each a valid folder name; ``only_site`` (the one
    site a site process generates), where given, must be one of them."""
    sites = list(sites)
    if not sites:
        raise ValueError("need at least one site")
    if len(set(sites)) != len(sites):
        raise ValueError(f"duplicate site names in {sites}")
    for s in sites:
        check_site_name(s)
    if only_site is not None and only_site not in sites:
        raise ValueError(f"only_site {only_site!r} is not one of the sites {sites}")
    return sites


def _profile_value(table: Dict[str, int], profile: str, what: str) -> int:
    """``table[profile]``; an unknown profile is a ``ValueError`` naming ``what`` the table gives."""
    if profile not in table:
        raise ValueError(f"unknown profile {profile!r} for {what}; expected one of {tuple(table)}")
    return table[profile]


def _frame_size(image_size: Optional[int], sizes: Dict[str, int], profile: str) -> int:
    """The frame size in pixels: ``image_size``, else the profile's in ``sizes``; at least 16."""
    size = int(image_size if image_size is not None else _profile_value(sizes, profile, "image size"))
    if size < 16:
        raise ValueError(f"image_size must be >= 16, got {size}")
    return size


def _images_per_class(n_per_class: Optional[int], profile: str) -> int:
    """Images of each class in each site holding it: ``n_per_class``, else the profile's
    (:data:`FOUNDATION_PER_CLASS`); at least 3, one per split."""
    n = int(n_per_class if n_per_class is not None else _profile_value(FOUNDATION_PER_CLASS, profile, "images per class"))
    if n < 3:
        raise ValueError(f"n_per_class must be >= 3 (one image per split), got {n}")
    return n


def _classification_site(
    folder: Path,
    name: str,
    classes: List[str],
    label_space: List[str],
    fingerprint: Dict[str, Any],
    n_per_class: int,
    split_fractions: Sequence[float],
    render: Callable[[str, int], np.ndarray],
    scanners: Dict[str, Dict[str, Any]],
) -> Path:
    """Write ``n_per_class`` images of each class (``render(class name, index) -> uint8 image``), split per
    class (the first images train), and the classification datalist; reuse a complete folder."""
    datalist_path = folder / "datalist.json"
    if existing_datalist(datalist_path, fingerprint, keys=("image",)):
        return datalist_path
    prepare_site_folder(folder, folders=("images",))
    n_train, n_val, _ = split_counts(n_per_class, split_fractions)
    splits: Dict[str, List[Dict[str, Any]]] = {s: [] for s in SPLITS}
    for cls in classes:
        ci = label_space.index(cls)
        for i in range(n_per_class):
            rel = f"images/c{ci:02d}_{i:03d}.png"
            save_png_atomic(render(cls, i), folder / rel)
            split = "training" if i < n_train else "validation" if i < n_train + n_val else "test"
            splits[split].append({"image": rel, "label": ci})
    datalist = classification_datalist(
        label_space,
        classes,
        splits,
        name=name,
        **{k: v for k, v in fingerprint.items() if k not in ("split_fractions", "label_space", "classes")},
        fingerprint=fingerprint,
        scanners=scanners,
        spatial_mode="resize",
    )
    return write_json_atomic(datalist_path, datalist)


def _foundation_silo(
    out_dir: Path,
    site: str,
    classes: List[str],
    label_space: List[str],
    common: Dict[str, Any],
    n_per_class: int,
    size: int,
    split_fractions: Sequence[float],
) -> Path:
    """Generate one phase-1 silo: ``n_per_class`` images of each of its classes, split per class."""
    seed = common["seed"]
    scanners = sorted({c.split("/")[1] for c in classes})
    anatomies = {s: scanner_anatomy(s, seed) for s in scanners}
    site_key = zlib.crc32(site.encode("utf-8"))

    def render(cls: str, i: int) -> np.ndarray:
        _, scanner, device = cls.split("/")
        base = site_seed(_FOUNDATION_DOMAIN, scanner, seed)
        # one stream per (scanner, device, silo, image): independent of which other classes the silo holds
        rng = np.random.default_rng([base, 1, DEVICES.index(device), site_key, i])
        return xray_frame(rng, size, anatomies[scanner], device)[0]

    fingerprint = {**common, "site": site, "classes": classes}
    return _classification_site(
        out_dir / site, f"fedseg-xray-foundation-{site}", classes, label_space, fingerprint, n_per_class,
        split_fractions, render, anatomies,
    )


def builtin_foundation_silos(
    out_dir: str | os.PathLike,
    sites: Sequence[str],
    unseen: float = 1.0,
    seed: int = 0,
    profile: str = "default",
    n_per_class: Optional[int] = None,
    only_site: Optional[str] = None,
    n_scanners: Optional[int] = None,
    image_size: Optional[int] = None,
    split_fractions: Sequence[float] = (0.5, 0.25, 0.25),
) -> Dict[str, Path]:
    """Generate (or reuse) the built-in phase-1 classification silos.

    Args:
        out_dir: root folder; silo ``site`` goes to ``out_dir/<site>/``.
        sites: every silo of the federation, in the same order in every process (silo ``k`` gets
            :func:`~fedseg.data.silos.assign_classes`'s list ``k``).
        unseen: unseen proportion in [0, 1] (1.0 = disjoint label sets).
        seed: federation seed.
        profile: ``tiny`` / ``default`` / ``paper``: image size (:data:`FOUNDATION_IMAGE_SIZES`) and
            images per class (:data:`FOUNDATION_PER_CLASS`).
        n_per_class: images of each class in each silo holding it (>= 3); default from the profile.
        only_site: generate only this silo (a site process); the label space and its silo are
            identical to a full generation's.
        n_scanners: scanner styles in the label space; default ``len(sites)``.
        image_size: frame size in pixels (>= 16), default from the profile.
        split_fractions: per class, fractions for training/validation/test (each split non-empty).

    Returns:
        ``{site: datalist path}`` for every site, or for ``only_site`` alone. A full generation also
        writes ``out_dir/site_datalists.json``.
    """
    sites = _check_sites(sites, only_site)
    size = _frame_size(image_size, FOUNDATION_IMAGE_SIZES, profile)
    n = _images_per_class(n_per_class, profile)
    split_counts(n, split_fractions)  # validates the fractions before any file is written
    label_space = builtin_label_space(n_scanners if n_scanners is not None else len(sites))
    assignment = dict(zip(sites, assign_classes(label_space, len(sites), unseen, seed)))
    common = {
        "generator_version": GENERATOR_VERSION,
        "builtin_version": BUILTIN_VERSION,
        "seed": int(seed),
        "profile": profile,
        "image_size": size,
        "n_per_class": n,
        "unseen": float(unseen),
        "split_fractions": [float(f) for f in split_fractions],
        "label_space": label_space,
    }
    out = Path(out_dir)
    todo = [only_site] if only_site is not None else sites
    paths = {s: _foundation_silo(out, s, assignment[s], label_space, common, n, size, split_fractions) for s in todo}
    if only_site is None:
        write_json_atomic(out / "site_datalists.json", {s: str(p.resolve()) for s, p in paths.items()})
    return paths


def builtin_downstream_sites(
    out_dir: str | os.PathLike,
    sites: Sequence[str],
    seed: int = 0,
    profile: str = "default",
    target: str = "device",
    num_images: Optional[int] = None,
    image_size: Optional[int] = None,
    only_site: Optional[str] = None,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
) -> Dict[str, Path]:
    """Generate (or reuse) phase-2 segmentation sites from scanner styles phase 1 never used.

    Args:
        out_dir: root folder; site ``site`` goes to ``out_dir/<site>/``.
        sites: downstream site names; each has its own scanner style (seed domain ``xray-downstream``).
        target: the mask: ``device`` (catheter and guidewire), ``catheter``, ``guidewire`` or ``vessel``.
            Frames show devices that the target can see (a catheter target draws ``catheter``/``both``
            frames, a guidewire target ``guidewire``/``both``), so no mask is empty; ``vessel`` frames
            show any device or none.
        num_images: images per site (>= 3), default :data:`DOWNSTREAM_NUM_IMAGES` of the profile.
        image_size: frame size, default :data:`~fedseg.data.synthetic.xray.XRAY_IMAGE_SIZES` of the profile.
        only_site: generate only this site.

    Returns:
        ``{site: datalist path}``; segmentation datalists (``image``/``label``, ``"spatial_mode": "patch"``).
    """
    sites = _check_sites(sites, only_site)
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    devices = {
        "device": SEGMENTATION_DEVICES,
        "catheter": ("catheter", "both"),
        "guidewire": ("guidewire", "both"),
        "vessel": DEVICES,
    }[target]
    size = _frame_size(image_size, XRAY_IMAGE_SIZES, profile)
    n = int(num_images if num_images is not None else _profile_value(DOWNSTREAM_NUM_IMAGES, profile, "image count"))
    n_train, n_val, n_test = split_counts(n, split_fractions)
    out = Path(out_dir)
    paths: Dict[str, Path] = {}
    for site in [only_site] if only_site is not None else sites:
        folder = out / site
        datalist_path = folder / "datalist.json"
        fingerprint = site_fingerprint({"generator_version": GENERATOR_VERSION, "builtin_version": BUILTIN_VERSION},
                                       site, seed, profile, split_fractions, image_size=size, num_images=n, target=target)
        if existing_datalist(datalist_path, fingerprint):
            paths[site] = datalist_path
            continue
        prepare_site_folder(folder)
        anatomy = scanner_anatomy(site, seed, domain=_DOWNSTREAM_DOMAIN)
        base = site_seed(_DOWNSTREAM_DOMAIN, site, seed)
        names = [f"{i:03d}.png" for i in range(n)]
        for i, name in enumerate(names):
            rng = np.random.default_rng([base, 1, i])
            device = devices[int(rng.integers(len(devices)))]
            image, masks = xray_frame(rng, size, anatomy, device)
            save_png_atomic(image, folder / "images" / name)
            save_png_atomic(masks[target].astype(np.uint8) * 255, folder / "labels" / name)
        datalist = {
            "name": f"fedseg-xray-downstream-{site}",
            **generator_fields(fingerprint),
            "anatomy": anatomy,
            "labels": {"0": "background", "1": target},
            "spatial_mode": "patch",
            **seeded_splits(names, base, (n_train, n_val, n_test)),
        }
        paths[site] = write_json_atomic(datalist_path, datalist)
    if only_site is None:
        write_json_atomic(out / "site_datalists.json", {s: str(p.resolve()) for s, p in paths.items()})
    return paths


def probe_label_space() -> List[str]:
    """The downstream classification probe's label space: ``device/<device>``."""
    return [f"device/{device}" for device in DEVICES]


def builtin_probe_sites(
    out_dir: str | os.PathLike,
    sites: Sequence[str],
    seed: int = 0,
    profile: str = "default",
    n_per_class: Optional[int] = None,
    image_size: Optional[int] = None,
    only_site: Optional[str] = None,
    split_fractions: Sequence[float] = (0.5, 0.25, 0.25),
) -> Dict[str, Path]:
    """Downstream classification probe: device classes (:func:`probe_label_space`) on the downstream
    sites' scanner styles (the same style as :func:`builtin_downstream_sites` for a site of the same
    name, other images). Every site holds all four classes, ``n_per_class`` images each.

    Returns:
        ``{site: classification datalist path}`` under ``out_dir/<site>/`` (and ``site_datalists.json``
        for a full generation).
    """
    sites = _check_sites(sites, only_site)
    size = _frame_size(image_size, FOUNDATION_IMAGE_SIZES, profile)
    n = _images_per_class(n_per_class, profile)
    split_counts(n, split_fractions)
    space = probe_label_space()
    out = Path(out_dir)
    paths: Dict[str, Path] = {}
    for site in [only_site] if only_site is not None else sites:
        anatomy = scanner_anatomy(site, seed, domain=_DOWNSTREAM_DOMAIN)
        base = site_seed(_DOWNSTREAM_DOMAIN, site, seed)

        def render(cls: str, i: int, base: int = base, anatomy: Dict[str, Any] = anatomy) -> np.ndarray:
            device = cls.split("/")[1]
            # stream key 3: other images than the downstream segmentation site's (key 1)
            return xray_frame(np.random.default_rng([base, 3, DEVICES.index(device), i]), size, anatomy, device)[0]

        fingerprint = {
            "generator_version": GENERATOR_VERSION,
            "builtin_version": BUILTIN_VERSION,
            "site": site,
            "seed": int(seed),
            "profile": profile,
            "image_size": size,
            "n_per_class": n,
            "split_fractions": [float(f) for f in split_fractions],
            "label_space": space,
            "classes": space,
        }
        paths[site] = _classification_site(
            out / site, f"fedseg-xray-probe-{site}", space, space, fingerprint, n, split_fractions, render, {site: anatomy}
        )
    if only_site is None:
        write_json_atomic(out / "site_datalists.json", {s: str(p.resolve()) for s, p in paths.items()})
    return paths
