"""Files of the built-in synthetic sites, shared by the 2-D families (:mod:`fedseg.data.synthetic`), the volume
families (:mod:`fedseg.data.synthetic.volumes`) and the X-ray silos: seeding, split sizes, atomic writes and the
reuse / clean-up rules that make generation idempotent."""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import numpy as np
from PIL import Image


__all__ = ["site_seed", "save_png_atomic", "split_counts", "check_site_name", "site_fingerprint", "generator_fields",
           "existing_datalist", "prepare_site_folder", "numbered_names", "remove_stale_files", "seeded_splits"]


def site_seed(family: str, site: str, seed: int) -> int:
    """Stable 32-bit seed for one site: ``zlib.crc32(f"{family}/{site}/{seed}")``."""
    return zlib.crc32(f"{family}/{site}/{seed}".encode("utf-8"))


def save_png_atomic(arr: np.ndarray, path: Path) -> None:
    """Save a uint8 array as PNG via temp file + ``os.replace`` (no half-written PNG is visible)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    Image.fromarray(arr).save(tmp, format="PNG")
    os.replace(tmp, path)


def split_counts(n: int, fractions: Sequence[float]) -> Tuple[int, int, int]:
    """(train, val, test) sizes with at least one image in each split."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise ValueError(f"split_fractions must be three non-negative numbers summing to 1, got {fractions}")
    if n < 3:
        raise ValueError(f"need at least 3 images for non-empty training/validation/test splits, got {n}")
    n_val = max(1, int(round(fractions[1] * n)))
    n_test = max(1, int(round(fractions[2] * n)))
    n_train = n - n_val - n_test
    if n_train < 1:
        n_train, n_val, n_test = 1, max(1, (n - 1) // 2), n - 1 - max(1, (n - 1) // 2)
    return n_train, n_val, n_test


def check_site_name(site: str) -> None:
    """The site name becomes a folder name: any text without path separators works."""
    if not isinstance(site, str) or not site or site in (".", "..") or "/" in site or "\\" in site or "\0" in site:
        raise ValueError(f"invalid site name {site!r}: must be a non-empty name without path separators")


def site_fingerprint(generator: Dict[str, Any], site: str, seed: int, profile: str, split_fractions: Sequence[float],
                     **settings: Any) -> Dict[str, Any]:
    """The cache fingerprint of one generated site, in this order: the ``generator`` (its versions, the family), the
    site, the seed, the profile, the ``settings`` that change a file (sizes, counts, target), the split fractions."""
    return {**generator, "site": site, "seed": int(seed), "profile": profile, **settings,
            "split_fractions": [float(f) for f in split_fractions]}


def generator_fields(fingerprint: Dict[str, Any]) -> Dict[str, Any]:
    """A site datalist's generator settings: readable at the top level (the split fractions aside) and once more as
    the cache fingerprint."""
    return {**{k: v for k, v in fingerprint.items() if k != "split_fractions"}, "fingerprint": fingerprint}


def existing_datalist(path: Path, fingerprint: Dict[str, Any], keys: Sequence[str] = ("image", "label")) -> bool:
    """True when ``path`` is a complete datalist from the same generator fingerprint: every file its entries name
    under ``keys`` exists."""
    if not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return False
    for split in ("training", "validation", "test"):
        for entry in data.get(split, []):
            for key in keys:
                if not (path.parent / entry[key]).is_file():
                    return False
    return True


def prepare_site_folder(site_dir: Path, folders: Sequence[str] = ("images", "labels")) -> Path:
    """Make the file ``folders`` and remove the site's datalist: a stale datalist must not vouch for a folder that is
    being rewritten. Returns the datalist's path."""
    datalist_path = site_dir / "datalist.json"
    if datalist_path.exists():
        datalist_path.unlink()
    for folder in folders:
        (site_dir / folder).mkdir(parents=True, exist_ok=True)
    return datalist_path


def numbered_names(n: int, suffix: str) -> List[str]:
    """``["000.png", "001.png", ...]``: zero-padded to at least three digits so that names sort as numbers."""
    width = max(3, len(str(n - 1)))
    return [f"{i:0{width}d}{suffix}" for i in range(n)]


def remove_stale_files(site_dir: Path, keep: Iterable[str], suffix: str) -> None:
    """Remove numbered files (``<digits><suffix>``) left in ``images/`` and ``labels/`` by an earlier, larger
    generation; other files are never touched."""
    keep = set(keep)
    pattern = r"\d+" + re.escape(suffix)
    for sub in ("images", "labels"):
        for p in (site_dir / sub).iterdir():
            if re.fullmatch(pattern, p.name) and p.name not in keep:
                p.unlink()


def seeded_splits(names: Sequence[str], base_seed: int, counts: Tuple[int, int, int]) -> Dict[str, List[Dict[str, str]]]:
    """The three splits of a site's numbered files: a permutation seeded by the site (stream 2), each split in file
    order. ``counts`` from :func:`split_counts`."""
    n_train, n_val, _ = counts
    order = np.random.default_rng([base_seed, 2]).permutation(len(names))
    entries = [{"image": f"images/{name}", "label": f"labels/{name}"} for name in names]

    def pick(idx: np.ndarray) -> List[Dict[str, str]]:
        return [entries[i] for i in sorted(idx.tolist())]

    return {
        "training": pick(order[:n_train]),
        "validation": pick(order[n_train : n_train + n_val]),
        "test": pick(order[n_train + n_val :]),
    }
