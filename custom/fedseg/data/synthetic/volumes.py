"""Built-in synthetic multi-site 3-D MR family ``"prostate3d"``: NIfTI volumes with a real affine and a two-zone label.

The 3-D counterpart of :mod:`fedseg.data.synthetic` for the multi-site prostate MRI setting (the NCI-ISBI / I2CVB /
PROMISE12 / Decathlon-style collections FedEvi-like papers split into sites): each site is a scanner and protocol,
each volume a T2-weighted axial stack around the prostate.

Anatomy is defined in **world coordinates** (RAS, millimetres), so an organ is as large in mm whatever a site's
voxel size; the volume is then sampled on the site's voxel grid and stored in the site's orientation:

* pelvic soft tissue of intermediate signal with smooth texture; a dark muscular sling (levator ani / obturator,
  the "outer body contour" of the crop) around the organ with brighter fat outside it; a bright periprostatic fat
  shell; the rectum behind the organ (dark wall, gas or gel in the lumen); the bladder above it (bright fluid);
* the prostate: an ellipsoid that narrows towards the apex (inferior) and is flattened posteriorly, outlined by a
  dark capsule, made of two zones —
  the **transition zone (TZ)**: a central ellipsoid shifted anteriorly and towards the base, plus the anterior
  part of the gland, intermediate signal with nodular (BPH-like) heterogeneity;
  the **peripheral zone (PZ)**: the rest of the gland, a posterior-lateral horseshoe around the TZ, bright and
  homogeneous (as on T2), thickest posteriorly and at the apex.

Label classes: 0 background, 1 PZ, 2 TZ (:data:`PROSTATE3D_LABEL_SPACE`); every volume contains both zones.

Per site (its own RNG, :func:`fedseg.data.synthetic.site_seed`), as the public multi-site collections differ:

* geometry: anisotropic voxel spacing (in-plane and slice thickness, :data:`VOLUME_PROFILES`), field of view in
  mm (so array shapes differ per site), table position (world origin), and the stored orientation (one of
  :data:`ORIENTATIONS`: RAS, LPS as ITK writes DICOM-derived volumes, LAS, in-plane axes swapped (PLS), slices
  stored head-to-foot (RAI)); the affine is always consistent with the array: a world point is the same anatomy in
  every orientation (the volume is built in RAS and reoriented with nibabel);
* acquisition ("style"): a smooth multiplicative bias field of per-site strength, optionally an endorectal-coil
  profile (bright near the rectum), intensity gain and offset (MR has no absolute units), Rician noise level;
* anatomy: the organ-width range (within :data:`ORGAN_WIDTH_BAND_MM`), organ proportions, tissue signal levels
  and the PZ-TZ contrast, TZ heterogeneity, texture strength.

Thick slices integrate the signal over the slice (partial volume: the image is the mean of sub-slice samples);
the label is the anatomy at the voxel centre, as a reader annotates the slice.

Everything is a pure function of ``(family, site, seed, profile, num_volumes, split_fractions)``; volume ``i``
has its own RNG stream (the same volume whatever the count). Layout written by :func:`generate_volume_site`::

    out_dir/prostate3d/<site>/images/000.nii.gz   float32 MR magnitude (whole numbers), (X, Y, Z), site's orientation
    out_dir/prostate3d/<site>/labels/000.nii.gz   uint8 class indices {0, 1, 2}, same shape and affine
    out_dir/prostate3d/<site>/datalist.json       written last; its presence marks a complete folder
"""

from __future__ import annotations

import copy
import gzip
import math
import os
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from scipy import ndimage

from ..datalist import write_json_atomic
from .drawing import round_param
from .files import (check_site_name, existing_datalist, generator_fields, numbered_names, prepare_site_folder,
                    remove_stale_files, seeded_splits, site_fingerprint, site_seed, split_counts)

__all__ = [
    "VOLUME_GENERATOR_VERSION",
    "VOLUME_FAMILIES",
    "VOLUME_PROFILES",
    "PROSTATE3D_LABEL_SPACE",
    "ORIENTATIONS",
    "ORGAN_WIDTH_BAND_MM",
    "FOV_BAND_MM",
    "generate_volume_site",
    "volume_family_label_space",
    "volume_family_fields",
]

