"""Built-in synthetic family ``"xray"``: endovascular fluoroscopy-like frames with a device mask.

Registered into :mod:`fedseg.data.synthetic` (``FAMILIES``, ``generate_site_data``) like ``"nuclei"``;
this module only draws pixels. It stands in for catheter/guidewire X-ray data (the FedEFM setting) and
is also the source of the built-in phase-1 classification classes (:mod:`fedseg.data.synthetic.xray_builtin`).

A frame is built in display intensity (1 = white), the convention of angiography monitors where
radio-opaque material is dark:

* background: soft tissue as a smooth low-frequency gradient (a tilted ramp plus very smooth noise)
  and a few bones, elongated brighter bands with soft edges (ribs / vertebral edges);
* contrast-filled vessel trees: dark, tapered, branching random walks (the vessel grower of the
  ``"vessel"`` family) entering from one border;
* devices, one of :data:`DEVICES`: a *catheter* (a thick smooth tube: dark radio-opaque core and a
  lighter wall), a *guidewire* (thin, very dark, with a thicker radio-opaque tip), ``both`` or ``none``.
  Device paths are smooth curves entering from a border, bending gently;
* acquisition: optics blur, then Poisson-Gaussian noise (photon counting with the site's dose plus
  electronic read noise), the site's edge enhancement (unsharp masking, which gives dark devices the
  light halo seen on clinical monitors), contrast and gamma.

Per site (drawn from the site's RNG, i.e. deterministically from the site name): vessel contrast, dose
(photons per pixel, hence noise level), read noise, device thickness, background level and gradient,
bone count, edge enhancement. Thickness is in pixels of a 256 px frame and scales with the image size,
so the same site looks the same at every size (the field of view is fixed).

Images are grey, uint8 ``(H, W)``; the engine repeats grey to the network's channels. Masks are
uint8 ``(H, W)`` in {0, 255}: the union of the drawn devices (``target="device"``), one device kind
(``"catheter"``, ``"guidewire"``) or the vessel tree (``"vessel"``).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage, special

from .drawing import grow_vessel_trees, round_param, smooth_noise, to_uint8

__all__ = ["DEVICES", "SEGMENTATION_DEVICES", "TARGETS", "XRAY_IMAGE_SIZES", "draw_xray_anatomy", "xray_frame", "xray_image"]

#: device classes of a frame (the classification label of the built-in phase-1 classes)
DEVICES: Tuple[str, ...] = ("none", "catheter", "guidewire", "both")

#: devices drawn in segmentation mode: every frame shows at least one device
SEGMENTATION_DEVICES: Tuple[str, ...] = ("catheter", "guidewire", "both")

#: what a mask can hold
TARGETS: Tuple[str, ...] = ("device", "catheter", "guidewire", "vessel")

#: native frame size per profile (square, divisible by 16): devices are a few pixels wide, so the
#: family is trained on native-resolution patches and needs more pixels than the generic profile sizes
XRAY_IMAGE_SIZES: Dict[str, int] = {"tiny": 64, "default": 256, "paper": 512}

# reference frame size for widths and blur drawn "in pixels"
_REF = 256.0


def draw_xray_anatomy(rng: np.random.Generator) -> Dict[str, Any]:
    """Site-level appearance: contrast, dose/noise, device thickness, background, bones, vessels."""
    return {
        "background_level": round_param(rng.uniform(0.5, 0.72)),
        "background_gradient": round_param(rng.uniform(0.08, 0.25)),
        "n_bones": int(rng.integers(1, 4)),
        "bone_brightness": round_param(rng.uniform(0.06, 0.14)),
        "vessel_contrast": round_param(rng.uniform(0.25, 0.55)),
        "vessel_fraction": round_param(rng.uniform(0.04, 0.09)),
        "vessel_width_scale": round_param(rng.uniform(1.2, 2.0)),
        "branch_prob": round_param(rng.uniform(0.05, 0.12)),
        "tortuosity": round_param(rng.uniform(0.05, 0.14)),
        # photons per pixel at full brightness: the Poisson part of the noise (fewer = noisier)
        "photons": round_param(rng.uniform(60.0, 600.0)),
        "read_noise": round_param(rng.uniform(0.005, 0.03)),
        "catheter_width_px": round_param(rng.uniform(5.0, 10.0)),
        "guidewire_width_px": round_param(rng.uniform(1.4, 2.6)),
        "device_contrast": round_param(rng.uniform(0.5, 0.8)),
        "edge_enhance": round_param(rng.uniform(0.0, 0.8)),
        "blur_px": round_param(rng.uniform(0.3, 1.2)),
        "contrast": round_param(rng.uniform(0.85, 1.25)),
        "gamma": round_param(rng.uniform(0.8, 1.25)),
    }


def _supersampled(s: int) -> int:
    """Supersampling factor for drawing curves: about 512 px of canvas, 2-8x."""
    return int(max(2, min(8, 512 // s)))


def _coverage(canvas: Image.Image, s: int, k: int) -> np.ndarray:
    """Box-average a ``(s*k, s*k)`` drawing to a coverage map in [0, 1], float32 ``(s, s)``."""
    return np.asarray(canvas, np.float32).reshape(s, k, s, k).mean(axis=(1, 3)) / 255.0


def _device_path(rng: np.random.Generator, s: int, length: float) -> np.ndarray:
    """A smooth curve entering from a random border and heading inward; float ``(n, 2)`` (x, y) pixels.

    The heading turns by a slowly varying curvature (smoothed white noise), so the curve bends gently
    like a device pushed through a vessel, and is pulled back toward the centre when it nears a border.
    """
    side = int(rng.integers(4))
    t = rng.uniform(0.2, 0.8) * s
    start = [(t, -2.0), (s + 2.0, t), (t, s + 2.0), (-2.0, t)][side]
    inward = [math.pi / 2, math.pi, -math.pi / 2, 0.0][side] + rng.normal(0.0, 0.35)
    step = max(0.5, s / 128.0)
    n = max(8, int(length / step))
    curvature = ndimage.gaussian_filter1d(rng.normal(0.0, 1.0, n), sigma=n / 8.0, mode="nearest")
    curvature = curvature / (np.abs(curvature).max() + 1e-8) * rng.uniform(0.5, 2.5) * math.pi / n
    x, y, heading = start[0], start[1], inward
    pts = [(x, y)]
    for i in range(n):
        to_centre = math.atan2(s / 2 - y, s / 2 - x)
        margin = min(x, y, s - x, s - y)
        if i > n // 6 and margin < 0.12 * s:  # turn back inward instead of leaving early
            heading += 0.15 * math.sin(to_centre - heading)
        heading += curvature[i]
        x, y = x + step * math.cos(heading), y + step * math.sin(heading)
        pts.append((x, y))
    return np.asarray(pts, np.float64)


def _draw_polyline(s: int, k: int, pts: np.ndarray, width_px: float) -> np.ndarray:
    """Coverage ``(s, s)`` float32 of a polyline ``pts`` (pixels) drawn ``width_px`` wide with round joints."""
    canvas = Image.new("L", (s * k, s * k), 0)
    draw = ImageDraw.Draw(canvas)
    w = max(1, int(round(width_px * k)))
    scaled = [(float(px * k), float(py * k)) for px, py in pts]
    draw.line(scaled, fill=255, width=w, joint="curve")
    for px, py in (scaled[0], scaled[-1]):  # round caps
        draw.ellipse([px - w / 2, py - w / 2, px + w / 2, py + w / 2], fill=255)
    return _coverage(canvas, s, k)


def _background(rng: np.random.Generator, s: int, anatomy: Dict[str, Any]) -> np.ndarray:
    """Soft tissue and bones, float32 ``(s, s)`` display intensity."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s - 0.5
    angle = rng.uniform(0.0, 2.0 * math.pi)
    ramp = xx * math.cos(angle) + yy * math.sin(angle)  # in [-0.71, 0.71]
    level = anatomy["background_level"] * rng.uniform(0.95, 1.05)
    img = level + anatomy["background_gradient"] * ramp + 0.04 * smooth_noise(rng, (s, s), s / 5)
    for _ in range(int(anatomy["n_bones"])):
        # an elongated band: distance to a slightly curved line, soft-edged, brighter inside
        theta = rng.uniform(0.0, math.pi)
        offset = rng.uniform(-0.35, 0.35)
        bend = rng.uniform(-0.6, 0.6)
        along = xx * math.cos(theta) + yy * math.sin(theta)
        across = -xx * math.sin(theta) + yy * math.cos(theta) - offset - bend * along**2
        half_width = rng.uniform(0.03, 0.08)
        band = special.expit(-(np.abs(across) - half_width) / 0.008)
        cortex = np.exp(-(((np.abs(across) - half_width) / 0.01) ** 2))  # a slightly brighter rim
        img = img + anatomy["bone_brightness"] * rng.uniform(0.7, 1.2) * (band + 0.4 * cortex)
    return img.astype(np.float32)


