"""Label-space silos for federated classification with unseen classes (FedEFM phase 1).

A *silo* is a site holding labelled images of some classes of a global label space. How much the
silos' label sets overlap is the *unseen proportion* ``unseen`` in [0, 1]:

* every silo holds ``P_k`` *private* classes (held by that silo only) and the ``S`` *shared* classes
  (held by every silo); ``unseen`` is the share of private classes in each silo's set,
  ``P_k / (P_k + S)``;
* with ``C`` classes and ``M`` silos, equal private counts ``p`` satisfy ``M p + S = C`` and
  ``p / (p + S) = u``, so ``S* = C (1 - u) / (M u + 1 - u)``; ``S = round(S*)`` and the other
  ``C - S`` classes are dealt round-robin (counts differ by at most one);
* ``unseen = 1``: ``S = 0``, disjoint label sets; ``unseen = 0``: ``S = C``, every silo holds every class;
  ``unseen = 0.5``: about half of each silo's classes are private.

Which classes are private or shared is a seeded permutation of the class list, so the assignment is a
pure function of ``(classes, n_silos, unseen, seed)`` and every site process computes the same one.

Classification datalists (read by the classification engine) have the form::

    {"task": "classification", "label_space": [global class names],
     "classes": [this silo's class names], "training": [{"image": path, "label": int}], ...}

``label`` indexes the *global* ``label_space`` (the same list in every silo's datalist), so silos
agree on what output ``j`` of a classifier means whatever classes they hold. :func:`make_silos`
divides labelled images among silos (a class held by several silos has its images divided between
them, never duplicated; images of one group, e.g. a patient, stay in one silo and one split) and
:func:`write_silos` writes one datalist per silo with paths relative to its folder.
"""

from __future__ import annotations

import math
import os
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .datalist import SPLITS, write_json_atomic

__all__ = [
    "MIN_CLASSES_PER_SILO",
    "assign_classes",
    "shared_count",
    "classification_datalist",
    "split_counts",
    "make_silos",
    "write_silos",
]

#: every silo must hold at least this many classes (a one-class silo has nothing to classify)
MIN_CLASSES_PER_SILO = 2


def _check_unseen(unseen: float) -> float:
    u = float(unseen)
    if not (0.0 <= u <= 1.0) or math.isnan(u):
        raise ValueError(f"unseen must be a proportion in [0, 1], got {unseen!r}")
    return u


def shared_count(n_classes: int, n_silos: int, unseen: float) -> int:
    """Number of classes every silo holds: ``round(C (1 - u) / (M u + 1 - u))`` (0 at u = 1, C at u = 0)."""
    u = _check_unseen(unseen)
    if u == 1.0:
        return 0
    return int(min(n_classes, max(0, math.floor(n_classes * (1.0 - u) / (n_silos * u + 1.0 - u) + 0.5))))


def assign_classes(classes: Sequence[str], n_silos: int, unseen: float = 1.0, seed: int = 0) -> List[List[str]]:
    """Which classes each of ``n_silos`` silos holds (module docstring); lists in ``classes`` order.

    Raises:
        ValueError: duplicate class names, fewer than one silo, ``unseen`` outside [0, 1], or a silo
            that would hold fewer than :data:`MIN_CLASSES_PER_SILO` classes (too few classes for the
            number of silos at this unseen proportion).
    """
    classes = list(classes)
    if len(set(classes)) != len(classes):
        raise ValueError(f"duplicate class names in {classes}")
    if int(n_silos) != n_silos or n_silos < 1:
        raise ValueError(f"n_silos must be a positive integer, got {n_silos!r}")
    n_silos = int(n_silos)
    u = _check_unseen(unseen)
    n = len(classes)
    n_shared = shared_count(n, n_silos, u)
    order = np.random.default_rng([zlib.crc32(b"fedseg-silos"), int(seed)]).permutation(n)
    shared = {classes[i] for i in order[:n_shared]}
    private = [classes[i] for i in order[n_shared:]]
    held: List[set] = [set(shared) for _ in range(n_silos)]
    for j, name in enumerate(private):
        held[j % n_silos].add(name)
    for k, h in enumerate(held):
        if len(h) < MIN_CLASSES_PER_SILO:
            raise ValueError(
                f"silo {k} would hold {len(h)} class(es) ({n} classes, {n_silos} silos, unseen={u}); every silo "
                f"needs at least {MIN_CLASSES_PER_SILO}: use more classes, fewer silos or a lower unseen proportion"
            )
    return [[c for c in classes if c in h] for h in held]


def split_counts(n: int, fractions: Sequence[float]) -> Tuple[int, int, int]:
    """(training, validation, test) counts of ``n`` items, each split non-empty; ``n >= 3``."""
    from .synthetic.files import split_counts

    return split_counts(n, fractions)


def classification_datalist(
    label_space: Sequence[str],
    classes: Sequence[str],
    splits: Mapping[str, Sequence[Dict[str, Any]]],
    **extra: Any,
) -> Dict[str, Any]:
    """A classification datalist dict; ``splits[split]`` entries are ``{"image": path, "label": int}``.

    Checks that every label indexes ``label_space`` and names one of ``classes`` (the silo's set).
    """
    label_space = list(label_space)
    allowed = set()
    for c in classes:
        if c not in label_space:
            raise ValueError(f"class {c!r} is not in the label space {label_space}")
        allowed.add(label_space.index(c))
    for split, entries in splits.items():
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected {SPLITS}")
        for e in entries:
            if not isinstance(e.get("label"), int) or e["label"] not in allowed:
                raise ValueError(f"{split} entry {e} has label outside this silo's classes {list(classes)}")
    return {
        "task": "classification",
        "label_space": label_space,
        "classes": list(classes),
        **extra,
        **{split: [dict(e) for e in splits.get(split, [])] for split in SPLITS},
    }