#: bump whenever the generated voxels or the datalist layout change; part of the cache fingerprint
VOLUME_GENERATOR_VERSION = 1

VOLUME_FAMILIES: Tuple[str, ...] = ("prostate3d",)

#: the label space every prostate3d datalist declares; the label volumes store class indices (no label_values)
PROSTATE3D_LABEL_SPACE: Dict[str, Any] = {
    "labels": {"background": 0, "pz": 1, "tz": 2},
    "regions": {"prostate": ["pz", "tz"], "pz": ["pz"], "tz": ["tz"]},
}

#: per profile: volumes per site (range), the family's common target spacing (mm, RAS axis order x, y, z: every
#: site is resampled to it), and the native spacing bands a site's in-plane spacing and slice thickness are drawn
#: from. The target in-plane spacing sets the resampled in-plane size: FOV 64-80 mm -> tiny 26-32, default 51-64,
#: paper 128-160 voxels. The tiny profile samples coarser native grids (1.0-2.0 x 2.5-5.0 mm) so that its files
#: and generation stay small enough for unit tests; default and paper use clinical prostate T2 spacings.
VOLUME_PROFILES: Dict[str, Dict[str, Any]] = {
    "tiny": {
        "num_volumes": (6, 8),
        "target_spacing": (2.5, 2.5, 4.0),
        "inplane_spacing": (1.0, 2.0),
        "slice_thickness": (2.5, 5.0),
    },
    "default": {
        "num_volumes": (16, 24),
        "target_spacing": (1.25, 1.25, 3.0),
        "inplane_spacing": (0.4, 0.8),
        "slice_thickness": (1.25, 4.0),
    },
    "paper": {
        "num_volumes": (30, 60),
        "target_spacing": (0.5, 0.5, 1.5),
        "inplane_spacing": (0.4, 0.8),
        "slice_thickness": (1.25, 4.0),
    },
}

#: a site's field of view (mm): in-plane (left-right, anterior-posterior) and through-plane (superior-inferior)
FOV_BAND_MM: Dict[str, Tuple[float, float]] = {"inplane": (64.0, 80.0), "through_plane": (40.0, 70.0)}
#: every organ's left-right width (mm) lies in this band; a site's own range is a sub-band of it
ORGAN_WIDTH_BAND_MM: Tuple[float, float] = (30.0, 50.0)
#: stored orientations a site draws from (nibabel axis codes of the array axes; the slice axis is always last)
ORIENTATIONS: Tuple[str, ...] = ("RAS", "LPS", "LAS", "PLS", "RAI")


# ----------------------------------------------------------------------------------------------
# site draws
# ----------------------------------------------------------------------------------------------


def _draw_geometry(rng: np.random.Generator, profile: Dict[str, Any]) -> Dict[str, Any]:
    """A site's acquisition geometry. Spacing and FOV are in RAS axis order (x = left-right, y = anterior-posterior,
    z = superior-inferior); ``shape_ras`` is the array shape before the site's orientation is applied."""
    inplane = round_param(rng.uniform(*profile["inplane_spacing"]))
    thickness = round_param(rng.uniform(*profile["slice_thickness"]))
    fov_lr = rng.uniform(*FOV_BAND_MM["inplane"])
    fov_ap = max(FOV_BAND_MM["inplane"][0], fov_lr * rng.uniform(0.85, 1.0))
    fov_si = rng.uniform(*FOV_BAND_MM["through_plane"])
    spacing = (inplane, inplane, thickness)
    shape = tuple(int(round(f / s)) for f, s in zip((fov_lr, fov_ap, fov_si), spacing))
    orientation = ORIENTATIONS[int(rng.integers(len(ORIENTATIONS)))]
    return {
        "spacing_ras": list(spacing),
        "shape_ras": list(shape),
        # the FOV actually covered: a whole number of voxels
        "fov_mm": [round_param(n * s) for n, s in zip(shape, spacing)],
        "orientation": orientation,
        # scanner table position of the FOV centre (world origin is arbitrary in MR)
        "table_position_mm": [round_param(rng.uniform(-8, 8)), round_param(rng.uniform(-40, -10)), round_param(rng.uniform(-80, -30))],
    }


