"""Drawing helpers shared by the built-in synthetic families (``families.py``: vessel, polyp; ``nuclei.py``;
``fundus.py``; ``xray.py``; ``volumes.py``): rounding of drawn parameters, the scanner style chain,
smooth noise fields, branching vessel trees. Imports nothing of the families, which all import it."""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Dict, Tuple

import numpy as np
from PIL import ImageDraw
from scipy import ndimage

__all__ = ["round_param", "apply_style", "to_uint8", "smooth_noise", "grow_vessel_trees"]


def round_param(x: float) -> float:
    """Round a drawn parameter so the value recorded in the datalist is exactly the value used."""
    return round(float(x), 4)


def apply_style(img: np.ndarray, style: Dict[str, Any], rng: np.random.Generator, pivot: float) -> np.ndarray:
    """Apply the scanner style to a float RGB image in [0, 1], shape (H, W, 3); returns float32.

    Order mirrors an acquisition chain: optics blur, sensor gain/offset/contrast, tone curve
    (gamma), then additive sensor noise.
    """
    if style["blur_sigma"] > 0:
        img = ndimage.gaussian_filter(img, sigma=(style["blur_sigma"], style["blur_sigma"], 0), mode="nearest")
    img = img * np.asarray(style["gain"], dtype=np.float32)
    img = (img - pivot) * style["contrast"] + pivot + style["brightness"]
    img = np.clip(img, 0.0, 1.0) ** style["gamma"]
    img = img + rng.normal(0.0, style["noise_sigma"], size=img.shape)
    return np.clip(img, 0.0, 1.0).astype(np.float32)


def to_uint8(img: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] (values outside are clipped) as uint8 in [0, 255], rounded to nearest; same shape."""
    return np.round(np.clip(img, 0.0, 1.0) * 255.0).astype(np.uint8)


def smooth_noise(rng: np.random.Generator, shape: Tuple[int, int], sigma: float) -> np.ndarray:
    """Gaussian-smoothed white noise rescaled to zero mean, unit std; shape ``shape``, float32.

    Large sigmas are filtered on a coarser grid and upsampled (bilinear): the field is smooth at
    that scale anyway, and a full-resolution filter with sigma ~ size/8 dominates the paper profile.
    """
    factor = int(sigma // 3) if sigma > 6 else 1
    if factor > 1:
        small_shape = (shape[0] // factor + 2, shape[1] // factor + 2)
        small = ndimage.gaussian_filter(rng.standard_normal(small_shape).astype(np.float32), sigma / factor, mode="wrap")
        n = ndimage.zoom(small, factor, order=1)[: shape[0], : shape[1]]
    else:
        n = ndimage.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma=max(sigma, 0.5), mode="wrap")
    return (n - n.mean()) / (n.std() + 1e-8)


def grow_vessel_trees(
    draw: ImageDraw.ImageDraw,
    rng: np.random.Generator,
    k: int,
    start: Tuple[float, float],
    fov: Tuple[float, float, float],
    size: int,
    anatomy: Dict[str, Any],
    area_budget: float,
    n_trunks: int,
) -> float:
    """Grow ``n_trunks`` branching vessel trees from ``start`` and draw them at ``k``x resolution.

    Each branch is a random walk whose heading turns by N(0, tortuosity) per step and whose width
    tapers geometrically down to a floor; it spawns a thinner, shorter child with probability
    ``branch_prob`` per step and ends at its drawn length or the FOV edge. Growth is breadth-first
    (trunks before capillaries) and stops once ``sum(step * width)`` — the drawn area in px^2 —
    reaches ``area_budget``, which is what keeps the vessel fraction in band.

    Coordinates are pixels of the ``size`` x ``size`` output; ``fov = (cx, cy, radius)``.
    Returns the area budget left (<= 0 when exhausted).
    """
    cx, cy, radius = fov
    step = max(0.75, size / 64.0)
    w0 = max(1.5, 0.015 * size * anatomy["vessel_width_scale"])
    w_min = max(1.1, 0.004 * size * anatomy["vessel_width_scale"])
    taper = 0.985
    base_angle = rng.uniform(0.0, 2.0 * math.pi)
    queue = deque()
    for t in range(n_trunks):
        angle = base_angle + 2.0 * math.pi * t / n_trunks + rng.normal(0.0, 0.3)
        length = rng.uniform(1.3, 2.0) * radius
        queue.append((start[0], start[1], angle, w0 * rng.uniform(0.8, 1.1), length, 0))
    while queue and area_budget > 0:
        x, y, angle, width, length, depth = queue.popleft()
        n_steps = max(1, int(length / step))
        turns = rng.normal(0.0, anatomy["tortuosity"], size=n_steps)
        branch_u = rng.random(n_steps)
        aux = rng.random((n_steps, 3))
        for i in range(n_steps):
            angle += turns[i]
            nx, ny = x + step * math.cos(angle), y + step * math.sin(angle)
            if (nx - cx) ** 2 + (ny - cy) ** 2 > (0.97 * radius) ** 2:
                break
            w = max(1, int(round(width * k)))
            draw.line([(x * k, y * k), (nx * k, ny * k)], fill=255, width=w)
            if w > 2:  # round joints so bends do not show notches
                draw.ellipse([nx * k - w / 2, ny * k - w / 2, nx * k + w / 2, ny * k + w / 2], fill=255)
            area_budget -= step * width
            if area_budget <= 0:
                break
            x, y = nx, ny
            if branch_u[i] < anatomy["branch_prob"] and depth < 6:
                side = 1.0 if aux[i, 0] < 0.5 else -1.0
                child_angle = angle + side * (0.4 + 0.7 * aux[i, 1])
                child_w = max(w_min, width * (0.5 + 0.3 * aux[i, 2]))
                child_len = (n_steps - i) * step * (0.3 + 0.5 * aux[i, 1])
                queue.append((x, y, child_angle, child_w, child_len, depth + 1))
            width = max(w_min, width * taper)
    return area_budget
