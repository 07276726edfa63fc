"""3-D volumes (CT / MRI): their geometry, the job's volume settings, and the MONAI steps that use them.

A datalist of volumes declares at its top level (a job's ``train_config`` may set the same keys; they win)::

    "spatial_dims":     3                  # the data are volumes (NIfTI, with an affine)
    "target_spacing":   [1.0, 1.0, 3.0]    # mm; every volume is resampled to it (Spacingd: image bilinear,
                                           # label nearest); a value <= 0 keeps that axis' own spacing
    "modality":         "MR"               # "MR": z-score of the non-zero voxels, per volume and channel
                                           # (NormalizeIntensityd); "CT": a declared window (ScaleIntensityRanged)
    "intensity_window": [-100, 300]        # CT only: Hounsfield units mapped to [0, 1], clipped
    "image_channels":   ["T2", "ADC"]      # 4-D images (several sequences / echoes): one name per volume of the 4th axis
    "orientation":      "RAS"              # every volume is reoriented to it first (Orientationd)

Nothing is guessed per volume: a 4-D image without declared ``image_channels`` is an error, a CT job without a window is an
error, and the spacing of the network's grid is the job's, not each scan's. A site's volumes keep their own geometry
for evaluation: predictions are inverted back (``Invertd``) to each scan's orientation, spacing and shape before any
metric, and distances are in mm from its header.

Image and label must share shape and affine (within :data:`AFFINE_TOLERANCE` mm); otherwise the error names both files
and both geometries. NRRD / MHA / MetaImage are read through MONAI's ITK reader when the optional ``itk`` package is
installed (not a fedseg dependency); without it they are refused with that hint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .datalist import DatalistError

__all__ = [
    "AFFINE_TOLERANCE",
    "VOLUME_SUFFIXES",
    "VolumeGeometry",
    "read_geometry",
    "check_volume_pair",
    "is_volume_job",
    "resolve_volume_settings",
    "federation_volume_config",
    "intensity_transforms",
    "crop_shape",
]

#: the largest difference (mm, or the affine's unitless entries) between an image's and its label's affine
AFFINE_TOLERANCE = 1e-3
#: volume formats: NIfTI through nibabel (always); NRRD / MHA / MetaImage through MONAI's ITKReader (needs ``itk``)
VOLUME_SUFFIXES = (".nii", ".nii.gz")
ITK_SUFFIXES = (".nrrd", ".nhdr", ".mha", ".mhd")
MODALITIES = ("MR", "CT")
#: keys a volume job may take from its datalist when the job's train_config leaves them None
VOLUME_KEYS = ("spatial_dims", "target_spacing", "modality", "intensity_window", "image_channels", "orientation")


class VolumeGeometry:
    """Shape (spatial, then channels for 4-D), affine and voxel spacing of a volume file, from its header."""

    def __init__(self, path: Path, shape: Tuple[int, ...], affine: np.ndarray):
        self.path = Path(path)
        self.shape = tuple(int(s) for s in shape)
        self.affine = np.asarray(affine, dtype=np.float64)

    @property
    def spatial_shape(self) -> Tuple[int, ...]:
        return self.shape[:3]

    @property
    def channels(self) -> int:
        """Volumes along a 4th axis (1 for a plain 3-D volume)."""
        return int(np.prod(self.shape[3:])) if len(self.shape) > 3 else 1

    @property
    def spacing(self) -> Tuple[float, ...]:
        """Voxel size in mm per axis: the norms of the affine's columns."""
        return tuple(float(s) for s in np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0)))

    @property
    def axcodes(self) -> str:
        import nibabel as nib

        return "".join(nib.aff2axcodes(self.affine))

    def describe(self) -> str:
        spacing = " x ".join(f"{s:.3g}" for s in self.spacing)
        origin = ", ".join(f"{o:.4g}" for o in self.affine[:3, 3])
        return f"shape {self.shape}, spacing {spacing} mm, orientation {self.axcodes}, origin ({origin})"


