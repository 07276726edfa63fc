"""Load and validate a site's MONAI decathlon-style datalist.

A datalist is a JSON object whose ``"training"``, ``"validation"`` and ``"test"`` keys hold lists of
``{"image": path, "label": path, ...}`` entries. Paths are resolved exactly as
:func:`monai.data.load_decathlon_datalist` resolves them with ``base_dir`` = the datalist's folder:
``image``/``label`` (and ``fov``) are joined onto it (absolute paths stay as they are), other string
values only when the joined path exists. Extra keys (``"id"``) pass through.

Validation is strict because a site in a federation fails far from the operator: every error is a
:class:`DatalistError` whose message names the offending file (and the split/index when known), so a
site's log line alone says what to fix.

Pixels are read the way MONAI's readers read them — ``PILReader`` is ``np.asarray(PIL.Image.open(f))``,
``NibabelReader`` is ``np.asanyarray(nib.load(f).dataobj)`` — but without importing MONAI (and torch),
which costs seconds and is not needed to check a folder; a test checks the two agree. MONAI's
``PILReader.verify_suffix`` does not list ``.tif``/``.gif``: ``LoadImage()`` with the default reader
search fails on DRIVE's ``.tif`` images unless ITK is installed, so pass a reader explicitly
(``reader=monai_reader_name(path)``, or the bundle's ``fedseg.data.transforms.SegImageReader``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .errors import DatalistError  # noqa: F401 - the data layer's error, raised and re-exported here

if TYPE_CHECKING:  # pragma: no cover
    from .labels import LabelSpace

__all__ = [
    "DatalistError",
    "SPLITS",
    "load_datalist",
    "validate_pair",
    "decode_mask",
    "datalist_label_space",
    "entry_label_space",
    "summarise_datalist",
    "read_datalist_json",
    "check_split_structure",
    "resolve_entry",
    "check_disjoint",
    "validate_fov",
    "read_array",
    "monai_reader_name",
    "write_json_atomic",
]

#: the three splits every fedseg datalist carries
SPLITS: Tuple[str, str, str] = ("training", "validation", "test")

#: keys whose values are file paths resolved against the datalist folder
_PATH_KEYS: Tuple[str, ...] = ("image", "label", "fov")

_RASTER_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".gif", ".bmp", ".ppm")  # as SegImageReader
_NIFTI_SUFFIXES = (".nii", ".nii.gz")


# ----------------------------------------------------------------------------------------------
# file reading
# ----------------------------------------------------------------------------------------------


def monai_reader_name(path: str | os.PathLike) -> str:
    """Name of the MONAI image reader for ``path``: ``"PILReader"`` or ``"NibabelReader"``.

    Raises:
        DatalistError: the suffix is not a supported image format.
    """
    name = str(path).lower()
    if name.endswith(_NIFTI_SUFFIXES):
        return "NibabelReader"
    if name.endswith(_RASTER_SUFFIXES):
        return "PILReader"
    raise DatalistError(
        f"unsupported image format for {path}: expected one of {_RASTER_SUFFIXES + _NIFTI_SUFFIXES}"
    )


def read_array(path: str | os.PathLike, what: str = "image") -> np.ndarray:
    """Read an image file into a numpy array, as MONAI's reader for its format would.

    Raster images come back in PIL's row-major layout (MONAI ``PILReader(reverse_indexing=False)``):
    ``(H, W)`` for single-channel, ``(H, W, C)`` for RGB/RGBA; palette images give palette indices.
    NIfTI comes back as stored, e.g. ``(X, Y)``, ``(X, Y, Z)`` or ``(X, Y, Z, C)``. The dtype is the
    file's (uint8 for 8-bit PNG/JPEG/TIFF).

    Raises:
        DatalistError: the file is missing, unreadable, truncated or not an image.
    """
    path = Path(path)
    if not path.is_file():
        raise DatalistError(f"{what} file not found: {path}")
    reader_name = monai_reader_name(path)
    try:
        if reader_name == "PILReader":
            from PIL import Image

            with Image.open(path) as img:
                img.load()  # decode now: a truncated file fails here, not in a training worker
                arr = np.asarray(img)
        else:
            import nibabel as nib

            arr = np.asanyarray(nib.load(str(path)).dataobj)
    except Exception as exc:  # PIL/nibabel raise many types for corrupt files; all mean "unreadable"
        raise DatalistError(f"cannot read {what} {path}: {type(exc).__name__}: {exc}") from exc
    if arr.size == 0 or arr.ndim < 2:
        raise DatalistError(f"{what} {path} has no usable pixel data (shape {arr.shape})")
    return arr


def _label_spatial_shape(label: np.ndarray, path: Path, label_space: Optional["LabelSpace"] = None) -> Tuple[int, ...]:
    """Spatial shape of a mask; a trailing singleton channel is dropped.

    A raster mask must then be 2D: fedseg masks are single-channel, and an RGB(A) mask is refused rather than
    guessed at (which channel? any-nonzero?) — unless the datalist declares its ``label_values`` (a stored
    encoding), where an RGB(A) mask whose colour channels are identical is read as one channel
    (:meth:`fedseg.data.labels.LabelSpace.single_channel`).
    """
    shape = tuple(int(s) for s in label.shape)
    if len(shape) >= 3 and shape[-1] == 1:
        shape = shape[:-1]
    if monai_reader_name(path) == "PILReader" and len(shape) != 2:
        if label_space is not None and label_space.values is not None and len(shape) == 3 and shape[-1] in (3, 4):
            return shape[:2]
        raise DatalistError(f"label {path} must be a single-channel 2D mask, got shape {tuple(label.shape)}")
    return shape


def decode_mask(label: np.ndarray, path: Path, label_space: Optional["LabelSpace"] = None) -> np.ndarray:
    """A mask as read from ``path`` -> class indices ``(*spatial)`` int64 under ``label_space`` (default: the binary
    {0,1} / {0,255} space); an RGB(A) raster mask is reduced to one channel first when the space allows it.

    Raises:
        DatalistError: naming the file — undeclared values (listed), RGB channels that differ, a non-binary mask
            where no label space is declared.
    """
    from .labels import BINARY

    space = label_space or BINARY
    spatial = _label_spatial_shape(label, path, space)
    if label.ndim == len(spatial) + 1 and label.shape[-1] in (3, 4):
        label = space.single_channel(label, str(path))
    return space.decode(label.reshape(spatial), str(path))


def _check_binary(label: np.ndarray, path: Path) -> None:
    """Masks must be {0,1} or {0,255} (or all zero)."""
    decode_mask(label, path)


def validate_pair(
    image_path: str | os.PathLike, label_path: str | os.PathLike, label_space: Optional["LabelSpace"] = None
) -> Dict[str, Any]:
    """Check that an image and its mask are readable, spatially aligned and that the mask decodes under the label space.

    Args:
        image_path: 2D raster (PNG/JPEG/TIFF/GIF/BMP/PPM) or NIfTI image.
        label_path: mask; without ``label_space`` single-channel with values in {0,1} or {0,255} (all-zero is
            allowed); with one, values its ``label_values`` (or class indices) declare, RGB(A) allowed when
            ``label_values`` are declared and the channels agree (:mod:`fedseg.data.labels`).
        label_space: the datalist's :class:`fedseg.data.labels.LabelSpace` (None = binary).

    Returns:
        ``{"spatial_shape": tuple, "channels": int, "foreground_fraction": float}`` where ``spatial_shape`` is
        ``(H, W)`` for raster images (``(X, Y[, Z])`` for NIfTI), ``channels`` is the image's channel count (1 for
        grey) and ``foreground_fraction`` the fraction of non-background pixels.

    Raises:
        DatalistError: naming the file that is missing, unreadable, mis-sized or holds undeclared mask values.
    """
    image_path, label_path = Path(image_path), Path(label_path)
    image = read_array(image_path, "image")
    label = read_array(label_path, "label")
    spatial = _label_spatial_shape(label, label_path, label_space)
    img_spatial = tuple(int(s) for s in image.shape[: len(spatial)])
    extra = image.ndim - len(spatial)
    if img_spatial != spatial or extra not in (0, 1):
        raise DatalistError(
            f"size mismatch: image {image_path} has shape {tuple(image.shape)} but label {label_path} "
            f"has shape {tuple(label.shape)}"
        )
    classes = decode_mask(label, label_path, label_space)
    channels = 1 if extra == 0 else int(image.shape[-1])
    return {
        "spatial_shape": spatial,
        "channels": channels,
        "foreground_fraction": float(np.mean(classes > 0)),
    }


def validate_fov(fov_path: Path, spatial: Tuple[int, ...]) -> None:
    """Check that the field-of-view mask at ``fov_path`` is binary and of the image's ``spatial`` shape.

    Raises:
        DatalistError: the mask is unreadable, of another size, or not binary.
    """
    fov = read_array(fov_path, "fov mask")
    if _label_spatial_shape(fov, fov_path) != spatial:
        raise DatalistError(f"size mismatch: fov mask {fov_path} has shape {fov.shape}, image is {spatial}")
    _check_binary(fov, fov_path)


# ----------------------------------------------------------------------------------------------
# datalist JSON
# ----------------------------------------------------------------------------------------------


def _resolve_datalist_path(path: str | os.PathLike) -> Path:
    """Accept either the JSON file or the folder that holds ``datalist.json``."""
    path = Path(path)
    if path.is_dir():
        path = path / "datalist.json"
    return path


def read_datalist_json(path: str | os.PathLike) -> Tuple[Path, Dict[str, Any]]:
    """``(absolute path, parsed JSON object)`` of a datalist file or of the folder holding ``datalist.json``;
    DatalistError naming the file when it is missing or not a JSON object."""
    path = _resolve_datalist_path(path).absolute()
    return path, _read_json(path)


def common_spatial_mode(datalists: Iterable[str | os.PathLike]) -> Optional[str]:
    """The top-level ``"spatial_mode"`` every datalist declares, or None when they differ or one declares none."""
    modes = {read_datalist_json(p)[1].get("spatial_mode") for p in datalists}
    return modes.pop() if len(modes) == 1 and None not in modes else None


def _read_json(path: Path) -> Dict[str, Any]:
    if not path.is_file():
        raise DatalistError(f"datalist file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatalistError(f"invalid JSON in datalist {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise DatalistError(f"datalist {path} must hold a JSON object, got {type(data).__name__}")
    return data


def check_split_structure(data: Mapping[str, Any], split: str, path: Path) -> None:
    """Check that ``data[split]`` exists, is a non-empty list, and every entry is a dict with string image/label.

    Raises:
        DatalistError: naming the split (and the entry's index) in ``path``.
    """
    if split not in data:
        raise DatalistError(f"split '{split}' missing from datalist {path}")
    entries = data[split]
    if not isinstance(entries, list):
        raise DatalistError(f"split '{split}' in {path} must be a list, got {type(entries).__name__}")
    if not entries:
        raise DatalistError(f"split '{split}' in {path} is empty")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DatalistError(f"{split}[{i}] in {path} must be an object, got {type(entry).__name__}")
        for key in ("image", "label"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise DatalistError(f"{split}[{i}] in {path} has no '{key}' path")


def _join(base: Path, value: Any, only_if_exists: bool) -> Any:
    """MONAI's ``_compute_path``: ``normpath(join(base, value))`` for strings (and lists of them)."""
    if isinstance(value, list):
        return [_join(base, v, only_if_exists) for v in value] if all(isinstance(v, str) for v in value) else value
    if not isinstance(value, str):
        return value
    joined = os.path.normpath(os.path.join(str(base), value))
    return value if only_if_exists and not os.path.exists(joined) else joined


def resolve_entry(entry: Dict[str, Any], base: Path) -> Dict[str, Any]:
    """Resolve paths as ``load_decathlon_datalist(..., is_segmentation=True, base_dir=base)`` does,
    plus ``fov`` always (MONAI would leave a missing fov relative, hiding the error)."""
    return {k: _join(base, v, only_if_exists=k not in _PATH_KEYS) for k, v in entry.items()}


def load_datalist(
    path: str | os.PathLike,
    check_files: bool = True,
    splits: Sequence[str] = SPLITS,
) -> Dict[str, List[Dict[str, Any]]]:
    """Load a decathlon-style datalist with absolute paths, validating it.

    Args:
        path: the datalist JSON file (or the folder holding ``datalist.json``).
        check_files: also open every image/label (and fov) to check readability, size agreement
            and that every mask decodes under the datalist's label space (:mod:`fedseg.data.labels`; binary
            {0,1} / {0,255} when it declares none). Without it only the JSON structure, the label space
            fields and file existence are checked.
        splits: splits that must be present and non-empty.

    Returns:
        ``{split: [entry, ...]}`` for each requested split; ``entry["image"]``/``["label"]``
        (and ``["fov"]`` when present) are absolute path strings; other string values are resolved
        only where the joined path exists (MONAI's rule), e.g. ``"id"`` stays as it is. Where the datalist
        declares ``label_values``, every entry without its own carries them (``entry["label_values"]``).

    Raises:
        DatalistError: missing/invalid file, missing or empty split, missing or bad image/label,
            or the same image listed in two splits (a train/test leak).
    """
    path = _resolve_datalist_path(path).absolute()
    data = _read_json(path)
    for split in splits:
        check_split_structure(data, split, path)

    out: Dict[str, List[Dict[str, Any]]] = {
        split: [resolve_entry(dict(entry), path.parent) for entry in data[split]] for split in splits
    }
    check_disjoint(out, path)
    space = datalist_label_space(data, path)
    if space.values is not None:
        # every entry carries the stored mask encoding it is decoded with (the bundle's LabelsToClassesd reads it
        # per item), so entries pooled from several datalists keep their own
        for entries in out.values():
            for entry in entries:
                entry.setdefault("label_values", data["label_values"])
    for split, entries in out.items():
        for i, entry in enumerate(entries):
            where = f"{split}[{i}] of {path}"
            if not check_files:
                for key in _PATH_KEYS:
                    if key in entry and not Path(entry[key]).is_file():
                        raise DatalistError(f"{key} file not found: {entry[key]} ({where})")
                continue
            try:
                info = validate_pair(entry["image"], entry["label"], entry_label_space(space, entry, where))
                if "fov" in entry:
                    validate_fov(Path(entry["fov"]), info["spatial_shape"])
            except DatalistError as exc:
                raise DatalistError(f"{exc} ({where})") from exc
    return out


def datalist_label_space(data: Mapping[str, Any], path: Path | str = "<datalist>") -> "LabelSpace":
    """The :class:`fedseg.data.labels.LabelSpace` a datalist's top-level fields declare (binary when none)."""
    from .labels import LabelSpace

    return LabelSpace.from_datalist(data, str(path))


def entry_label_space(space: "LabelSpace", entry: Mapping[str, Any], where: str = "<entry>") -> "LabelSpace":
    """``space`` with the entry's own ``"label_values"`` where it has them (a pooled datalist mixes data sets,
    each with its own stored encoding), else ``space`` itself."""
    if "label_values" not in entry:
        return space
    from dataclasses import replace

    from .labels import parse_label_values

    return replace(space, values=parse_label_values(entry["label_values"], where), declared=True)


def check_disjoint(splits: Mapping[str, List[Dict[str, Any]]], path: Path) -> None:
    """Check that no image (an entry's resolved ``"image"``) is listed twice across ``splits``.

    An image in two splits silently inflates scores (a train/test leak).

    Raises:
        DatalistError: naming the image and both of its places in ``path``.
    """
    seen: Dict[str, str] = {}
    for split, entries in splits.items():
        for i, entry in enumerate(entries):
            image = entry["image"]
            if image in seen:
                raise DatalistError(
                    f"image {image} is listed twice in {path}: {seen[image]} and {split}[{i}]"
                )
            seen[image] = f"{split}[{i}]"


def summarise_datalist(path: str | os.PathLike) -> Dict[str, Any]:
    """Aggregate description of a datalist for reports (numbers only, no file names).

    Every image/label pair is read and validated. Splits absent from the file are reported with
    count 0; the standard splits that are present must be non-empty.

    Returns:
        ``{"counts": {split: n}, "total": n, "image_sizes": [[H, W], ...] (distinct, sorted),
        "channels": [c, ...], "foreground_fraction_mean": float, "foreground_fraction_min": float,
        "foreground_fraction_max": float}``; fractions are over the whole image, mean over images.
    """
    path = _resolve_datalist_path(path)
    data = _read_json(path)
    present = tuple(s for s in SPLITS if s in data)
    if not present:
        raise DatalistError(f"datalist {path} has none of the splits {SPLITS}")
    loaded = load_datalist(path, check_files=False, splits=present)
    space = datalist_label_space(data, path)
    sizes, channels, fractions = set(), set(), []
    for split, entries in loaded.items():
        for i, entry in enumerate(entries):
            try:
                info = validate_pair(entry["image"], entry["label"], entry_label_space(space, entry))
            except DatalistError as exc:
                raise DatalistError(f"{exc} ({split}[{i}] of {path})") from exc
            sizes.add(info["spatial_shape"])
            channels.add(info["channels"])
            fractions.append(info["foreground_fraction"])
    counts = {s: len(loaded.get(s, [])) for s in SPLITS}
    return {
        "counts": counts,
        "total": int(sum(counts.values())),
        "image_sizes": [list(s) for s in sorted(sizes)],
        "channels": sorted(channels),
        "foreground_fraction_mean": float(np.mean(fractions)),
        "foreground_fraction_min": float(np.min(fractions)),
        "foreground_fraction_max": float(np.max(fractions)),
    }


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------


def write_json_atomic(path: str | os.PathLike, data: Mapping[str, Any]) -> Path:
    """Write JSON via a temp file in the same folder and ``os.replace``.

    A reader therefore sees either the previous file or the complete new one, never a partial
    write; generators write the datalist last so its presence marks a complete folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        # mkstemp creates 0600; a datalist is shared configuration, not a secret
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