def _vessels(rng: np.random.Generator, s: int, anatomy: Dict[str, Any]) -> np.ndarray:
    """Vessel-tree coverage ``(s, s)`` in [0, 1]: tapered branching walks from one border."""
    k = _supersampled(s)
    canvas = Image.new("L", (s * k, s * k), 0)
    draw = ImageDraw.Draw(canvas)
    side = int(rng.integers(4))
    t = rng.uniform(0.25, 0.75) * s
    start = [(t, 0.0), (s, t), (t, s), (0.0, t)][side]
    # the grower stops at a circular field of view: one circumscribing the frame, centred
    fov = (s / 2.0, s / 2.0, 0.72 * s)
    budget = anatomy["vessel_fraction"] * rng.uniform(0.85, 1.15) * s * s
    grow_vessel_trees(draw, rng, k, start, fov, s, anatomy, budget, int(rng.integers(2, 4)))
    return _coverage(canvas, s, k)


def _acquire(rng: np.random.Generator, img: np.ndarray, anatomy: Dict[str, Any], s: int) -> np.ndarray:
    """Blur, Poisson-Gaussian noise, edge enhancement and tone curve; float32 ``(s, s)`` in [0, 1]."""
    img = ndimage.gaussian_filter(np.clip(img, 0.0, 1.0), sigma=anatomy["blur_px"] * s / _REF, mode="nearest")
    photons = anatomy["photons"]
    img = rng.poisson(img * photons).astype(np.float32) / photons
    img = img + rng.normal(0.0, anatomy["read_noise"], size=img.shape).astype(np.float32)
    if anatomy["edge_enhance"] > 0:
        smooth = ndimage.gaussian_filter(img, sigma=max(1.0, 3.0 * s / _REF), mode="nearest")
        img = img + anatomy["edge_enhance"] * (img - smooth)
    img = (img - 0.5) * anatomy["contrast"] + 0.5
    return (np.clip(img, 0.0, 1.0) ** anatomy["gamma"]).astype(np.float32)