def read_geometry(path: str | os.PathLike, what: str = "image") -> VolumeGeometry:
    """The header geometry of a volume file (nothing decoded).

    Raises:
        DatalistError: missing / unreadable file, or a format that needs the optional ``itk`` package.
    """
    path = Path(path)
    if not path.is_file():
        raise DatalistError(f"{what} file not found: {path}")
    name = str(path).lower()
    if name.endswith(ITK_SUFFIXES):
        try:
            import itk  # noqa: F401  (optional: MONAI's ITKReader)
        except ImportError:
            raise DatalistError(
                f"{what} {path}: NRRD / MHA volumes are read through MONAI's ITKReader, which needs the optional "
                "package itk (pip install itk); or convert the volume to NIfTI"
            ) from None
        from monai.data import ITKReader

        reader = ITKReader()
        img = reader.read(str(path))
        _, meta = reader.get_data(img)
        return VolumeGeometry(path, tuple(int(s) for s in meta["spatial_shape"]), np.asarray(meta["affine"]))
    if not name.endswith(VOLUME_SUFFIXES):
        raise DatalistError(f"{what} {path} is not a volume file (expected {VOLUME_SUFFIXES + ITK_SUFFIXES})")
    import nibabel as nib

    try:
        img = nib.load(str(path))
        return VolumeGeometry(path, img.shape, img.affine)
    except Exception as exc:  # nibabel raises many types for a file that is not NIfTI
        raise DatalistError(f"cannot read {what} {path}: {type(exc).__name__}: {exc}") from exc


def check_volume_pair(image: str | os.PathLike, label: str | os.PathLike, image_channels: Optional[Sequence[str]] = None,
                      tolerance: float = AFFINE_TOLERANCE) -> Tuple[VolumeGeometry, VolumeGeometry]:
    """Image and label are volumes of one geometry: same spatial shape, affines equal within ``tolerance``; a 4-D
    image has exactly the declared ``image_channels``; the label is 3-D.

    Raises:
        DatalistError: naming both files and both geometries (or the file and what it needs).
    """
    img, lab = read_geometry(image, "image"), read_geometry(label, "label")
    for geo, what in ((img, "image"), (lab, "label")):
        if len(geo.shape) < 3 or min(geo.spatial_shape) < 2:
            raise DatalistError(
                f"{what} {geo.path} is not a volume ({geo.describe()}): a 2-D file in a 3-D job; give the job 2-D "
                "images (spatial_dims 2) or this site volumes"
            )
    if len(lab.shape) > 3 and lab.channels != 1:
        raise DatalistError(f"label {lab.path} has {lab.channels} volumes along a 4th axis ({lab.describe()}); a label is one volume")
    channels = image_channels
    if img.channels > 1:
        if not channels:
            raise DatalistError(
                f"image {img.path} is 4-D with {img.channels} volumes ({img.describe()}); declare them as channels in the "
                'datalist (e.g. "image_channels": ["T2", "ADC"]) or give one volume per file'
            )
        if len(channels) != img.channels:
            raise DatalistError(f"image {img.path} has {img.channels} channels but the datalist declares {len(channels)}: {list(channels)}")
    elif channels and len(channels) > 1:
        raise DatalistError(f"image {img.path} is a single volume but the datalist declares {len(channels)} image_channels {list(channels)}")
    if img.spatial_shape != lab.spatial_shape or not np.allclose(img.affine, lab.affine, atol=tolerance, rtol=0):
        raise DatalistError(
            f"geometry mismatch: image {img.path} has {img.describe()}, label {lab.path} has {lab.describe()} "
            f"(shapes must match and affines agree within {tolerance})"
        )
    return img, lab


def is_volume_job(train_config: Optional[Mapping[str, Any]] = None, datalist: Optional[Mapping[str, Any]] = None) -> bool:
    """Whether the data are volumes: ``spatial_dims`` 3 or ``spatial_mode`` "slices" (config first, then datalist)."""
    cfg, info = train_config or {}, datalist or {}
    dims = cfg.get("spatial_dims") or info.get("spatial_dims") or 2
    mode = cfg.get("spatial_mode") or info.get("spatial_mode")
    return int(dims) == 3 or mode == "slices"


