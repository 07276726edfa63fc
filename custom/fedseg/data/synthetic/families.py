"""Built-in synthetic multi-site segmentation data: real PNG files plus a decathlon-style datalist.

Three families stand in for the benchmark domains when the licensed data is not available:

* ``"vessel"`` — retina-fundus-like images: a dark orange/red fundus inside a circular field of
  view (FOV) on black, a bright optic disc, a darker macula, and branching vessel trees grown from
  the disc (random walks with tapering width). Vessels cover roughly 5-15 % of the FOV.
* ``"polyp"`` — endoscopy-like images: pink/red mucosa with folds, vignetting and specular
  highlights; 1-3 irregular blob lesions with their own tint and texture (3-30 % of the image).
* ``"nuclei"`` — H&E-histology-like images (:mod:`fedseg.data.synthetic.nuclei`): pink fibrous stroma
  and purple-blue nuclei of varied size, shape and clustering, rendered with a per-site stain colour
  (Beer-Lambert hematoxylin/eosin optical densities) and magnification; nuclei cover 10-35 %.
* ``"fundus"`` — optic-disc crops with a three-class label (:mod:`fedseg.data.synthetic.fundus`): background,
  neuroretinal rim and optic cup inside the disc, stored 255 / 128 / 0 as the public OD/OC sets store them;
  per-site colour, illumination, disc size and cup-to-disc ratio. The datalist declares the label space
  (``labels``, ``label_values``, ``regions``: disc = rim + cup).
* ``"xray"`` — endovascular fluoroscopy-like grey frames (:mod:`fedseg.data.synthetic.xray`): tissue
  gradient, bones, dark contrast-filled vessel trees and a catheter and/or guidewire; the mask is the
  device. Per-site contrast, dose (noise) and device thickness; larger native frames (64/256/512 px).

Each site draws a *scanner style* (per-channel gain, brightness, contrast, gamma, blur, noise) and
an *anatomy* (vessel width/branching, lesion size/shape, or stain and nucleus size) from its own RNG,
so sites differ in a
measurable way (mean colour, foreground fraction, image count) — the feature-shift non-IID setting
federated segmentation methods are built for.

Everything is a pure function of ``(family, site, seed, profile, image_size, num_images,
split_fractions)``: the per-site RNG is seeded from ``zlib.crc32`` of ``"family/site/seed"``
(Python's ``hash()`` is salted per process), so every site process of a federation regenerates
byte-identical files independently.

Layout written by :func:`generate_site_data`::

    out_dir/<family>/<site>/images/000.png   RGB uint8, (H, W, 3); grey (H, W) for "xray"
    out_dir/<family>/<site>/labels/000.png   single-channel uint8, values {0, 255}, (H, W) (fundus: {0, 128, 255})
    out_dir/<family>/<site>/datalist.json    written last; its presence marks a complete folder
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

from ..datalist import write_json_atomic
from .files import (check_site_name, existing_datalist, generator_fields, numbered_names,  # noqa: F401
                    prepare_site_folder, remove_stale_files, save_png_atomic, seeded_splits, site_fingerprint,
                    site_seed, split_counts)
from .drawing import apply_style, grow_vessel_trees, round_param, smooth_noise, to_uint8
# NUCLEI_FRACTION_BAND is re-exported next to the other families' bands
from .nuclei import NUCLEI_FRACTION_BAND, draw_nuclei_anatomy, nuclei_image  # noqa: F401
from .xray import XRAY_IMAGE_SIZES, draw_xray_anatomy, xray_image

__all__ = [
    "GENERATOR_VERSION",
    "FAMILIES",
    "PROFILES",
    "generate_site_data",
    "generate_federation",
    "site_seed",
    "family_label_space",
    "POLYP_FRACTION_BAND",
    "VESSEL_FOV_FRACTION_BAND",
]

#: bump whenever the generated pixels or the datalist layout change; part of the cache fingerprint
GENERATOR_VERSION = 1

FAMILIES: Tuple[str, ...] = ("vessel", "polyp", "nuclei", "xray", "fundus")

#: image_size (square, divisible by 16 for a 5-level U-Net) and the per-site image-count range
PROFILES: Dict[str, Dict[str, Any]] = {
    "tiny": {"image_size": 32, "num_images": (8, 14)},
    "default": {"image_size": 96, "num_images": (24, 48)},
    "paper": {"image_size": 384, "num_images": (150, 400)},
    # the papers' resolution with the default image counts: a paper-budget run (200 rounds at 384 px) that fits the
    # minutes a GPU check has (benchmarks/gpu/gpu_check.py)
    "gpu": {"image_size": 384, "num_images": (24, 48)},
}

#: the generated vessel fraction (of the FOV) and lesion fraction (of the image) stay in these bands
VESSEL_FOV_FRACTION_BAND = (0.05, 0.15)
POLYP_FRACTION_BAND = (0.03, 0.30)


# ----------------------------------------------------------------------------------------------
# seeding
# ----------------------------------------------------------------------------------------------





# ----------------------------------------------------------------------------------------------
# scanner style (shared by both families)
# ----------------------------------------------------------------------------------------------


def _draw_style(rng: np.random.Generator, image_size: int) -> Dict[str, Any]:
    """A site's acquisition style. Blur sigma is in pixels of the generated size."""
    return {
        "gain": [round_param(g) for g in rng.uniform(0.75, 1.25, size=3)],
        "brightness": round_param(rng.uniform(-0.08, 0.08)),
        "contrast": round_param(rng.uniform(0.75, 1.3)),
        "gamma": round_param(rng.uniform(0.75, 1.35)),
        "noise_sigma": round_param(rng.uniform(0.004, 0.035)),
        "blur_sigma": round_param(rng.uniform(0.0, 1.0) * image_size / 96.0),
    }


