"""A built-in site's data written in the folder layouts MONAI model-zoo bundles read, so that a bundle that is not
fedseg's (a zoo bundle, or a user's own) trains on built-in data without a datalist.

A zoo bundle finds its data by globbing below one id, ``dataset_dir``, and splits the sorted list itself (the
last few files validate). Two layouts, one per kind of data:

``"images-labels"`` (2-D families, :data:`fedseg.data.synthetic.FAMILIES`)::

    out_dir/<site>/images/<family>_000.png   the generator's image, byte for byte (RGB (H, W, 3); xray grey (H, W))
    out_dir/<site>/labels/<family>_000.png   single-channel uint8 (H, W), **class indices** 0..C-1

``"decathlon"`` (volume families, :data:`fedseg.data.synthetic.volumes.VOLUME_FAMILIES`), the Medical Segmentation
Decathlon's folder names::

    out_dir/<site>/imagesTr/<family>_000.nii.gz   the generator's volume, byte for byte (float32, site orientation)
    out_dir/<site>/labelsTr/<family>_000.nii.gz   uint8 class indices, same shape and affine as its image

and in both::

    out_dir/<site>/datalist.json     fedseg's datalist of the same files (the generator's splits, written last)
    out_dir/site_overrides.json      {site: {"dataset_dir": "<absolute site folder>"}}

Masks store class indices (0 background, 1.. the datalist's classes) whatever the generator stores (polyp 0/255,
fundus 255/128/0): one encoding for every family, the one a bundle's ``DiceCELoss(to_onehot_y=True)`` expects
with no mapping, and the one a multi-class family needs (0/255 has no room for a third class). The written
datalist therefore declares the classes without ``label_values``.

File order. Every labelled image of the site is written (a zoo bundle splits the globbed list itself), numbered
so that the sorted list is the generator's training split, then its validation split, then its test split. A
bundle that validates on the last ``N`` files therefore never trains on a test image as long as ``N`` is at least
the test count, and trains on exactly the generator's training split when ``N`` is the held-out count (validation
+ test; the datalist written beside the files has both splits). Within a split, files keep the generator's
order. Everything is a pure function of ``(family, site, seed, profile, image_size, num_images)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from PIL import Image

from ..datalist import write_json_atomic
from .files import check_site_name, existing_datalist, save_png_atomic

__all__ = [
    "LAYOUT_VERSION",
    "LAYOUTS",
    "BUNDLE_LAYOUTS",
    "LAYOUT_FOLDERS",
    "SPLIT_ORDER",
    "layout_for_family",
    "write_layout_site",
    "write_layout_federation",
]

#: bump whenever the written files or their order change; part of the layout datalist's fingerprint
LAYOUT_VERSION = 1

#: every layout ``fedseg data synth --layout`` writes: ``"datalist"`` is the generator's own
#: (``out/<family>/<site>/datalist.json``, :func:`fedseg.data.synthetic.generate_site_data`)
LAYOUTS = ("datalist", "images-labels", "decathlon")

#: the layouts of this module and the spatial dimensions each one holds
BUNDLE_LAYOUTS: Dict[str, int] = {"images-labels": 2, "decathlon": 3}

#: (image folder, label folder) of each bundle layout, relative to the site folder
LAYOUT_FOLDERS: Dict[str, tuple] = {"images-labels": ("images", "labels"), "decathlon": ("imagesTr", "labelsTr")}

#: the generator's splits in the order their files are numbered: held-out images last, the test images the very
#: last, so that a bundle validating on the last N files keeps the test images out of training for any N >= their count
SPLIT_ORDER = ("training", "validation", "test")

#: name of the per-site bundle-id overrides file, beside the site folders
OVERRIDES_NAME = "site_overrides.json"


def _volume_families() -> tuple:
    from .volumes import VOLUME_FAMILIES

    return VOLUME_FAMILIES


def layout_for_family(family: str) -> str:
    """The bundle layout that holds ``family``'s data: ``"decathlon"`` for a volume family, else ``"images-labels"``."""
    return "decathlon" if family in _volume_families() else "images-labels"