def xray_frame(
    rng: np.random.Generator, size: int, anatomy: Dict[str, Any], device: str
) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """One fluoroscopy-like frame showing ``device`` (one of :data:`DEVICES`), and its masks.

    Returns:
        image: uint8 ``(size, size)``; masks: ``{target: bool (size, size)}`` for every target in
        :data:`TARGETS` (empty where the frame has no such structure).
    """
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    s = int(size)
    scale = s / _REF
    k = _supersampled(s)
    img = _background(rng, s, anatomy)
    vessel_cov = _vessels(rng, s, anatomy)
    img = img * (1.0 - anatomy["vessel_contrast"] * rng.uniform(0.85, 1.15) * vessel_cov)

    empty = np.zeros((s, s), np.float32)
    cath_cov, wire_cov = empty, empty
    contrast = anatomy["device_contrast"]
    if device in ("catheter", "both"):
        width = max(2.0, anatomy["catheter_width_px"] * scale * rng.uniform(0.9, 1.1))
        pts = _device_path(rng, s, rng.uniform(0.6, 1.1) * s)
        cath_cov = _draw_polyline(s, k, pts, width)
        core = _draw_polyline(s, k, pts, max(1.0, 0.5 * width))
        # the wall darkens less than the radio-opaque core: a darker tube with lighter walls
        img = img * (1.0 - 0.45 * contrast * cath_cov) * (1.0 - 0.6 * contrast * core)
    if device in ("guidewire", "both"):
        width = max(1.0, anatomy["guidewire_width_px"] * scale * rng.uniform(0.9, 1.1))
        pts = _device_path(rng, s, rng.uniform(0.7, 1.3) * s)
        wire_cov = _draw_polyline(s, k, pts, width)
        n_tip = max(2, len(pts) // 10)
        tip = _draw_polyline(s, k, pts[-n_tip:], 1.6 * width)
        wire_cov = np.maximum(wire_cov, tip)
        img = img * (1.0 - min(0.95, 1.2 * contrast) * wire_cov)

    image = to_uint8(_acquire(rng, img, anatomy, s))
    cath, wire = cath_cov >= 0.5, wire_cov >= 0.5
    masks = {"device": cath | wire, "catheter": cath, "guidewire": wire, "vessel": vessel_cov >= 0.5}
    return image, masks


def xray_image(
    rng: np.random.Generator,
    size: int,
    anatomy: Dict[str, Any],
    style: Optional[Dict[str, Any]] = None,
    target: str = "device",
    devices: Sequence[str] = SEGMENTATION_DEVICES,
) -> Tuple[np.ndarray, np.ndarray]:
    """The family renderer: a frame with a device drawn from ``devices`` and its ``target`` mask.

    ``style`` (the generic scanner style of :mod:`fedseg.data.synthetic`) is accepted for the family
    interface and not used: the X-ray acquisition chain is part of the site's ``anatomy``.

    Returns:
        image: uint8 ``(size, size)``; label: uint8 ``(size, size)`` in {0, 255}.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    device = devices[int(rng.integers(len(devices)))]
    image, masks = xray_frame(rng, size, anatomy, device)
    return image, masks[target].astype(np.uint8) * 255