def resolve_volume_settings(train_config: Mapping[str, Any], datalist: Mapping[str, Any], where: str = "") -> Dict[str, Any]:
    """The volume keys of a job at one site: the config's value where set, else the datalist's, checked.

    Returns:
        ``{"spatial_dims": 3, "target_spacing": [3 floats], "modality", "intensity_window", "image_channels", "orientation"}``.

    Raises:
        ValueError: a missing ``target_spacing``, an unknown modality, CT without a window, a datalist value that
            contradicts the job's (both named), malformed values.
    """
    out: Dict[str, Any] = {}
    for key in VOLUME_KEYS:
        job, data = train_config.get(key), datalist.get(key)
        if job is not None and data is not None and _norm(job) != _norm(data):
            raise ValueError(f"{key} {where}: the datalist declares {data!r}, the job's train_config {job!r}; they must agree")
        out[key] = job if job is not None else data
    out["spatial_dims"] = 3
    spacing = out["target_spacing"]
    if spacing is None:
        raise ValueError(
            f"target_spacing {where}: a volume job must declare the voxel spacing (mm) every volume is resampled to, e.g. "
            '"target_spacing": [1.0, 1.0, 3.0] in the datalist or --set \'target_spacing=[1,1,3]\' (<= 0 keeps an axis)'
        )
    spacing = [float(spacing)] * 3 if isinstance(spacing, (int, float)) else [float(s) for s in spacing]
    if len(spacing) != 3:
        raise ValueError(f"target_spacing {where}: expected three numbers (mm), got {out['target_spacing']!r}")
    out["target_spacing"] = spacing
    modality = out["modality"] or "MR"
    if modality not in MODALITIES:
        raise ValueError(f"modality {modality!r} {where}: expected one of {MODALITIES}")
    out["modality"] = modality
    window = out["intensity_window"]
    if modality == "CT":
        if window is None or len(window) != 2 or not float(window[0]) < float(window[1]):
            raise ValueError(f"intensity_window {where}: a CT job must declare its window [low, high] (HU), got {window!r}")
        out["intensity_window"] = [float(window[0]), float(window[1])]
    out["orientation"] = out["orientation"] or "RAS"
    names = out["image_channels"]
    if names is not None and (isinstance(names, str) or not names or not all(isinstance(c, str) for c in names)):
        raise ValueError(f"image_channels {where}: expected a list of channel names, got {names!r}")
    return out