def _check_layout(family: str, layout: str) -> None:
    if layout not in BUNDLE_LAYOUTS:
        raise ValueError(f"unknown bundle layout {layout!r}; expected one of {tuple(BUNDLE_LAYOUTS)} "
                         f"('datalist' is the generator's own layout: generate_site_data)")
    wanted = layout_for_family(family)
    if layout != wanted:
        kind = "a 3-D volume family" if wanted == "decathlon" else "a 2-D family"
        raise ValueError(f"layout {layout!r} does not hold {family!r} ({kind}); use layout {wanted!r}")


def _suffix(layout: str) -> str:
    return ".nii.gz" if layout == "decathlon" else ".png"


def _ordered_entries(datalist: Dict[str, Any]) -> List[Dict[str, str]]:
    """The generator's entries in :data:`SPLIT_ORDER`, each tagged with its split."""
    return [dict(entry, split=split) for split in SPLIT_ORDER for entry in datalist[split]]


def _write_class_index_png(src: Path, dst: Path, space, source_name: str) -> None:
    """Decode the generator's mask ``src`` (its stored encoding, ``(H, W)`` or RGB ``(H, W, 3)``) to class indices
    and write them to ``dst`` as an 8-bit single-channel PNG ``(H, W)``."""
    stored = np.asarray(Image.open(src))
    if stored.ndim == 3:  # RGB(A) masks: one channel when the space allows it (fedseg.data.labels)
        stored = space.single_channel(stored, source_name)
    save_png_atomic(space.decode(stored, source_name).astype(np.uint8), dst)


