"""Find bad files before training starts: ``check_datalist(path)`` at site start and ``fedseg data check DATALIST``.

:func:`fedseg.data.datalist.load_datalist` checks structure, readability, sizes and binary masks. This adds what
a federation cannot afford to discover an hour into a round, checked in this order for each entry:

1. **where the file is**: a path (after following symlinks) outside the datalist's folder is refused unless the
   datalist says ``"allow_external_paths": true`` (importers that reference a data set in place set it), so a
   datalist cannot make a site read ``/etc`` or another project's files through ``../`` or a symlink;
2. **the header only** (PIL's lazy open, nibabel's header): a 3-D NIfTI volume given to the 2-D pipeline, an
   image of a few pixels (a side below ``min_side``), an absurdly large one (more than ``max_pixels``: refused
   before any pixel is decoded, so a 20000 x 20000 file costs nothing), a pixel mode the pipeline cannot read;
3. **the pixels** (as the pipeline reads them): corrupt or truncated files, mask values the datalist's label
   space does not declare (:mod:`fedseg.data.labels`: without ``labels`` / ``label_values`` only {0,1} /
   {0,255}, so a {0,2} mask is refused, not guessed at), RGB masks whose channels differ, image/mask size
   mismatch.

The label space fields themselves (``labels``, ``label_values``, ``regions``, ``num_classes``) are checked
first: a datalist whose ``labels`` and ``num_classes`` disagree stops here, before any file is opened.

Every problem names its file (and split[index]); all are collected, then one :class:`DatalistError` lists them.
The message stays at the site (its log): a site that fails here answers the server with the error *type* only
(``fedseg.fl.client``), and the other sites' work continues.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .datalist import (
    SPLITS,
    DatalistError,
    check_disjoint,
    check_split_structure,
    datalist_label_space,
    entry_label_space,
    monai_reader_name,
    read_datalist_json,
    resolve_entry,
    validate_fov,
    validate_pair,
)
from .image_modes import SUPPORTED_MODES
from .labels import LabelSpace, declares_names

#: refuse images with fewer pixels on a side (the UNet halves the image four times)
MIN_SIDE = 16
#: refuse images with more pixels than this before decoding (~ 12000 x 12000; a whole-slide image must be tiled)
MAX_PIXELS = 150_000_000
#: stop listing problems after this many (the rest are counted)
MAX_LISTED = 20
#: refuse volumes with more voxels than this from the header (8 GB as float32); larger than the cache budget is fine
MAX_VOXELS = 2_000_000_000

__all__ = ["check_datalist", "check_federation", "federation_label_config", "check_image_header", "MIN_SIDE", "MAX_PIXELS"]


def check_datalist(
    path: str | os.PathLike,
    allow_external_paths: Optional[bool] = None,
    min_side: int = MIN_SIDE,
    max_pixels: int = MAX_PIXELS,
    splits: Tuple[str, ...] = SPLITS,
    decode: bool = True,
    volumes: Optional[bool] = None,
) -> Dict[str, Any]:
    """Check a datalist and every file it names; raise one error listing every problem.

    Args:
        path: the datalist JSON (or the folder holding ``datalist.json``).
        allow_external_paths: allow files outside the datalist's folder; ``None`` = the datalist's own
            ``"allow_external_paths"`` (default false).
        min_side / max_pixels: size limits checked on the header.
        splits: splits that must be present and non-empty.
        decode: also decode the pixels (step 3); ``False`` checks paths and headers only.
        volumes: the job's data are 3-D volumes (``None`` = what the datalist declares: ``spatial_dims`` 3 or
            ``spatial_mode`` "slices"); then every image / label must be a volume of one geometry
            (:func:`fedseg.data.volumes.check_volume_pair`: shapes and affines, declared ``image_channels``) and a 2-D
            file is refused; otherwise a 3-D volume is refused.
    Returns:
        ``{"datalist": path, "counts": {split: n}, "files": n files checked, "label_space": LabelSpace}``.
    Raises:
        DatalistError: naming each offending file (and its split/index).
    """
    path, data = read_datalist_json(path)  # not JSON / not an object / missing: DatalistError naming the file
    problems: List[str] = []
    for split in splits:
        try:
            check_split_structure(data, split, path)
        except DatalistError as e:
            problems.append(str(e))
    if problems:
        raise DatalistError(_summary(path, problems))
    space = datalist_label_space(data, path)  # labels / label_values / regions / num_classes: DatalistError naming the file
    try:  # the same image in two splits (a train/test leak)
        check_disjoint({s: [resolve_entry(dict(e), path.parent) for e in data[s]] for s in splits}, path)
    except DatalistError as e:
        problems.append(str(e))
    if allow_external_paths is None:
        allow_external_paths = data.get("allow_external_paths", False)
        if not isinstance(allow_external_paths, bool):
            raise DatalistError(f"'allow_external_paths' in {path} must be true or false, got {allow_external_paths!r}")
    root = path.parent.resolve()
    n_files = 0
    from .volumes import check_volume_pair, is_volume_job

    volumes = is_volume_job(None, data) if volumes is None else bool(volumes)
    for split in splits:
        for i, entry in enumerate(data[split]):
            where = f"{split}[{i}] of {path}"
            files = {k: entry[k] for k in ("image", "label", "fov") if k in entry}
            resolved: Dict[str, Path] = {}
            for key, value in files.items():
                n_files += 1
                try:
                    resolved[key] = _check_location(key, value, path.parent, root, allow_external_paths)
                    if not volumes:
                        check_image_header(resolved[key], key, min_side, max_pixels)
                except DatalistError as e:
                    problems.append(f"{e} ({where})")
            if volumes and "image" in resolved and "label" in resolved:
                try:
                    geo, _ = check_volume_pair(resolved["image"], resolved["label"], data.get("image_channels"))
                    if int(np.prod(geo.spatial_shape)) * geo.channels > MAX_VOXELS:
                        raise DatalistError(f"image {resolved['image']} has {int(np.prod(geo.spatial_shape)):,} voxels x "
                                            f"{geo.channels} channel(s), above the limit of {MAX_VOXELS:,}: refused before decoding")
                    if decode:
                        decode_volume_label(resolved["label"], entry_label_space(space, entry, where))
                except DatalistError as e:
                    problems.append(f"{e} ({where})")
                continue
            if decode and len(resolved) == len(files):
                try:
                    info = validate_pair(resolved["image"], resolved["label"], entry_label_space(space, entry, where))
                    if "fov" in resolved:
                        validate_fov(resolved["fov"], info["spatial_shape"])
                except DatalistError as e:
                    problems.append(f"{e} ({where})")
                except Exception as e:  # a reader failing in a way validate_pair does not wrap
                    problems.append(f"cannot read {files['image']} / {files['label']}: {type(e).__name__}: {e} ({where})")
    if problems:
        raise DatalistError(_summary(path, problems))
    return {"datalist": str(path), "counts": {s: len(data[s]) for s in splits}, "files": n_files, "label_space": space}


def check_federation(
    datalists: Optional[Dict[str, Any]] = None,
    family: Optional[str] = None,
    explicit: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """What ``fedseg run`` / ``fedseg bench`` check before a job starts: every site's segmentation datalist (paths,
    ``allow_external_paths``, headers and label-space fields: :func:`check_datalist` without decoding pixels, which
    each site does at its start) and that all sites share one label space.

    Args:
        datalists: ``{site: datalist path}``, or None when the sites generate built-in ``family`` data.
        family: built-in data family (its label space is the family's).
        explicit: the user's ``train_config`` overrides (``num_classes`` / ``labels`` / ``regions`` must agree).

    Returns:
        The label-space ``train_config`` fields to add to the job (:func:`federation_label_config`;
        ``{}`` for a binary federation).

    Raises:
        DatalistError: every problem of every datalist, each naming its site and file; or the two label spaces
            that differ.
    """
    from .synthetic import FAMILIES
    from .volumes import federation_volume_config, is_volume_job

    if datalists:
        fields = federation_volume_config(datalists, explicit=explicit)
        problems = []
        for site, path in datalists.items():
            try:
                check_datalist(path, decode=False, volumes=is_volume_job({**fields, **(explicit or {})}, {}))
            except DatalistError as e:
                problems.append(f"site {site}: {e}")
        if problems:
            raise DatalistError("\n".join(problems))
        return {**federation_label_config(datalists, explicit=explicit), **fields}
    if family in FAMILIES:
        return federation_label_config(family=family, explicit=explicit)
    from .synthetic.volumes import VOLUME_FAMILIES, volume_family_fields

    if family in VOLUME_FAMILIES:
        from fedseg.config import TrainConfig

        info = volume_family_fields(family, TrainConfig.from_dict(explicit or {}).data.data_profile)
        return {**federation_label_config(family=family, explicit=explicit),
                **federation_volume_config(family_fields=info, explicit=explicit)}
    return {}


def decode_volume_label(path: Path, space) -> None:
    """Every voxel value of a label volume is one the label space declares (DatalistError naming the file)."""
    from .datalist import read_array

    space.decode(read_array(path, "label"), str(path))


def _check_location(key: str, value: Any, base: Path, root: Path, allow_external: bool) -> Path:
    """The path as MONAI resolves it (joined onto the datalist folder); outside ``root`` only when allowed."""
    if not isinstance(value, str) or not value:
        raise DatalistError(f"{key} path must be a non-empty string, got {value!r}")
    joined = Path(os.path.normpath(os.path.join(str(base), value)))
    if not allow_external:
        real = Path(os.path.realpath(joined))  # follows every symlink on the way
        if real != root and root not in real.parents:
            how = "a symlink to " if real != joined else ""
            raise DatalistError(
                f"{key} {joined} is {how}a path outside the datalist's folder {root} ({real}); set "
                '"allow_external_paths": true in the datalist if this site really keeps its data elsewhere'
            )
    if not joined.is_file():
        raise DatalistError(f"{key} file not found: {joined}")
    return joined


def check_image_header(path: Path, what: str = "image", min_side: int = MIN_SIDE, max_pixels: int = MAX_PIXELS) -> Tuple[int, ...]:
    """Spatial shape from the file header alone (no pixel decoded); refuses 3-D volumes, tiny or huge images
    and unknown pixel modes.

    Returns:
        ``(H, W)`` for raster images, the NIfTI's spatial shape with singleton axes dropped.
    """
    reader = monai_reader_name(path)  # unsupported suffix: DatalistError naming the file
    if reader == "PILReader":
        shape, mode = _raster_header(path, what)
        if mode not in SUPPORTED_MODES:
            raise DatalistError(f"{what} {path} has pixel mode {mode!r}, which the pipeline cannot read (supported: {SUPPORTED_MODES})")
    else:
        shape = _nifti_header(path, what)
    if len(shape) != 2:
        raise DatalistError(
            f"{what} {path} is a {len(shape)}-D volume of shape {shape}; the pipeline is 2-D: give one slice per file"
        )
    pixels = shape[0] * shape[1]
    if pixels > max_pixels:
        raise DatalistError(
            f"{what} {path} is {shape[0]} x {shape[1]} pixels ({pixels:,}), above the limit of {max_pixels:,}: "
            "refused before decoding; tile it first"
        )
    if min(shape) < min_side:
        raise DatalistError(f"{what} {path} is only {shape[0]} x {shape[1]} pixels; the pipeline needs at least {min_side} per side")
    return shape


def _raster_header(path: Path, what: str) -> Tuple[Tuple[int, int], str]:
    from PIL import Image

    # PIL refuses (or warns about) very large images inside open(); the size check here gives the clearer error
    previous = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as img:  # reads the header only
                width, height = img.size
                return (int(height), int(width)), img.mode
    except Exception as exc:  # PIL raises many types for a file that is not an image
        raise DatalistError(f"cannot read {what} {path}: {type(exc).__name__}: {exc}") from exc
    finally:
        Image.MAX_IMAGE_PIXELS = previous


def _nifti_header(path: Path, what: str) -> Tuple[int, ...]:
    import nibabel as nib

    try:
        shape = tuple(int(s) for s in nib.load(str(path)).header.get_data_shape())
    except Exception as exc:
        raise DatalistError(f"cannot read {what} {path}: {type(exc).__name__}: {exc}") from exc
    # a 2-D slice may be stored as (X, Y, 1) or with a channel axis (X, Y, 1, C): drop singleton axes after 2
    spatial = shape[:3]
    return tuple(s for i, s in enumerate(spatial) if i < 2 or s != 1)


def _summary(path: Path, problems: List[str]) -> str:
    listed = problems[:MAX_LISTED]
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    return f"datalist {path}: {len(problems)} problem(s)\n  " + "\n  ".join(listed) + more


def federation_label_config(
    datalists: Optional[Mapping[str, Any]] = None,
    family: Optional[str] = None,
    explicit: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The ``train_config`` fields of a federation's label space, checked before any job starts.

    Args:
        datalists: ``{site: datalist path}``; every datalist must declare the same classes and regions
            (:meth:`LabelSpace.check_compatible`).
        family: a built-in data family, when the sites generate their data (no ``datalists``).
        explicit: ``train_config`` overrides the user set (``num_classes``, ``labels``, ``regions``); they must
            agree with the data.

    Returns:
        ``{}`` for a binary federation without regions (binary jobs' configs stay as they always were), else
        ``num_classes``, ``labels``, ``regions`` (when declared) and ``label_values`` when every site stores the same
        encoding (so ``fedseg infer`` writes masks in it).

    Raises:
        LabelSpaceError: naming both datalists (or the datalist and the overrides) that disagree, or a datalist
            whose ``labels`` and ``num_classes`` disagree.
    """
    if datalists:
        spaces = {}
        for site, path in datalists.items():
            resolved, info = read_datalist_json(path)
            spaces[f"site {site}'s datalist {resolved}"] = LabelSpace.from_datalist(info, str(resolved))
    elif family:
        from .synthetic import family_label_space

        spaces = {f"built-in family {family!r}": family_label_space(family)}
    else:
        return {}
    (first_name, first), *rest = spaces.items()
    for name, space in rest:
        first.check_compatible(space, first_name, name)
    explicit = {k: v for k, v in (explicit or {}).items() if k in ("num_classes", "labels", "regions") and v is not None}
    if explicit:
        LabelSpace.from_config(explicit).check_compatible(first, "the job's --set options", first_name)
    named = next((s for s in spaces.values() if declares_names(s)), first)
    if not (named.multi_class or any(s.multi_class for s in spaces.values())):
        return {}
    out = named.to_config()
    regions = next((s.regions for s in spaces.values() if s.regions), None)
    if regions:
        out["regions"] = {r: list(m) for r, m in regions.items()}
    encodings = {json.dumps(s.values_json(), sort_keys=True) for s in spaces.values()}
    if len(encodings) == 1 and first.values is not None:
        out["label_values"] = first.values_json()
    return out