def _draw_style(rng: np.random.Generator) -> Dict[str, Any]:
    """A site's scanner chain: bias field, optional endorectal coil, gain/offset (arbitrary units), Rician noise."""
    return {
        "bias_strength": round_param(rng.uniform(0.05, 0.3)),
        "bias_scale_mm": round_param(rng.uniform(25.0, 45.0)),
        "endorectal_coil": bool(rng.random() < 0.35),
        "coil_gain": round_param(rng.uniform(0.4, 1.2)),
        "coil_falloff_mm": round_param(rng.uniform(10.0, 20.0)),
        "gain": round_param(math.exp(rng.uniform(math.log(150.0), math.log(2500.0)))),
        "offset": round_param(rng.uniform(0.0, 40.0)),
        # Rician noise sigma relative to a unit tissue level (before gain)
        "noise_sigma": round_param(rng.uniform(0.01, 0.05)),
    }


def _draw_prostate_anatomy(rng: np.random.Generator) -> Dict[str, Any]:
    """A site's population and tissue contrast: organ width range (mm), proportions, signal levels, texture."""
    lo_band, hi_band = ORGAN_WIDTH_BAND_MM
    centre = rng.uniform(lo_band + 5.0, hi_band - 5.0)
    half = rng.uniform(2.5, 5.0)
    pz = rng.uniform(0.65, 0.85)
    return {
        "organ_width_mm": [round_param(max(lo_band, centre - half)), round_param(min(hi_band, centre + half))],
        "ap_ratio": [round_param(rng.uniform(0.6, 0.7)), round_param(rng.uniform(0.72, 0.85))],
        "si_ratio": [round_param(rng.uniform(0.65, 0.75)), round_param(rng.uniform(0.8, 0.95))],
        "levels": {
            "tissue": round_param(rng.uniform(0.3, 0.42)),
            "fat": round_param(rng.uniform(0.6, 0.8)),
            "muscle": round_param(rng.uniform(0.12, 0.22)),
            "fluid": round_param(rng.uniform(0.85, 1.0)),
            "capsule": round_param(rng.uniform(0.15, 0.28)),
            "pz": round_param(pz),
            # T2: the peripheral zone is brighter than the transition zone; the gap is the site's zone contrast
            "tz": round_param(pz - rng.uniform(0.12, 0.3)),
        },
        "tz_heterogeneity": round_param(rng.uniform(0.06, 0.18)),
        "texture": round_param(rng.uniform(0.02, 0.06)),
    }


# ----------------------------------------------------------------------------------------------
# world-space noise fields
# ----------------------------------------------------------------------------------------------


def _interp_axis(arr: np.ndarray, axis: int, grid_start: float, step: float, coords: np.ndarray) -> np.ndarray:
    """Linearly interpolate ``arr`` along ``axis`` (a regular grid ``grid_start + step * j``) at ``coords`` (clamped
    to the grid); the other axes are unchanged."""
    n = arr.shape[axis]
    t = np.clip((np.asarray(coords, np.float64) - grid_start) / step, 0.0, n - 1.000001)
    j0 = np.floor(t).astype(np.int64)
    w = (t - j0).astype(np.float32)
    shape = [1] * arr.ndim
    shape[axis] = len(coords)
    w = w.reshape(shape)
    return np.take(arr, j0, axis=axis) * (1.0 - w) + np.take(arr, j0 + 1, axis=axis) * w


def _world_noise(rng: np.random.Generator, axes: Sequence[np.ndarray], sigma_mm: float) -> np.ndarray:
    """Zero-mean, unit-std Gaussian random field with correlation length ``sigma_mm``, sampled at the world
    coordinates ``axes = (xs, ys, zs)`` (mm, 1-D each); returns ``(len(xs), len(ys), len(zs))`` float32.

    The field lives on a regular world grid (step ``sigma_mm / 2``) and is interpolated separably onto the voxel
    centres, so its texture is a property of the anatomy, not of the voxel size.
    """
    step = sigma_mm / 2.0
    margin = 3.0 * sigma_mm
    starts = [float(a.min()) - margin for a in axes]
    counts = [int(math.ceil((float(a.max()) - float(a.min()) + 2 * margin) / step)) + 2 for a in axes]
    field = ndimage.gaussian_filter(rng.standard_normal(counts).astype(np.float32), sigma=2.0, mode="wrap")
    field = (field - field.mean()) / (field.std() + 1e-8)
    out = field
    for axis, (start, a) in enumerate(zip(starts, axes)):
        out = _interp_axis(out, axis, start, step, a)
    return out.astype(np.float32)


