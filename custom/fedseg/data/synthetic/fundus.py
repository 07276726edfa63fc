"""Built-in synthetic family ``"fundus"``: optic-disc regions of interest with a three-class label (background,
neuroretinal rim, optic cup), the multi-class counterpart of the fundus OD/OC benchmarks (Drishti-GS, RIM-ONE,
REFUGE) on which federated segmentation papers such as FedEvi report results.

Registered into :mod:`fedseg.data.synthetic` (``FAMILIES``, ``generate_site_data``); this module only draws
pixels and declares the label space, using the shared machinery there (site RNG, scanner style, smooth noise,
files, splits).

An image is a square crop centred near the optic disc, as the public OD/OC sets distribute them:

* background: orange-red retina with smooth illumination falloff from one side and fine texture;
* optic disc: a bright yellow-orange ellipse (slightly taller than wide, outline perturbed by low-order
  harmonics) with a soft edge;
* optic cup: a paler, brighter ellipse inside the disc, displaced towards one side (the temporal side of a real
  disc), its vertical diameter ``cdr`` times the disc's (the cup-to-disc ratio, the glaucoma marker); it is kept
  at least one pixel inside the disc, so the disc always *contains* the cup (rim = disc minus cup);
* vessels: dark red curves leaving the cup and crossing the rim into the retina (in the image, not the label:
  OD/OC annotations are regions).

Each site draws from its own RNG what differs between the public data sets: retina and disc colour, illumination
strength and direction, disc size within the crop, the site's cup-to-disc ratio (mean and spread: a
glaucoma-enriched site has larger cups), how much brighter the cup is than the rim and how gradual its border is
(low-contrast, soft-bordered sites are the hard ones), vessel count and width, plus the generic scanner style (gain, contrast, gamma, blur, noise).

Masks are stored the way the public fundus OD/OC files store them: one grey channel with **0 = cup, 128 = rim,
255 = background**; the datalist declares this encoding (``label_values``), the classes and the regions
(``disc`` = rim + cup, ``cup``), so the built-in family exercises the same decoding as real data.
"""

from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage

from .drawing import apply_style, round_param, smooth_noise, to_uint8

__all__ = ["FUNDUS_LABEL_SPACE", "FUNDUS_CDR_BAND", "draw_fundus_anatomy", "fundus_image"]

#: the label space every fundus datalist declares (fedseg.data.labels), REFUGE's conventions
FUNDUS_LABEL_SPACE: Dict[str, Any] = {
    "labels": {"background": 0, "rim": 1, "cup": 2},
    "label_values": {"255": 0, "128": 1, "0": 2},
    "regions": {"disc": ["rim", "cup"], "cup": ["cup"]},
}
#: stored mask value of each class (index order), as in ``FUNDUS_LABEL_SPACE["label_values"]``
_STORED = np.array([255, 128, 0], np.uint8)
#: every drawn cup-to-disc ratio (vertical diameters) lies in this band
FUNDUS_CDR_BAND = (0.2, 0.85)


def draw_fundus_anatomy(rng: np.random.Generator) -> Dict[str, Any]:
    """Site-level appearance: colours, illumination, disc size, cup-to-disc ratio, cup contrast, vessels."""
    return {
        "retina_rgb": [round_param(rng.uniform(0.55, 0.8)), round_param(rng.uniform(0.22, 0.38)), round_param(rng.uniform(0.06, 0.16))],
        "disc_rgb": [round_param(rng.uniform(0.85, 1.0)), round_param(rng.uniform(0.55, 0.75)), round_param(rng.uniform(0.3, 0.5))],
        # how much paler the cup is than the rim, and how gradual its border is (fraction of the crop side): the
        # cup border is the ambiguous one in real OD/OC annotation (cup Dice trails disc Dice in every paper)
        "cup_contrast": round_param(rng.uniform(0.03, 0.18)),
        "cup_edge": round_param(rng.uniform(0.02, 0.06)),
        "illumination": round_param(rng.uniform(0.15, 0.5)),
        # disc diameter as a fraction of the crop side (REFUGE-like crops show a smaller disc than Drishti-GS)
        "disc_fraction": round_param(rng.uniform(0.35, 0.6)),
        "disc_aspect": round_param(rng.uniform(1.0, 1.2)),
        "cdr_mean": round_param(rng.uniform(0.35, 0.65)),
        "cdr_std": round_param(rng.uniform(0.04, 0.12)),
        "n_vessels": int(rng.integers(4, 8)),
        "vessel_width": round_param(rng.uniform(0.012, 0.025)),
    }


def _ellipse_rho(xx, yy, cx, cy, rx, ry, rng, irregularity: float) -> np.ndarray:
    """Normalised radial coordinate of an axis-aligned ellipse whose outline is perturbed by harmonics 2-4
    (1 on the outline, < 1 inside)."""
    u, v = (xx - cx) / rx, (yy - cy) / ry
    phi = np.arctan2(v, u)
    boundary = np.ones_like(phi)
    for k in range(2, 5):
        boundary += rng.normal(0.0, irregularity / k) * np.cos(k * phi + rng.uniform(0, 2 * math.pi))
    return np.hypot(u, v) / np.clip(boundary, 0.7, 1.3)