def _copy_atomic(src: Path, dst: Path) -> None:
    """Copy via a temp file + ``os.replace``: a bundle globbing the folder never sees half a file."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def _remove_stale(site_dir: Path, layout: str, family: str, keep: Sequence[str]) -> None:
    """Remove files of this module's naming (``<family>_<digits><suffix>``) that an earlier, larger site left;
    anything else in the folders (a user's own files) is never touched."""
    pattern = re.escape(family) + r"_\d+" + re.escape(_suffix(layout))
    keep = set(keep)
    for sub in LAYOUT_FOLDERS[layout]:
        for p in (site_dir / sub).iterdir():
            if re.fullmatch(pattern, p.name) and p.name not in keep:
                p.unlink()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_layout_site(
    family: str,
    site: str,
    out_dir: str | os.PathLike,
    layout: Optional[str] = None,
    seed: int = 0,
    profile: str = "default",
    image_size: Optional[int] = None,
    num_images: Optional[int] = None,
) -> Path:
    """Write (or reuse) one site's built-in data in a bundle layout (module docstring).

    Args:
        family: a 2-D family (``"polyp"``, ``"vessel"``, ``"nuclei"``, ``"xray"``, ``"fundus"``) or a volume
            family (``"prostate3d"``).
        site: any name without path separators; the site folder is ``out_dir/<site>``.
        out_dir: root folder of the federation.
        layout: ``"images-labels"`` (2-D) or ``"decathlon"`` (3-D); ``None`` picks the family's.
        seed, profile, image_size, num_images: as :func:`fedseg.data.synthetic.generate_site_data` (``image_size``
            only for 2-D families; ``num_images`` counts volumes for a volume family).

    Returns:
        The site folder ``out_dir/<site>`` (absolute), holding the layout's two folders and ``datalist.json``.

    The generator draws the site again on every call, in a temporary folder inside ``out_dir`` that is removed
    afterwards; a site folder whose datalist has the same fingerprint and all of whose files exist is then left
    untouched (a bundle reading it meanwhile sees no file change).

    Raises:
        ValueError: an unknown layout, a layout that does not hold the family, or what the generator refuses
            (family, profile, site name, sizes).
    """
    from . import families

    layout = layout or layout_for_family(family)
    _check_layout(family, layout)
    check_site_name(site)
    out_dir = Path(out_dir).resolve()
    site_dir = out_dir / site
    image_sub, label_sub = LAYOUT_FOLDERS[layout]
    suffix = _suffix(layout)

    with tempfile.TemporaryDirectory(prefix=f".{site}.source-", dir=_mkdir(out_dir)) as tmp:
        # the generator's datalist is cheap to check against: its fingerprint names every setting that changes a
        # pixel, so the layout's fingerprint is the generator's plus the layout
        src_datalist = families.generate_site_data(family, site, tmp, seed=seed, profile=profile,
                                                   image_size=image_size, num_images=num_images)
        src = json.loads(Path(src_datalist).read_text(encoding="utf-8"))
        fingerprint = {"layout": layout, "layout_version": LAYOUT_VERSION, "source": src["fingerprint"]}
        datalist_path = site_dir / "datalist.json"
        if existing_datalist(datalist_path, fingerprint):
            return site_dir
        if datalist_path.exists():  # a stale datalist must not vouch for a folder being rewritten
            datalist_path.unlink()
        for sub in (image_sub, label_sub):
            (site_dir / sub).mkdir(parents=True, exist_ok=True)

        entries = _ordered_entries(src)
        width = max(3, len(str(len(entries) - 1)))
        names = [f"{family}_{i:0{width}d}{suffix}" for i in range(len(entries))]
        space = families.family_label_space(family)
        splits: Dict[str, List[Dict[str, str]]] = {split: [] for split in ("training", "validation", "test")}
        src_dir = Path(src_datalist).parent
        for entry, name in zip(entries, names):
            _copy_atomic(src_dir / entry["image"], site_dir / image_sub / name)
            if layout == "decathlon":
                # the volume generator already stores class indices with the image's affine: copied as they are
                _copy_atomic(src_dir / entry["label"], site_dir / label_sub / name)
            else:
                _write_class_index_png(src_dir / entry["label"], site_dir / label_sub / name, space,
                                       str(src_dir / entry["label"]))
            splits[entry["split"]].append({"image": f"{image_sub}/{name}", "label": f"{label_sub}/{name}"})
        _remove_stale(site_dir, layout, family, names)

    # the generator's datalist with this folder's files; the masks now store class indices, so the stored
    # encoding (label_values, e.g. fundus 255/128/0) no longer applies
    skip = {"fingerprint", "label_values", "training", "validation", "test"}
    datalist = {
        **{k: v for k, v in src.items() if k not in skip},
        "name": f"fedseg-synthetic-{family}-{site}-{layout}",
        "layout": layout,
        "fingerprint": fingerprint,
        **splits,
    }
    write_json_atomic(datalist_path, datalist)
    return site_dir


def write_layout_federation(
    family: str,
    sites: Sequence[str],
    out_dir: str | os.PathLike,
    layout: Optional[str] = None,
    seed: int = 0,
    profile: str = "default",
    **kw: Any,
) -> Dict[str, Path]:
    """Write every site with :func:`write_layout_site`, then ``out_dir/site_overrides.json``: ``{site:
    {"dataset_dir": "<absolute site folder>"}}`` for the sites given, in their order (the per-site bundle-id
    overrides ``fedseg run --bundle DIR --site-overrides FILE`` reads).

    Extra keyword arguments go to :func:`write_layout_site` (``image_size``, ``num_images``).

    Returns:
        ``{site: path of the site's datalist.json}`` in ``sites`` order (the form ``generate_federation`` returns,
        so the same folders also serve ``fedseg run --site-datalists``).
    """
    sites = list(sites)
    if not sites:
        raise ValueError("write_layout_federation needs at least one site")
    if len(set(sites)) != len(sites):
        raise ValueError(f"duplicate site names in {sites}")
    folders = {s: write_layout_site(family, s, out_dir, layout=layout, seed=seed, profile=profile, **kw)
               for s in sites}
    write_json_atomic(Path(out_dir).resolve() / OVERRIDES_NAME,
                      {s: {"dataset_dir": str(folder)} for s, folder in folders.items()})
    return {s: folder / "datalist.json" for s, folder in folders.items()}