# ----------------------------------------------------------------------------------------------
# one volume
# ----------------------------------------------------------------------------------------------


def _draw_organ(
    rng: np.random.Generator, anatomy: Dict[str, Any], fov_mm: Sequence[float], thickness: float
) -> Dict[str, float]:
    """Per-volume organ geometry (mm, RAS, relative to the FOV centre) and the surrounding structures."""
    width = rng.uniform(*anatomy["organ_width_mm"])
    a = width / 2.0
    b = a * rng.uniform(*anatomy["ap_ratio"])
    # the stack is planned to cover the whole gland, apex to base, with a slice and a millimetre to spare
    c = min(a * rng.uniform(*anatomy["si_ratio"]), fov_mm[2] / 2 - thickness - 1.0)
    flat = rng.uniform(0.1, 0.3)  # posterior flattening: posterior semi-axis b / (1 + flat)
    # TZ: central ellipsoid shifted anteriorly (dy) and towards the base (dz), in units of the organ semi-axes;
    # its posterior edge stays >= 0.3 b in front of the organ's posterior surface (the PZ's posterior thickness)
    dy, dz = rng.uniform(0.12, 0.28), rng.uniform(0.1, 0.25)
    tz_b = min(rng.uniform(0.5, 0.68), 1.0 / (1.0 + flat) + dy - 0.3)
    # in-plane jitter keeps the organ (and its fat shell) inside the FOV; it is <= 50 mm in a >= 64 mm FOV
    room_x = max(0.0, fov_mm[0] / 2 - a - 5.0)
    room_y = max(0.0, fov_mm[1] / 2 - b - 5.0)
    return {
        "a": a, "b": b, "c": c, "flat": flat,
        "taper": rng.uniform(0.15, 0.35),
        "tz_a": rng.uniform(0.5, 0.7), "tz_b": tz_b, "tz_c": rng.uniform(0.6, 0.8), "tz_dy": dy, "tz_dz": dz,
        # the anterior fibromuscular part of the gland counts as TZ in two-zone labels: v above this is TZ
        "anterior_cut": rng.uniform(0.55, 0.75),
        "x0": rng.uniform(-1, 1) * min(room_x, 6.0),
        "y0": rng.uniform(-0.5, 1) * min(room_y, 6.0),
        "z0": rng.uniform(-1, 1) * min(3.0, max(0.0, fov_mm[2] / 2 - c - thickness - 1.0)),
        "fat_shell": rng.uniform(2.0, 4.5),
        "rectum_gap": rng.uniform(1.5, 4.0), "rectum_r": rng.uniform(8.0, 12.0), "rectum_wall": rng.uniform(2.5, 4.0),
        "rectum_tilt": rng.uniform(-0.15, 0.15), "rectum_gas": float(rng.random() < 0.5),
        "bladder_r": rng.uniform(15.0, 28.0), "bladder_gap": rng.uniform(1.0, 4.0),
        "sling_rx": rng.uniform(0.4, 0.47) * fov_mm[0], "sling_ry": rng.uniform(0.38, 0.45) * fov_mm[1],
        "sling_width": rng.uniform(3.0, 6.0),
    }


def _organ_rho(x, y, z, g: Dict[str, float]):
    """``(rho, u, v, w)``: the gland's normalised radius (<= 1 inside) and the point's offsets from the gland centre
    in semi-axis units (``u`` left-right, ``v`` anterior-posterior before flattening, ``w`` superior-inferior).

    The gland is an ellipsoid whose in-plane cross-section shrinks linearly towards the apex (``taper``) and whose
    posterior half is flattened; its widest cross-section is at ``z0`` (width ``2 a`` exactly).
    """
    u = (x - g["x0"]) / g["a"]
    v = (y - g["y0"]) / g["b"]
    w = (z - g["z0"]) / g["c"]
    shrink = 1.0 - g["taper"] * np.clip(-w, 0.0, 1.0)
    v_flat = np.where(v < 0, v * (1.0 + g["flat"]), v)
    rho = np.sqrt((u / shrink) ** 2 + (v_flat / shrink) ** 2 + w**2)
    return rho, u, v, w