def federation_volume_config(datalists: Optional[Mapping[str, Any]] = None, family_fields: Optional[Mapping[str, Any]] = None,
                             explicit: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The volume ``train_config`` fields of a federation, checked before any job starts: every site's datalist
    declares volumes or none does, and all agree on ``target_spacing``, ``modality``, ``intensity_window``,
    ``image_channels`` and ``orientation`` (the network's input is defined by them).

    Args:
        datalists: ``{site: datalist path}``.
        family_fields: the datalist fields of a built-in volume family (instead of ``datalists``).
        explicit: the user's ``train_config`` overrides; a job that sets ``spatial_dims`` 3 makes 2-D datalists an
            error too.

    Returns:
        ``{}`` for 2-D data; else ``spatial_dims`` 3, ``in_channels`` (the declared channels, else 1) and every volume
        key the sites declare.

    Raises:
        DatalistError: naming both datalists that disagree (or a 2-D and a volume site).
    """
    from .datalist import read_datalist_json

    explicit = dict(explicit or {})
    if datalists:
        infos = {}
        for site, path in datalists.items():
            resolved, info = read_datalist_json(path)
            infos[f"site {site}'s datalist {resolved}"] = info
    elif family_fields:
        infos = {"the built-in family": dict(family_fields)}
    else:
        return {}
    volume = {name: is_volume_job(explicit, info) for name, info in infos.items()}
    if not any(volume.values()):
        return {}
    if not all(volume.values()):
        flat = [n for n, v in volume.items() if not v]
        vol = [n for n, v in volume.items() if v]
        raise DatalistError(f"{vol[0]} declares volumes (spatial_dims 3) but {flat[0]} does not; one job takes one kind of data")
    out: Dict[str, Any] = {"spatial_dims": 3}
    for key in VOLUME_KEYS[1:]:
        values = {name: info.get(key) for name, info in infos.items() if info.get(key) is not None}
        distinct = {json_key(v) for v in values.values()}
        if len(distinct) > 1:
            (a, va), *others = values.items()
            b, vb = next((n, v) for n, v in others if json_key(v) != json_key(va))
            raise DatalistError(f"{key} differs: {a} declares {va!r}, {b} declares {vb!r}; all sites of a job must agree")
        if values and explicit.get(key) is None:
            out[key] = next(iter(values.values()))
    if explicit.get("in_channels") is None or explicit.get("in_channels") == 3:  # 3 = the RGB default of 2-D jobs
        names = explicit.get("image_channels") or out.get("image_channels")
        out["in_channels"] = len(names) if names else 1
    modes = {info.get("spatial_mode") for info in infos.values()} - {None}
    if len(modes) == 1 and explicit.get("spatial_mode") is None:
        out["spatial_mode"] = modes.pop()
    return out


def json_key(value: Any) -> str:
    import json

    return json.dumps(_norm(value), sort_keys=True)


def _norm(value: Any) -> Any:
    return [float(v) for v in value] if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value) else value


def intensity_transforms(modality: str = "MR", window: Optional[Sequence[float]] = None, keys: str = "image") -> List[Any]:
    """The intensity step of a modality: MR -> ``NormalizeIntensityd`` (z-score of the non-zero voxels of each volume and
    channel: MR has no absolute units), CT -> ``ScaleIntensityRanged`` of the declared window to [0, 1], clipped."""
    from monai.transforms import NormalizeIntensityd, ScaleIntensityRanged

    if modality == "CT":
        if window is None:
            raise ValueError("a CT job needs intensity_window [low, high]")
        return [ScaleIntensityRanged(keys=keys, a_min=float(window[0]), a_max=float(window[1]), b_min=0.0, b_max=1.0, clip=True)]
    if modality == "MR":
        return [NormalizeIntensityd(keys=keys, nonzero=True, channel_wise=True)]
    raise ValueError(f"modality {modality!r}: expected one of {MODALITIES}")


def crop_shape(patch_size: Any, spatial_mode: str = "patch", slice_axis: int = 2) -> List[int]:
    """The crop / sliding-window shape of a volume job: ``patch_size`` as three numbers in 3-D (one number = a cube), or
    in slice mode the in-plane patch (one or two numbers) with 1 on ``slice_axis``."""
    sizes = [int(patch_size)] if isinstance(patch_size, (int, float)) else [int(p) for p in patch_size]
    if spatial_mode == "slices":
        if len(sizes) == 3:
            sizes = [s for i, s in enumerate(sizes) if i != int(slice_axis)]
        plane = sizes * 2 if len(sizes) == 1 else sizes
        if len(plane) != 2:
            raise ValueError(f"patch_size {patch_size!r}: slice mode takes one or two in-plane sizes")
        shape = list(plane)
        shape.insert(int(slice_axis), 1)
        return shape
    shape = sizes * 3 if len(sizes) == 1 else sizes
    if len(shape) != 3:
        raise ValueError(f"patch_size {patch_size!r}: a 3-D job takes one number or three")
    return shape


class CheckVolumeGeometryd:
    """MONAI-style dict transform: image and label of one item share one geometry (shape and affine within
    ``tolerance``), after loading and before any resampling; the error names both files and geometries.
    Items without a label pass (inference)."""

    def __init__(self, keys: Sequence[str] = ("image", "label"), tolerance: float = AFFINE_TOLERANCE):
        self.keys = tuple(keys)
        self.tolerance = float(tolerance)

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        d = dict(data)
        image_key, label_key = self.keys
        if label_key not in d:
            return d
        img, lab = d[image_key], d[label_key]
        a, b = np.asarray(getattr(img, "affine", np.eye(4))), np.asarray(getattr(lab, "affine", np.eye(4)))
        if tuple(img.shape[1:]) != tuple(lab.shape[1:]) or not np.allclose(a, b, atol=self.tolerance, rtol=0):
            name = lambda x: (getattr(x, "meta", None) or {}).get("filename_or_obj", "<unknown file>")  # noqa: E731
            raise ValueError(
                f"geometry mismatch: image {name(img)} has shape {tuple(img.shape[1:])} and affine {a[:3].round(4).tolist()}, "
                f"label {name(lab)} has shape {tuple(lab.shape[1:])} and affine {b[:3].round(4).tolist()}"
            )
        return d


class CheckChannelsd:
    """MONAI-style dict transform: the channel-first image has the network's ``channels`` input channels (a 4-D image
    has them along its 4th axis, declared as ``image_channels``); the error names the file. Volumes are never
    repeated or averaged into channels: an MR volume is one channel unless the datalist says otherwise."""

    def __init__(self, keys: str = "image", channels: int = 1):
        self.key = keys
        self.channels = int(channels)

    def __call__(self, data: Mapping[Hashable, Any]) -> Dict[Hashable, Any]:
        img = data[self.key]
        if img.shape[0] != self.channels:
            name = (getattr(img, "meta", None) or {}).get("filename_or_obj", "<unknown file>")
            raise ValueError(
                f"image {name} has {img.shape[0]} channel(s), the network takes in_channels={self.channels}; a 4-D image's "
                "channels are declared as image_channels in the datalist (in_channels follows their count)"
            )
        return dict(data)