def _groups(items: Sequence[Dict[str, Any]]) -> "OrderedDict[str, List[Dict[str, Any]]]":
    """Items by ``group`` (default: the image itself), in first-seen order."""
    out: "OrderedDict[str, List[Dict[str, Any]]]" = OrderedDict()
    for it in items:
        out.setdefault(str(it.get("group", it["image"])), []).append(it)
    return out


def make_silos(
    items: Sequence[Dict[str, Any]],
    sites: Sequence[str],
    unseen: float = 1.0,
    seed: int = 0,
    label_space: Optional[Sequence[str]] = None,
    split_fractions: Sequence[float] = (0.7, 0.1, 0.2),
) -> Dict[str, Dict[str, Any]]:
    """Divide labelled images among silos and split each silo per class into training/validation/test.

    Args:
        items: ``{"image": path, "label": class name, "group": optional id}``; images sharing a
            ``group`` (a patient, a source image) go to one silo and one split together.
        sites: silo names, in order (silo ``k`` gets ``assign_classes(...)[k]``).
        unseen: unseen proportion (module docstring).
        seed: seeds the class assignment and the image division.
        label_space: the global class order; default: the sorted class names of ``items``.
        split_fractions: per class and silo, fractions of groups for the three splits (each non-empty).

    Returns:
        ``{site: datalist dict}`` (image paths as given); write them with :func:`write_silos`.

    Raises:
        ValueError: a label outside ``label_space``, a group with two labels, or a (class, silo) share
            with fewer than 3 groups (one per split).
    """
    sites = list(sites)
    if not sites or len(set(sites)) != len(sites):
        raise ValueError(f"need distinct site names, got {sites}")
    names = sorted({str(it["label"]) for it in items})
    label_space = list(label_space) if label_space is not None else names
    missing = [c for c in names if c not in label_space]
    if missing:
        raise ValueError(f"labels {missing} are not in the label space {label_space}")
    assignment = assign_classes(label_space, len(sites), unseen, seed)
    by_class: Dict[str, List[Dict[str, Any]]] = {c: [] for c in label_space}
    group_label: Dict[str, str] = {}
    for it in items:
        label = str(it["label"])
        group = str(it.get("group", it["image"]))
        # a group (a patient) with two classes could not stay in one silo and one split
        if group_label.setdefault(group, label) != label:
            raise ValueError(f"group {group!r} has images of several classes ({group_label[group]!r}, {label!r})")
        by_class[label].append(it)

    splits: Dict[str, Dict[str, List[Dict[str, Any]]]] = {s: {sp: [] for sp in SPLITS} for s in sites}
    for ci, name in enumerate(label_space):
        holders = [s for s, held in zip(sites, assignment) if name in held]
        groups = _groups(by_class[name])
        keys = list(groups)
        rng = np.random.default_rng([zlib.crc32(f"fedseg-silos/{name}".encode()), int(seed)])
        keys = [keys[i] for i in rng.permutation(len(keys))]
        for h, site in enumerate(holders):
            share = keys[h :: len(holders)]  # groups dealt round-robin among the silos holding the class
            if len(share) < 3:
                raise ValueError(
                    f"class {name!r} has {len(share)} group(s) for silo {site!r} ({len(keys)} in all, shared by "
                    f"{len(holders)} silos); need at least 3 (one per split)"
                )
            n_train, n_val, _ = split_counts(len(share), split_fractions)
            parts = {"training": share[:n_train], "validation": share[n_train : n_train + n_val],
                     "test": share[n_train + n_val :]}
            for split, part in parts.items():
                for g in part:
                    splits[site][split].extend({"image": str(m["image"]), "label": ci} for m in groups[g])
    out = {}
    for site, held in zip(sites, assignment):
        for split in SPLITS:
            splits[site][split].sort(key=lambda e: (e["label"], e["image"]))
        out[site] = classification_datalist(
            label_space, held, splits[site], name=f"fedseg-silo-{site}", site=site, unseen=float(unseen), seed=int(seed)
        )
    return out


def _relative_if_inside(image: str, folder: Path) -> str:
    """``image`` relative to ``folder`` when it lies under it (generated data); else absolute (data read in place)."""
    path = Path(image).resolve()
    try:
        return path.relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(path)


def write_silos(silos: Mapping[str, Dict[str, Any]], out_dir: str | os.PathLike) -> Dict[str, Path]:
    """Write ``out_dir/<site>/datalist.json`` per silo and
    ``out_dir/site_datalists.json``; returns ``{site: datalist path}``.

    Image paths under a silo's folder are written relative to it, others (real data read in place) absolute.
    Every datalist must carry the same ``label_space``.
    """
    out_dir = Path(out_dir)
    spaces = {tuple(d["label_space"]) for d in silos.values()}
    if len(spaces) != 1:
        raise ValueError("silos disagree on the label space; every datalist must carry the same global list")
    paths: Dict[str, Path] = {}
    for site, data in silos.items():
        folder = out_dir / site
        folder.mkdir(parents=True, exist_ok=True)
        rel = dict(data)
        for split in SPLITS:
            rel[split] = [{**e, "image": _relative_if_inside(e["image"], folder)} for e in data[split]]
        paths[site] = write_json_atomic(folder / "datalist.json", rel)
    write_json_atomic(out_dir / "site_datalists.json", {s: str(p.resolve()) for s, p in paths.items()})
    return paths