def _zones(x, y, z, g: Dict[str, float]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rho_organ, organ, tz)``: the gland's normalised radius and boolean gland / TZ masks at world points."""
    rho, u, v, w = _organ_rho(x, y, z, g)
    organ = rho <= 1.0
    rho_tz = np.sqrt((u / g["tz_a"]) ** 2 + ((v - g["tz_dy"]) / g["tz_b"]) ** 2 + ((w - g["tz_dz"]) / g["tz_c"]) ** 2)
    tz = organ & ((rho_tz <= 1.0) | (v >= g["anterior_cut"]))
    return rho, organ, tz


def _ramp(signed_mm: np.ndarray, width_mm: float) -> np.ndarray:
    """Soft inside-indicator from a signed distance (negative inside), linear over ``width_mm``: anti-aliased edges."""
    return np.clip(0.5 - signed_mm / width_mm, 0.0, 1.0)


def _tissue(x, y, z, g, levels, fields, edge_mm: float) -> np.ndarray:
    """Noise-free T2 signal (unit levels) at world points broadcast from ``x (X,1,1)``, ``y (1,Y,1)``, ``z (1,1,Z)``.

    ``fields``: ``texture`` and ``nodules`` unit random fields, shape (X, Y, Z), and their amplitudes.
    """
    tex, nod, tex_amp, het = fields["texture"], fields["nodules"], fields["texture_amp"], fields["heterogeneity"]
    rho, organ, tz = _zones(x, y, z, g)
    r_small = min(g["b"] / (1.0 + g["flat"]), g["a"])  # mm per unit rho, conservatively

    # pelvic background, the dark muscular sling and the fat outside it
    img = np.full(np.broadcast_shapes(x.shape, y.shape, z.shape), levels["tissue"], np.float32)
    sling_rho = np.sqrt(((x - g["x0"]) / g["sling_rx"]) ** 2 + ((y - g["y0"] + 0.2 * g["b"]) / g["sling_ry"]) ** 2)
    sling_r = 0.5 * (g["sling_rx"] + g["sling_ry"])
    d_sling = (sling_rho - 1.0) * sling_r  # mm, signed
    outside = _ramp(-d_sling, edge_mm)
    img = img * (1.0 - outside) + levels["fat"] * outside
    # the sling is a U open anteriorly (levator ani / obturator internus); the retropubic space in front is fat
    v_sling = (y - g["y0"] + 0.2 * g["b"]) / g["sling_ry"]
    band = _ramp(np.abs(d_sling) - g["sling_width"] / 2.0, edge_mm) * np.clip((0.5 - v_sling) / 0.4, 0.0, 1.0)
    img = img * (1.0 - band) + levels["muscle"] * band
    img = img * (1.0 + tex_amp * tex)

    # periprostatic fat shell, then the gland: capsule, PZ, TZ with nodular heterogeneity
    d_organ = (rho - 1.0) * r_small
    # periprostatic fat and venous plexus: a shell of irregular thickness, thin behind the gland
    posterior_thinning = 0.5 + 0.5 * np.clip((y - g["y0"]) / g["b"] + 0.5, 0.0, 1.0)
    thickness = g["fat_shell"] * np.clip(1.0 + 0.5 * tex, 0.2, 1.8) * posterior_thinning
    shell = _ramp(d_organ - thickness, edge_mm)
    img = img * (1.0 - shell) + levels["fat"] * (1.0 + tex_amp * tex) * shell
    inside = _ramp(d_organ, edge_mm)
    zone = np.where(tz, levels["tz"] * (1.0 + het * nod), levels["pz"] * (1.0 + 0.3 * tex_amp * tex))
    capsule = np.exp(-((d_organ / 0.8) ** 2))
    img = img * (1.0 - inside) + zone * inside
    img = img * (1.0 - 0.7 * capsule) + levels["capsule"] * 0.7 * capsule

    # rectum behind the gland (a tube along z, slightly tilted), bladder above it
    yr = g["y0"] - g["b"] / (1.0 + g["flat"]) - g["rectum_gap"] - g["rectum_r"] + g["rectum_tilt"] * (z - g["z0"])
    d_rect = np.sqrt((x - g["x0"]) ** 2 + (y - yr) ** 2) - g["rectum_r"]
    rect_out = _ramp(d_rect, edge_mm)
    lumen = _ramp(d_rect + g["rectum_wall"], edge_mm)
    lumen_level = 0.05 if g["rectum_gas"] else levels["fluid"] * 0.8
    img = img * (1.0 - rect_out) + levels["muscle"] * rect_out
    img = img * (1.0 - lumen) + lumen_level * lumen
    zb = g["z0"] + g["c"] + g["bladder_gap"] + g["bladder_r"]
    d_blad = np.sqrt((x - g["x0"]) ** 2 + (y - g["y0"] - 0.2 * g["b"]) ** 2 + (z - zb) ** 2) - g["bladder_r"]
    blad = _ramp(d_blad, edge_mm) * (1.0 - inside)
    img = img * (1.0 - blad) + levels["fluid"] * blad
    return img.astype(np.float32)