# ----------------------------------------------------------------------------------------------
# family "vessel"
# ----------------------------------------------------------------------------------------------


def _draw_vessel_anatomy(rng: np.random.Generator) -> Dict[str, Any]:
    """Site-level vessel appearance: width, branching, tortuosity, density, colour."""
    return {
        "vessel_width_scale": round_param(rng.uniform(0.75, 1.35)),
        "branch_prob": round_param(rng.uniform(0.05, 0.14)),
        "tortuosity": round_param(rng.uniform(0.07, 0.2)),
        "vessel_fov_fraction": round_param(rng.uniform(0.07, 0.13)),
        "vessel_contrast": round_param(rng.uniform(0.5, 0.8)),
        "fov_scale": round_param(rng.uniform(0.9, 1.0)),
        "fundus_rgb": [round_param(rng.uniform(0.7, 0.85)), round_param(rng.uniform(0.28, 0.42)), round_param(rng.uniform(0.08, 0.2))],
    }


def _vessel_image(rng: np.random.Generator, size: int, anatomy: Dict[str, Any], style: Dict[str, Any]):
    """One fundus image and its vessel mask.

    Returns:
        image: uint8 (size, size, 3); label: uint8 (size, size) in {0, 255}.
    """
    s = size
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) + 0.5
    cx, cy = s / 2 + rng.normal(0, 0.01 * s), s / 2 + rng.normal(0, 0.01 * s)
    radius = 0.47 * s * anatomy["fov_scale"]
    dist = np.hypot(xx - cx, yy - cy)
    rr = dist / radius
    fov_soft = np.clip(radius - dist + 0.5, 0.0, 1.0)
    fov = dist <= radius

    # optic disc about 0.55 R from the centre on a random side; macula on the opposite side
    side = 1.0 if rng.random() < 0.5 else -1.0
    disc = (cx + side * 0.55 * radius, cy + rng.normal(0, 0.06 * radius))
    disc_r = 0.15 * radius * rng.uniform(0.85, 1.15)
    mac = (cx - side * 0.25 * radius, cy + rng.normal(0, 0.05 * radius))

    # vessel trees drawn supersampled, then box-averaged to a coverage map in [0, 1]
    k = int(max(2, min(8, 512 // s)))
    canvas = Image.new("L", (s * k, s * k), 0)
    draw = ImageDraw.Draw(canvas)
    fov_area = float(fov.sum())
    target = anatomy["vessel_fov_fraction"] * rng.uniform(0.9, 1.1)
    budget = target * fov_area
    coverage = np.zeros((s, s), np.float32)
    label = np.zeros((s, s), bool)
    lo, hi = VESSEL_FOV_FRACTION_BAND
    for attempt in range(4):
        n_trunks = int(rng.integers(4, 7)) if attempt == 0 else 2
        grow_vessel_trees(draw, rng, k, disc, (cx, cy, radius), s, anatomy, budget, n_trunks)
        coverage = np.asarray(canvas, np.float32).reshape(s, k, s, k).mean(axis=(1, 3)) / 255.0
        label = (coverage >= 0.5) & fov
        frac = label.sum() / fov_area
        if frac >= max(lo + 0.01, 0.85 * target):
            break
        # overlaps near the disc ate part of the budget: top up with a few more trunks
        budget = (target - frac) * fov_area
    if label.sum() / fov_area > hi:
        # cannot happen with the budgets above unless the image is tiny; thin to stay in band
        label = label & (coverage >= np.quantile(coverage[label], 1.0 - (hi - 0.01) * fov_area / label.sum()))

    base = np.asarray(anatomy["fundus_rgb"], np.float32) * rng.uniform(0.92, 1.08, size=3).astype(np.float32)
    illum = (1.0 - 0.45 * rr**2) * (1.0 + 0.08 * smooth_noise(rng, (s, s), s / 10))
    texture = 0.04 * smooth_noise(rng, (s, s), s / 40) + 0.02 * smooth_noise(rng, (s, s), 1.0)
    img = base[None, None, :] * (illum + texture)[..., None]
    d_disc = np.hypot(xx - disc[0], yy - disc[1]) / disc_r
    disc_map = np.exp(-(d_disc**4))
    img = img + disc_map[..., None] * np.array([0.22, 0.32, 0.22], np.float32)
    img = img + np.exp(-((d_disc / 0.45) ** 2))[..., None] * np.array([0.08, 0.12, 0.1], np.float32)  # cup
    d_mac = np.hypot(xx - mac[0], yy - mac[1]) / (0.22 * radius)
    img = img * (1.0 - 0.28 * np.exp(-(d_mac**2)))[..., None]
    vessel_rgb = np.array([0.42, 0.1, 0.05], np.float32) * illum[..., None]
    alpha = (anatomy["vessel_contrast"] * coverage)[..., None]
    img = img * (1.0 - alpha) + vessel_rgb * alpha
    img = img * fov_soft[..., None]
    img = apply_style(img, style, rng, pivot=0.35)
    # fundus cameras record black outside the aperture whatever the tone curve; keeping it exactly
    # 0 also makes the FOV recoverable from the image (``image.max(-1) > 0``)
    img = img * fov_soft[..., None]
    return to_uint8(img), (label.astype(np.uint8) * 255)


# ----------------------------------------------------------------------------------------------
# family "polyp"
# ----------------------------------------------------------------------------------------------


def _draw_polyp_anatomy(rng: np.random.Generator) -> Dict[str, Any]:
    """Site-level lesion appearance: size band, irregularity, tint, mucosa colour, highlights."""
    lo = rng.uniform(0.04, 0.1)
    return {
        "lesion_fraction_range": [round_param(lo), round_param(min(0.26, lo + rng.uniform(0.06, 0.16)))],
        "irregularity": round_param(rng.uniform(0.04, 0.16)),
        "lesion_tint": [round_param(t) for t in rng.uniform(-0.1, 0.1, size=3)],
        "lesion_texture": round_param(rng.uniform(1.5, 3.0)),
        "mucosa_rgb": [round_param(rng.uniform(0.72, 0.88)), round_param(rng.uniform(0.36, 0.5)), round_param(rng.uniform(0.32, 0.46))],
        "vignetting": round_param(rng.uniform(0.3, 0.65)),
        "specular_density": round_param(rng.uniform(0.004, 0.015)),
    }


def _blob(rng: np.random.Generator, s: int, area: float, irregularity: float, xx, yy):
    """An ellipse with a Fourier-perturbed radius; returns (mask bool (s, s), rho float (s, s)).

    ``rho`` is the normalised radial coordinate (1 on the boundary), used for dome shading.
    """
    aspect = rng.uniform(1.0, 1.8)
    r_mean = math.sqrt(area / math.pi)
    ra, rb = r_mean * math.sqrt(aspect), r_mean / math.sqrt(aspect)
    margin = 0.15 * s
    cx, cy = rng.uniform(margin, s - margin), rng.uniform(margin, s - margin)
    theta0 = rng.uniform(0, math.pi)
    dx, dy = xx - cx, yy - cy
    u = (dx * math.cos(theta0) + dy * math.sin(theta0)) / ra
    v = (-dx * math.sin(theta0) + dy * math.cos(theta0)) / rb
    rho = np.hypot(u, v)
    phi = np.arctan2(v, u)
    boundary = np.ones_like(phi)
    for harmonic in range(2, 6):
        boundary += rng.normal(0.0, irregularity / harmonic * 2.0) * np.cos(harmonic * phi + rng.uniform(0, 2 * math.pi))
    rho = rho / np.clip(boundary, 0.5, 1.6)
    return rho <= 1.0, rho


def _polyp_image(rng: np.random.Generator, size: int, anatomy: Dict[str, Any], style: Dict[str, Any]):
    """One endoscopy-like image and its lesion mask.

    Returns:
        image: uint8 (size, size, 3); label: uint8 (size, size) in {0, 255}.
    """
    s = size
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) + 0.5
    lo, hi = POLYP_FRACTION_BAND
    f_lo, f_hi = anatomy["lesion_fraction_range"]

    # lesions first: redraw until the union lands in band (overlaps and borders shrink it)
    mask = np.zeros((s, s), bool)
    rho_min = np.full((s, s), np.inf, np.float32)
    for _attempt in range(10):
        n = int(rng.integers(1, 4))
        total = rng.uniform(f_lo, f_hi)
        shares = rng.dirichlet(np.full(n, 2.0))
        mask = np.zeros((s, s), bool)
        rho_min = np.full((s, s), np.inf, np.float32)
        for share in shares:
            m, rho = _blob(rng, s, max(share * total, 0.01) * s * s, anatomy["irregularity"], xx, yy)
            mask |= m
            rho_min = np.minimum(rho_min, rho)
        if lo <= mask.mean() <= hi:
            break
    else:  # deterministic fallback: one centred ellipse of 10 %
        rho_min = np.hypot(xx - s / 2, yy - s / 2) / math.sqrt(0.1 * s * s / math.pi)
        mask = rho_min <= 1.0

    # mucosa: base colour, low-frequency shading, folds (dark ridges where smooth noise crosses 0)
    base = np.asarray(anatomy["mucosa_rgb"], np.float32) * rng.uniform(0.93, 1.07, size=3).astype(np.float32)
    lcx, lcy = s / 2 + rng.normal(0, 0.12 * s), s / 2 + rng.normal(0, 0.12 * s)
    rr = np.hypot(xx - lcx, yy - lcy) / (0.75 * s)
    illum = np.clip(1.0 - anatomy["vignetting"] * rr**2, 0.15, 1.0) * (1.0 + 0.1 * smooth_noise(rng, (s, s), s / 8))
    folds = np.exp(-((smooth_noise(rng, (s, s), s / 12) / 0.18) ** 2))
    grain = smooth_noise(rng, (s, s), max(0.6, s / 96))
    shade = illum * (1.0 - 0.25 * folds) + 0.03 * grain
    img = base[None, None, :] * shade[..., None]

    # lesions: own tint, stronger pit-pattern texture, dome shading, soft edge, shadow rim
    tint = np.asarray(anatomy["lesion_tint"], np.float32) + rng.normal(0, 0.02, size=3).astype(np.float32)
    dome = np.clip(1.0 - np.minimum(rho_min, 1.0) ** 2, 0.0, 1.0)
    lesion_rgb = (base + tint)[None, None, :] * (
        illum * (0.9 + 0.2 * dome) + 0.03 * anatomy["lesion_texture"] * grain
    )[..., None]
    soft = ndimage.gaussian_filter(mask.astype(np.float32), sigma=max(0.5, s / 192))
    img = img * (1.0 - soft[..., None]) + lesion_rgb * soft[..., None]
    rim = np.exp(-(((rho_min - 1.08) / 0.07) ** 2)) * (~mask)
    img = img * (1.0 - 0.25 * rim)[..., None]

    # specular highlights: the brightest peaks of fine noise, more likely on the domes
    spec_noise = smooth_noise(rng, (s, s), max(0.7, s / 80)) + 1.5 * dome
    thr = np.quantile(spec_noise, 1.0 - anatomy["specular_density"])
    spec = np.clip((spec_noise - thr) / 0.3, 0.0, 1.0)[..., None]
    img = img * (1.0 - spec) + spec * 1.0
    img = apply_style(img, style, rng, pivot=0.45)
    return to_uint8(img), (mask.astype(np.uint8) * 255)


@dataclass(frozen=True)
class _Family:
    """How one family is generated and declared.

    ``draw_anatomy(site_rng) -> dict`` draws the site-level parameters; ``render(rng, size, anatomy,
    style) -> (image uint8 (H, W, 3) or grey (H, W), label uint8 (H, W) in {0, 255})`` draws one image.
    ``label`` names class 1 and ``spatial_mode`` is the datalist's ``"spatial_mode"``.
    ``style_size`` is the image size the scanner style's blur is scaled for: ``None`` = the generated size
    (content that scales with the image: vessels, polyps); a number = fixed, for content drawn at a fixed
    pixel scale (nuclei are a few pixels across at every image size, the field of view grows instead).
    ``image_sizes`` overrides the profile's image size per profile name (families whose structures need
    more native pixels than the generic profile sizes, e.g. guidewires one or two pixels wide).
    ``uses_style=False``: the family's acquisition chain is part of its anatomy (grey X-ray); the generic
    style is still drawn (so the anatomy draws stay in place) but not recorded in the datalist.
    ``label_space``: the datalist fields of a multi-class family (``labels``, ``label_values``, ``regions``;
    :mod:`fedseg.data.labels`); ``None`` = binary, ``{"labels": {"0": "background", "1": label}}``.
    """

    draw_anatomy: Callable[[np.random.Generator], Dict[str, Any]]
    render: Callable[..., Tuple[np.ndarray, np.ndarray]]
    label: str
    spatial_mode: str
    style_size: Optional[int] = None
    image_sizes: Optional[Dict[str, int]] = None
    uses_style: bool = True
    label_space: Optional[Dict[str, Any]] = None


# thin vessels (and tiny nuclei, registered at the end of this module) are trained on native-resolution
# patches; blob-like polyps survive a resize
_RENDERERS: Dict[str, _Family] = {
    "vessel": _Family(_draw_vessel_anatomy, _vessel_image, label="vessel", spatial_mode="patch"),
    "polyp": _Family(_draw_polyp_anatomy, _polyp_image, label="polyp", spatial_mode="resize"),
}


# ----------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------














def generate_site_data(
    family: str,
    site: str,
    out_dir: str | os.PathLike,
    seed: int = 0,
    profile: str = "default",
    image_size: Optional[int] = None,
    num_images: Optional[int] = None,
    split_fractions: Sequence[float] = (0.7, 0.1, 0.2),
) -> Path:
    """Generate (or reuse) one site's synthetic images, masks and datalist.

    Args:
        family: one of :data:`FAMILIES` (``"vessel"``, ``"polyp"``, ``"nuclei"``, ``"xray"``, ``"fundus"``), or a volume
            family of :mod:`fedseg.data.synthetic.volumes` (``"prostate3d"``: NIfTI volumes, ``num_images`` = volumes).
        site: any name without path separators (``"site-1"``, ``"hospital_a"``).
        out_dir: root folder; files go to ``out_dir/<family>/<site>/``.
        seed: federation seed; with ``family`` and ``site`` it determines everything.
        profile: key of :data:`PROFILES` giving the default size and image-count range.
        image_size: override the profile's square image size (pixels, >= 16).
        num_images: override the drawn number of images (>= 3).
        split_fractions: (training, validation, test) fractions; each split gets at least one image.

    Returns:
        Path of ``datalist.json``. Paths inside it are relative to its folder.

    The call is idempotent: if a datalist with the same fingerprint exists and all its files are
    present, nothing is regenerated.
    """
    from .volumes import VOLUME_FAMILIES, generate_volume_site

    if family in VOLUME_FAMILIES:  # NIfTI volumes (fedseg.data.synthetic.volumes)
        if image_size is not None:
            raise ValueError(f"image_size does not apply to the volume family {family!r} (its profile sets the sizes)")
        return generate_volume_site(family, site, out_dir, seed=seed, profile=profile, num_volumes=num_images)
    if family not in _RENDERERS:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES + VOLUME_FAMILIES}")
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {tuple(PROFILES)}")
    check_site_name(site)
    spec = _RENDERERS[family]
    default_size = (spec.image_sizes or {}).get(profile, PROFILES[profile]["image_size"])
    size = int(image_size if image_size is not None else default_size)
    if size < 16:
        raise ValueError(f"image_size must be >= 16, got {size}")

    base_seed = site_seed(family, site, seed)
    site_rng = np.random.default_rng([base_seed, 0])
    # the count is always drawn first so the style below does not depend on num_images overrides
    lo, hi = PROFILES[profile]["num_images"]
    drawn = int(site_rng.integers(lo, hi + 1))
    n = int(num_images) if num_images is not None else drawn
    n_train, n_val, n_test = split_counts(n, split_fractions)
    style = _draw_style(site_rng, spec.style_size or size)
    anatomy = spec.draw_anatomy(site_rng)

    site_dir = Path(out_dir) / family / site
    datalist_path = site_dir / "datalist.json"
    fingerprint = site_fingerprint({"generator_version": GENERATOR_VERSION, "family": family}, site, seed, profile,
                                   split_fractions, image_size=size, num_images=n)
    if existing_datalist(datalist_path, fingerprint):
        return datalist_path

    prepare_site_folder(site_dir)
    names = numbered_names(n, ".png")
    for i, name in enumerate(names):
        # one RNG stream per image: image i is the same whatever n is
        image, label = spec.render(np.random.default_rng([base_seed, 1, i]), size, anatomy, style)
        save_png_atomic(image, site_dir / "images" / name)
        save_png_atomic(label, site_dir / "labels" / name)
    remove_stale_files(site_dir, names, ".png")

    datalist = {
        "name": f"fedseg-synthetic-{family}-{site}",
        **generator_fields(fingerprint),
        "style": style if spec.uses_style else None,
        "anatomy": anatomy,
        **(spec.label_space or {"labels": {"0": "background", "1": spec.label}}),
        "spatial_mode": spec.spatial_mode,
        **seeded_splits(names, base_seed, (n_train, n_val, n_test)),
    }
    return write_json_atomic(datalist_path, datalist)


def family_label_space(family: str):
    """The :class:`fedseg.data.labels.LabelSpace` every site of a built-in family declares."""
    from ..labels import LabelSpace
    from .volumes import VOLUME_FAMILIES, volume_family_label_space

    if family in VOLUME_FAMILIES:
        return LabelSpace.from_datalist(volume_family_label_space(family), f"built-in family {family!r}")
    if family not in _RENDERERS:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    spec = _RENDERERS[family]
    return LabelSpace.from_datalist(spec.label_space or {"labels": {"0": "background", "1": spec.label}}, f"built-in family {family!r}")


def generate_federation(
    family: str,
    sites: Sequence[str],
    out_dir: str | os.PathLike,
    seed: int = 0,
    profile: str = "default",
    **kw: Any,
) -> Dict[str, Path]:
    """Generate every site of a federation; returns ``{site: datalist path}`` in ``sites`` order.

    Extra keyword arguments go to :func:`generate_site_data` (``image_size``, ``num_images``,
    ``split_fractions``).
    """
    sites = list(sites)
    if not sites:
        raise ValueError("generate_federation needs at least one site")
    if len(set(sites)) != len(sites):
        raise ValueError(f"duplicate site names in {sites}")
    return {site: generate_site_data(family, site, out_dir, seed=seed, profile=profile, **kw) for site in sites}


# ----------------------------------------------------------------------------------------------
# family "nuclei" (its own module, drawing with drawing.py's helpers)
# ----------------------------------------------------------------------------------------------

_RENDERERS["nuclei"] = _Family(
    draw_nuclei_anatomy, nuclei_image, label="nucleus", spatial_mode="patch", style_size=96
)


# ----------------------------------------------------------------------------------------------
# family "xray" (its own module, likewise)
# ----------------------------------------------------------------------------------------------

# devices are one to a few pixels wide: native-resolution patches, larger frames than the generic profiles
_RENDERERS["xray"] = _Family(
    draw_xray_anatomy, xray_image, label="device", spatial_mode="patch", image_sizes=XRAY_IMAGE_SIZES,
    uses_style=False,
)


# ----------------------------------------------------------------------------------------------
# family "fundus" (its own module, registered last for the same reason)
# ----------------------------------------------------------------------------------------------

from .fundus import FUNDUS_LABEL_SPACE, draw_fundus_anatomy, fundus_image  # noqa: E402

# disc and cup are blobs: resized like polyps (the OD/OC papers resize their crops too)
_RENDERERS["fundus"] = _Family(
    draw_fundus_anatomy, fundus_image, label="disc", spatial_mode="resize", label_space=FUNDUS_LABEL_SPACE,
)