def fundus_image(rng: np.random.Generator, size: int, anatomy: Dict[str, Any], style: Dict[str, Any]):
    """One optic-disc crop and its stored label.

    Returns:
        image: uint8 ``(size, size, 3)``; label: uint8 ``(size, size)`` with 255 = background, 128 = rim, 0 = cup.
    """
    s = size
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) + 0.5
    cx, cy = s / 2 + rng.normal(0, 0.04 * s), s / 2 + rng.normal(0, 0.04 * s)
    rd = 0.5 * anatomy["disc_fraction"] * s * rng.uniform(0.9, 1.1)
    aspect = anatomy["disc_aspect"] * rng.uniform(0.97, 1.03)
    rx, ry = rd / math.sqrt(aspect), rd * math.sqrt(aspect)
    disc_rho = _ellipse_rho(xx, yy, cx, cy, rx, ry, rng, 0.05)
    disc = disc_rho <= 1.0

    lo, hi = FUNDUS_CDR_BAND
    cdr = float(np.clip(rng.normal(anatomy["cdr_mean"], anatomy["cdr_std"]), lo, hi))
    side = 1.0 if rng.random() < 0.5 else -1.0
    shift = side * 0.25 * rx * (1.0 - cdr)  # a small cup sits off centre, a large one fills the disc
    cup_ry = cdr * ry
    cup_rx = cup_ry / max(1.0, aspect * rng.uniform(0.95, 1.1))
    cup_rho = _ellipse_rho(xx, yy, cx + shift, cy + rng.normal(0, 0.03 * ry), cup_rx, cup_ry, rng, 0.04)
    # the cup stays at least one pixel inside the disc: the disc always contains it, and rim = disc - cup is a ring
    inner_disc = ndimage.binary_erosion(disc, iterations=max(1, int(round(0.02 * s))))
    cup = (cup_rho <= 1.0) & inner_disc
    if not cup.any():  # a very small crop: one pixel at the disc centre keeps the class present
        cup[int(cy), int(cx)] = disc[int(cy), int(cx)]

    # retina: base colour, illumination falloff from one side, texture
    angle = rng.uniform(0, 2 * math.pi)
    ramp = ((xx - s / 2) * math.cos(angle) + (yy - s / 2) * math.sin(angle)) / s
    illum = 1.0 - anatomy["illumination"] * (ramp + 0.5) + 0.06 * smooth_noise(rng, (s, s), s / 8)
    retina = np.asarray(anatomy["retina_rgb"], np.float32) * rng.uniform(0.93, 1.07, size=3).astype(np.float32)
    img = retina[None, None, :] * (illum + 0.04 * smooth_noise(rng, (s, s), max(0.8, s / 60)))[..., None]
    # disc and cup blended in with soft edges (sigmoids of the radial coordinates)
    edge = max(0.5, 0.015 * s)
    disc_soft = 1.0 / (1.0 + np.exp((disc_rho - 1.0) * rd / edge))
    cup_edge = max(0.5, anatomy["cup_edge"] * s)
    cup_soft = 1.0 / (1.0 + np.exp((cup_rho - 1.0) * cup_ry / cup_edge)) * inner_disc
    disc_rgb = np.asarray(anatomy["disc_rgb"], np.float32)
    img = img * (1.0 - disc_soft[..., None]) + (disc_rgb * illum[..., None]) * disc_soft[..., None]
    cup_rgb = np.clip(disc_rgb + anatomy["cup_contrast"], 0.0, 1.0)
    img = img * (1.0 - cup_soft[..., None]) + (cup_rgb * illum[..., None]) * cup_soft[..., None]

    # vessels: curves from the cup outwards, drawn supersampled and box-averaged to a coverage map
    k = int(max(2, min(8, 512 // s)))
    canvas = Image.new("L", (s * k, s * k), 0)
    draw = ImageDraw.Draw(canvas)
    width = max(1, int(round(anatomy["vessel_width"] * s * k)))
    for j in range(anatomy["n_vessels"]):
        heading = 2 * math.pi * j / anatomy["n_vessels"] + rng.normal(0, 0.3)
        x, y = cx + shift, cy
        points = [(x * k, y * k)]
        for _ in range(40):
            heading += rng.normal(0, 0.12)
            x, y = x + 0.03 * s * math.cos(heading), y + 0.03 * s * math.sin(heading)
            points.append((x * k, y * k))
            if not (0 <= x < s and 0 <= y < s):
                break
        draw.line(points, fill=255, width=width, joint="curve")
    coverage = np.asarray(canvas, np.float32).reshape(s, k, s, k).mean(axis=(1, 3)) / 255.0
    vessel_rgb = np.array([0.45, 0.08, 0.05], np.float32) * illum[..., None]
    alpha = (0.7 * coverage)[..., None]
    img = img * (1.0 - alpha) + vessel_rgb * alpha
    img = apply_style(img, style, rng, pivot=0.4)

    classes = disc.astype(np.int64) + cup.astype(np.int64)  # 0 background, 1 rim, 2 cup (cup implies disc)
    return to_uint8(img), _STORED[classes]