def _connected_zones(label: np.ndarray, max_passes: int = 4) -> np.ndarray:
    """Give each zone one connected piece (face connectivity), as a reader delineates it: where the TZ nearly reaches
    the gland surface (base, anterior horns) the sampled PZ shell breaks into voxel islands; an island of one zone
    becomes the other zone (the gland, PZ + TZ, is unchanged). Returns a new uint8 array of the same shape."""
    label = label.copy()
    for _ in range(max_passes):
        changed = False
        for zone, other in ((1, 2), (2, 1)):
            pieces, n = ndimage.label(label == zone)
            if n > 1:
                sizes = np.bincount(pieces.ravel())[1:]
                label[(pieces > 0) & (pieces != 1 + int(np.argmax(sizes)))] = other
                changed = True
        if not changed:
            break
    return label


def _render_volume(
    rng: np.random.Generator, geometry: Dict[str, Any], style: Dict[str, Any], anatomy: Dict[str, Any]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One MR volume and its label in RAS voxel order, with the RAS affine.

    Returns:
        image: float32 ``shape_ras``; label: uint8 ``shape_ras`` (0 background, 1 PZ, 2 TZ); affine: (4, 4).
    """
    spacing = np.asarray(geometry["spacing_ras"], np.float64)
    shape = tuple(geometry["shape_ras"])
    fov = np.asarray(geometry["fov_mm"], np.float64)
    # the FOV is centred on the table position plus a per-volume set-up offset; the organ is placed relative to it
    centre = np.asarray(geometry["table_position_mm"], np.float64) + rng.normal(0.0, [2.0, 2.0, 3.0])
    origin = centre - (np.asarray(shape) - 1) / 2.0 * spacing
    axes = [origin[d] + spacing[d] * np.arange(shape[d]) for d in range(3)]
    rel = [a - centre[d] for d, a in enumerate(axes)]  # world minus FOV centre: the anatomy's frame
    g = _draw_organ(rng, anatomy, fov, float(spacing[2]))

    # a thick slice integrates the signal across its thickness (partial volume): the tissue model is sampled at the
    # centres of three sub-slabs and averaged; the random fields are sampled there too
    n_sub = 3 if spacing[2] > 1.5 * spacing[0] else 1
    offsets = (np.arange(n_sub) - (n_sub - 1) / 2.0) / n_sub * spacing[2]
    z_all = np.concatenate([rel[2] + o for o in offsets])
    texture = _world_noise(rng, (rel[0], rel[1], z_all), 4.0)
    nodules = _world_noise(rng, (rel[0], rel[1], z_all), 2.5)
    bias = _world_noise(rng, (rel[0], rel[1], rel[2]), style["bias_scale_mm"])

    x, y = rel[0][:, None, None], rel[1][None, :, None]
    nz = shape[2]
    img = np.zeros(shape, np.float32)
    for k, o in enumerate(offsets):
        fields = {
            "texture": texture[:, :, k * nz : (k + 1) * nz],
            "nodules": nodules[:, :, k * nz : (k + 1) * nz],
            "texture_amp": anatomy["texture"],
            "heterogeneity": anatomy["tz_heterogeneity"],
        }
        img += _tissue(x, y, (rel[2] + o)[None, None, :], g, anatomy["levels"], fields, edge_mm=float(spacing[0]))
    img /= n_sub

    _, organ, tz = _zones(x, y, rel[2][None, None, :], g)
    label = _connected_zones(np.where(tz, 2, np.where(organ, 1, 0)).astype(np.uint8))

    # scanner chain: bias field (smooth, multiplicative; an endorectal coil brightens the tissue near the rectum),
    # gain, Rician magnitude noise, offset
    gain_field = np.exp(style["bias_strength"] * bias)
    if style["endorectal_coil"]:
        yr = g["y0"] - g["b"] / (1.0 + g["flat"]) - g["rectum_gap"] - g["rectum_r"]
        d = np.sqrt((x - g["x0"]) ** 2 + (y - yr) ** 2)
        gain_field = gain_field * (1.0 + style["coil_gain"] * np.exp(-d / style["coil_falloff_mm"]))
    signal = img * gain_field * style["gain"]
    sigma = style["noise_sigma"] * style["gain"]
    real = signal + rng.normal(0.0, sigma, size=shape)
    imag = rng.normal(0.0, sigma, size=shape)
    # scanners store integer magnitudes; whole numbers in float32 also halve the gzip size of a noisy volume
    image = np.round(np.sqrt(real**2 + imag**2) + style["offset"]).astype(np.float32)

    affine = np.eye(4)
    affine[:3, :3] = np.diag(spacing)
    affine[:3, 3] = origin
    return image, label, affine


# ----------------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------------


def _nifti(arr: np.ndarray, affine_ras: np.ndarray, orientation: str):
    """A NIfTI-1 image of a RAS-ordered array, reoriented to ``orientation`` (nibabel axis codes, e.g. ``"LPS"``).

    ``as_reoriented`` flips/permutes the array and updates the affine together, so every voxel keeps its world
    position; qform and sform both carry the affine (code 1, scanner), units mm.
    """
    import nibabel as nib
    from nibabel.orientations import axcodes2ornt, ornt_transform

    img = nib.Nifti1Image(arr, affine_ras)
    img = img.as_reoriented(ornt_transform(axcodes2ornt(("R", "A", "S")), axcodes2ornt(tuple(orientation))))
    img = nib.Nifti1Image(np.ascontiguousarray(img.dataobj), img.affine)
    img.set_qform(img.affine, code=1)
    img.set_sform(img.affine, code=1)
    img.header.set_xyzt_units("mm")
    return img


def _save_nifti_atomic(img, path: Path) -> None:
    """Write ``path`` (``.nii.gz``) via temp file + ``os.replace``; gzip with mtime 0 so the bytes are reproducible
    (level 1: noisy voxels barely compress further, and level 6 costs several times the time)."""
    data = gzip.compress(img.to_bytes(), compresslevel=1, mtime=0)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def generate_volume_site(
    family: str,
    site: str,
    out_dir: str | os.PathLike,
    seed: int = 0,
    profile: str = "default",
    num_volumes: Optional[int] = None,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
) -> Path:
    """Generate (or reuse) one site's synthetic MR volumes, label volumes and datalist.

    Args:
        family: one of :data:`VOLUME_FAMILIES` (``"prostate3d"``).
        site: any name without path separators (``"site-1"``).
        out_dir: root folder; files go to ``out_dir/<family>/<site>/``.
        seed: federation seed; with ``family`` and ``site`` it determines everything.
        profile: key of :data:`VOLUME_PROFILES` (volume count, spacing bands, the family's target spacing).
        num_volumes: override the drawn number of volumes (>= 3); the site's draws do not change.
        split_fractions: (training, validation, test) fractions; each split gets at least one volume.

    Returns:
        Path of ``datalist.json``; its paths are relative to its folder. Besides the splits it declares the label
        space (``labels``, ``regions``), ``spatial_dims: 3``, ``modality: "MR"``, the family's ``target_spacing``
        (mm, RAS axis order), and the site's ``geometry`` (``spacing`` and ``orientation`` as stored), ``style``
        and ``anatomy``.

    The call is idempotent: a datalist with the same fingerprint whose files all exist means nothing is rewritten.

    Raises:
        ValueError: naming the unknown family or profile, the invalid site name, volume count or split fractions.
    """
    if family not in VOLUME_FAMILIES:
        raise ValueError(f"unknown volume family {family!r}; expected one of {VOLUME_FAMILIES}")
    if profile not in VOLUME_PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {tuple(VOLUME_PROFILES)}")
    check_site_name(site)
    prof = VOLUME_PROFILES[profile]

    base_seed = site_seed(family, site, seed)
    site_rng = np.random.default_rng([base_seed, 0])
    # the count is drawn first so that the site's geometry, style and anatomy do not depend on num_volumes
    drawn = int(site_rng.integers(prof["num_volumes"][0], prof["num_volumes"][1] + 1))
    if num_volumes is not None and (isinstance(num_volumes, bool) or int(num_volumes) != num_volumes):
        raise ValueError(f"num_volumes must be an integer >= 3, got {num_volumes!r}")
    n = int(num_volumes) if num_volumes is not None else drawn
    if n < 3:
        raise ValueError(f"num_volumes must be >= 3 (one volume per split at least), got {n}")
    n_train, n_val, n_test = split_counts(n, split_fractions)
    geometry = _draw_geometry(site_rng, prof)
    style = _draw_style(site_rng)
    anatomy = _draw_prostate_anatomy(site_rng)

    site_dir = Path(out_dir) / family / site
    datalist_path = site_dir / "datalist.json"
    fingerprint = site_fingerprint({"generator_version": VOLUME_GENERATOR_VERSION, "family": family}, site, seed,
                                   profile, split_fractions, num_volumes=n)
    if existing_datalist(datalist_path, fingerprint):
        return datalist_path

    prepare_site_folder(site_dir)
    names = numbered_names(n, ".nii.gz")
    stored_affine, stored_shape = None, None
    for i, name in enumerate(names):
        # one RNG stream per volume: volume i is the same whatever n is
        image, label, affine = _render_volume(np.random.default_rng([base_seed, 1, i]), geometry, style, anatomy)
        image_nii = _nifti(image, affine, geometry["orientation"])
        _save_nifti_atomic(image_nii, site_dir / "images" / name)
        _save_nifti_atomic(_nifti(label, affine, geometry["orientation"]), site_dir / "labels" / name)
        stored_affine, stored_shape = image_nii.affine, image_nii.shape
    remove_stale_files(site_dir, names, ".nii.gz")

    import nibabel as nib

    datalist = {
        "name": f"fedseg-synthetic-{family}-{site}",
        **generator_fields(fingerprint),
        **volume_family_fields(family, profile),
        "geometry": {
            # as stored (array axis order): what the NIfTI header's pixdim and affine say
            "spacing": [round_param(s) for s in nib.affines.voxel_sizes(stored_affine)],
            "orientation": geometry["orientation"],
            "shape": [int(v) for v in stored_shape],
            # in RAS axis order (x left-right, y anterior-posterior, z superior-inferior)
            **geometry,
        },
        "style": style,
        "anatomy": anatomy,
        **seeded_splits(names, base_seed, (n_train, n_val, n_test)),
    }
    return write_json_atomic(datalist_path, datalist)


def volume_family_label_space(family: str) -> Dict[str, Any]:
    """The datalist label fields (``labels``, ``regions``) every site of a built-in volume family declares."""
    if family not in VOLUME_FAMILIES:
        raise ValueError(f"unknown volume family {family!r}; expected one of {VOLUME_FAMILIES}")
    return copy.deepcopy(PROSTATE3D_LABEL_SPACE)


def volume_family_fields(family: str, profile: str = "default") -> Dict[str, Any]:
    """The top-level datalist fields every site of a built-in volume family declares under ``profile``, without
    generating anything: the label space (``labels``, ``regions``), ``spatial_dims`` 3, ``modality`` and the family's
    ``target_spacing`` (mm, RAS axis order x, y, z; the profile's, the same for every site)."""
    if profile not in VOLUME_PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {tuple(VOLUME_PROFILES)}")
    return {
        **volume_family_label_space(family),
        "spatial_dims": 3,
        "modality": "MR",
        "target_spacing": list(VOLUME_PROFILES[profile]["target_spacing"]),
    }
