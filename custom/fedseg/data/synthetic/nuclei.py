"""Built-in synthetic family ``"nuclei"``: H&E-histology-like tiles with a nucleus mask.

Registered into :mod:`fedseg.data.synthetic` (``FAMILIES``, ``generate_site_data``); this module only
draws pixels and uses the shared machinery there (site RNG, scanner style, smooth noise, files, splits).

A tile is rendered the way stained tissue absorbs light (Beer-Lambert): per-pixel hematoxylin and
eosin concentrations times the site's stain optical-density (OD) vectors give the optical density,
``RGB = 0.97 * 10 ** -OD``, before the site's scanner style (blur, gain, contrast, gamma, noise).

* stroma: eosin (pink) with fibrous texture (oriented smooth noise), a faint hematoxylin counterstain,
  and a few white lumen / fat spaces;
* nuclei: ellipses with a Fourier-perturbed outline (round to elongated, slightly irregular), sizes
  log-normal around the site's mean radius, a share placed next to an earlier nucleus (clusters of
  touching or overlapping nuclei), dark hematoxylin with per-nucleus intensity and chromatin texture,
  a soft one-pixel edge; the label is the union of the nucleus outlines.

Each site draws its *stain* (hematoxylin/eosin OD vectors, i.e. hue, and their strengths), its
*magnification* (mean nucleus radius in pixels) and its nucleus density/shape/clustering from its own
RNG, so sites differ like hospitals with different staining protocols and scanners do.

Nuclei are drawn at a fixed pixel scale whatever the image size (2.5-5 px mean radius, so a few to
~15 px across): a larger image shows a larger field of view, as a larger tile of a 40x slide would.
The scanner blur is therefore drawn for a 96 px image at every size. The nucleus fraction of every
image stays in :data:`NUCLEI_FRACTION_BAND`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import numpy as np
from scipy import ndimage

from .drawing import apply_style, round_param, smooth_noise, to_uint8

__all__ = ["NUCLEI_FRACTION_BAND", "draw_nuclei_anatomy", "nuclei_image"]

#: the nucleus fraction of every generated image stays in this band
NUCLEI_FRACTION_BAND = (0.10, 0.35)

# Ruifrok & Johnston (2001) optical-density vectors of hematoxylin and eosin (RGB, unit length)
_HEMATOXYLIN_OD = (0.650, 0.704, 0.286)
_EOSIN_OD = (0.072, 0.990, 0.105)


def _stain_vector(rng: np.random.Generator, base: Tuple[float, float, float], spread: float) -> list:
    """A site's version of a stain's OD vector: the reference perturbed per channel, unit length."""
    v = np.clip(np.asarray(base) + rng.normal(0.0, spread, size=3), 0.03, None)
    return [round_param(x) for x in v / np.linalg.norm(v)]


def draw_nuclei_anatomy(rng: np.random.Generator) -> Dict[str, Any]:
    """Site-level tissue appearance: stain colour and strength, magnification, nucleus shape and density."""
    return {
        "hematoxylin_od": _stain_vector(rng, _HEMATOXYLIN_OD, 0.08),
        "eosin_od": _stain_vector(rng, _EOSIN_OD, 0.08),
        "hematoxylin_strength": round_param(rng.uniform(0.6, 1.3)),
        "eosin_strength": round_param(rng.uniform(0.15, 0.45)),
        # magnification: mean nucleus radius in pixels (fixed pixel scale at every image size)
        "nucleus_radius_px": round_param(rng.uniform(2.5, 5.0)),
        "size_spread": round_param(rng.uniform(0.12, 0.3)),
        "elongation": round_param(rng.uniform(1.1, 2.0)),
        "irregularity": round_param(rng.uniform(0.03, 0.12)),
        "clustering": round_param(rng.uniform(0.2, 0.7)),
        "nuclei_fraction": round_param(rng.uniform(0.14, 0.28)),
        "chromatin_texture": round_param(rng.uniform(0.1, 0.35)),
        "stroma_fibres": round_param(rng.uniform(0.15, 0.45)),
        "lumen_fraction": round_param(rng.uniform(0.0, 0.1)),
    }


def _nucleus(rng: np.random.Generator, r: float, anatomy: Dict[str, Any], cx: float, cy: float, s: int):
    """One nucleus around ``(cx, cy)`` with mean radius ``r``, rendered in its bounding window.

    Returns ``(rows slice, cols slice, rho)`` where ``rho`` is the normalised radial coordinate over the
    window (1 on the outline), or None when the window misses the image.
    """
    aspect = rng.uniform(1.0, anatomy["elongation"])
    ra, rb = r * math.sqrt(aspect), r / math.sqrt(aspect)
    theta = rng.uniform(0.0, math.pi)
    harmonics = [
        (rng.normal(0.0, anatomy["irregularity"] * 2.0 / k), k, rng.uniform(0.0, 2.0 * math.pi)) for k in range(2, 5)
    ]
    half = int(math.ceil(ra * 1.5 + 2))
    y0, y1 = max(0, int(cy) - half), min(s, int(cy) + half + 1)
    x0, x1 = max(0, int(cx) - half), min(s, int(cx) + half + 1)
    if y0 >= y1 or x0 >= x1:
        return None
    yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32) + 0.5
    dx, dy = xx - cx, yy - cy
    u = (dx * math.cos(theta) + dy * math.sin(theta)) / ra
    v = (-dx * math.sin(theta) + dy * math.cos(theta)) / rb
    phi = np.arctan2(v, u)
    boundary = np.ones_like(phi)
    for amp, k, phase in harmonics:
        boundary += amp * np.cos(k * phi + phase)
    rho = np.hypot(u, v) / np.clip(boundary, 0.6, 1.4)
    return slice(y0, y1), slice(x0, x1), rho


def _place_nuclei(rng: np.random.Generator, s: int, anatomy: Dict[str, Any], lumen: np.ndarray):
    """Nuclei until the union covers the drawn target fraction (never above the band's top).

    Returns ``(label bool (s, s), hematoxylin concentration float32 (s, s))``.
    """
    lo, hi = NUCLEI_FRACTION_BAND
    target = float(np.clip(anatomy["nuclei_fraction"] * rng.uniform(0.8, 1.2), lo + 0.02, hi - 0.04))
    n_px, cap = target * s * s, (hi - 0.01) * s * s
    r_mean = anatomy["nucleus_radius_px"]
    label = np.zeros((s, s), bool)
    conc = np.zeros((s, s), np.float32)
    centres = []
    area = 0
    max_tries = 50 + int(20 * s * s / (math.pi * r_mean**2))
    for attempt in range(max_tries):
        if area >= n_px:
            break
        r = r_mean * math.exp(rng.normal(0.0, anatomy["size_spread"]))
        r = min(max(r, 1.5), 2.2 * r_mean, s / 6)
        if attempt > max_tries // 2:  # still short (a small image, big nuclei): fill with smaller ones
            r = max(1.5, 0.6 * r)
        if centres and rng.random() < anatomy["clustering"]:
            px, py, pr = centres[int(rng.integers(len(centres)))]
            angle = rng.uniform(0.0, 2.0 * math.pi)
            dist = (r + pr) * rng.uniform(0.75, 1.1)  # touching or slightly overlapping
            cx, cy = px + dist * math.cos(angle), py + dist * math.sin(angle)
        else:
            cx, cy = rng.uniform(0.0, s), rng.uniform(0.0, s)
        drawn = _nucleus(rng, r, anatomy, cx, cy, s)
        darkness = anatomy["hematoxylin_strength"] * rng.uniform(0.75, 1.25)
        if drawn is None or not (0 <= cx < s and 0 <= cy < s) or lumen[int(cy), int(cx)]:
            continue
        rows, cols, rho = drawn
        inside = rho <= 1.0
        new = int((inside & ~label[rows, cols]).sum())
        if new == 0 or area + new > cap:
            continue
        label[rows, cols] |= inside
        area += new
        # soft edge about one pixel wide, 0.5 on the outline
        coverage = np.clip((1.0 - rho) * r + 0.5, 0.0, 1.0)
        conc[rows, cols] = np.maximum(conc[rows, cols], coverage * darkness)
        centres.append((cx, cy, r))
    return label, conc


def _fibres(rng: np.random.Generator, s: int) -> np.ndarray:
    """Oriented fibre texture (zero mean, unit std): noise smoothed along one random direction."""
    pad = int(math.ceil(s * 0.42)) + 4  # a rotated square still covers the image
    field = ndimage.gaussian_filter(rng.standard_normal((s + 2 * pad, s + 2 * pad)).astype(np.float32), sigma=(0.7, 4.0))
    field = ndimage.rotate(field, rng.uniform(0.0, 180.0), reshape=False, order=1, mode="reflect")[pad : pad + s, pad : pad + s]
    return (field - field.mean()) / (field.std() + 1e-8)


def nuclei_image(rng: np.random.Generator, size: int, anatomy: Dict[str, Any], style: Dict[str, Any]):
    """One H&E-like tile and its nucleus mask.

    Returns:
        image: uint8 (size, size, 3); label: uint8 (size, size) in {0, 255}.
    """
    s = size
    # white spaces (lumen, fat): the top quantile of a smooth field; nuclei are not centred in them
    lumen = np.zeros((s, s), bool)
    if anatomy["lumen_fraction"] > 0.005:
        field = smooth_noise(rng, (s, s), 9.0)
        lumen = field > np.quantile(field, 1.0 - anatomy["lumen_fraction"] * rng.uniform(0.5, 1.5))
    label, h_nuclei = _place_nuclei(rng, s, anatomy, lumen)

    chromatin = 1.0 + anatomy["chromatin_texture"] * smooth_noise(rng, (s, s), 0.7)
    h_conc = h_nuclei * chromatin + 0.05 * anatomy["hematoxylin_strength"] * (1.0 + 0.5 * smooth_noise(rng, (s, s), 6.0))
    e_conc = anatomy["eosin_strength"] * (
        (1.0 + 0.15 * smooth_noise(rng, (s, s), 12.0)) * (1.0 + 0.5 * anatomy["stroma_fibres"] * _fibres(rng, s))
    )
    open_space = ndimage.gaussian_filter(lumen.astype(np.float32), sigma=1.0)
    e_conc = e_conc * (1.0 - 0.85 * open_space)
    h_conc = h_conc * (1.0 - 0.8 * open_space * (h_nuclei == 0))
    e_conc = e_conc * (1.0 - 0.6 * np.clip(h_nuclei, 0.0, 1.0))  # nuclei take little eosin
    od = (
        np.clip(h_conc, 0.0, None)[..., None] * np.asarray(anatomy["hematoxylin_od"], np.float32)
        + np.clip(e_conc, 0.0, None)[..., None] * np.asarray(anatomy["eosin_od"], np.float32)
    )
    img = 0.97 * np.power(10.0, -od).astype(np.float32)
    img = apply_style(img, style, rng, pivot=0.6)
    return to_uint8(img), (label.astype(np.uint8) * 255)
