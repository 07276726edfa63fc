"""The label space of a segmentation job: its classes, how masks store them, and the regions evaluated.

A datalist declares it at its top level (every field optional)::

    "labels":       {"background": 0, "rim": 1, "cup": 2}     # class name -> index (0 is background)
    "label_values": {"255": 0, "128": 1, "0": 2}              # stored mask value -> class index
    "regions":      {"disc": ["rim", "cup"], "cup": ["cup"]}  # nested structures, evaluated as unions
    "num_classes":  3                                         # optional; must equal len(labels)

``labels`` may also be written index -> name (``{"0": "background", "1": "vessel"}``, the form fedseg's
importers and built-in families have always written). Without ``label_values`` a mask stores the class
index itself (``0..C-1``); a binary space with no ``label_values`` keeps the historic rule: masks are
{0, 1} or {0, 255}, 255 meaning foreground. Without any of these fields the space is that binary one
(background / foreground) and the pipeline behaves exactly as it did before label spaces existed.

Masks may be RGB(A) when ``label_values`` is declared (e.g. fundus OD/OC masks store 0 / 128 / 255 in all
three channels): the channels must then be identical, and one is read. Regions (the REFUGE convention:
optic disc = rim + cup) are unions of foreground classes; a region may share a class's name only when it
is exactly that class.

Which sites may train together: they must agree on the class names (in index order) and on the regions.
The stored encoding (``label_values``) is each site's own: sites decode their own masks to class indices
and predictions are written back in the encoding of the datalist they are for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .errors import DatalistError

__all__ = ["LabelSpace", "LabelSpaceError", "BINARY", "metric_key", "split_metric_key"]

#: class and region names become metric keys (``dice:<name>``) and file/column names
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*$")
#: what separates a metric from the class or region it is about: ``dice:cup``, ``hd95_mm:disc``
METRIC_SEPARATOR = ":"


class LabelSpaceError(DatalistError):
    """A label space that is malformed, a mask it cannot decode, or two spaces that differ where they must agree;
    the message names where it came from."""


def metric_key(metric: str, name: str) -> str:
    """``"dice", "cup" -> "dice:cup"``: the key of a per-class or per-region metric."""
    return f"{metric}{METRIC_SEPARATOR}{name}"


def split_metric_key(key: str) -> Tuple[str, Optional[str]]:
    """``"dice:cup" -> ("dice", "cup")``; ``"dice" -> ("dice", None)``."""
    base, sep, name = key.partition(METRIC_SEPARATOR)
    return (base, name) if sep else (key, None)


def _as_number(text: Any, where: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise LabelSpaceError(f"label_values key {text!r} in {where} is not a number (stored mask value)") from None
    if not np.isfinite(value):
        raise LabelSpaceError(f"label_values key {text!r} in {where} is not finite")
    return value


@dataclass(frozen=True)
class LabelSpace:
    """Classes (index order, background first), stored encoding and regions of a segmentation job.

    Attributes:
        names: class names by index; ``names[0]`` is the background.
        regions: ``{region: (class name, ...)}``; empty when none are declared.
        values: ``{stored value: class index}``; ``None`` = masks store class indices (and, for a binary
            space, the historic {0, 1} / {0, 255}).
        declared: whether the datalist declared anything (``labels``, ``label_values``, ``regions``).
    """

    names: Tuple[str, ...] = ("background", "foreground")
    regions: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    values: Optional[Dict[float, int]] = None
    declared: bool = False

    # ------------------------------------------------------------------------------------ parsing
    @classmethod
    def from_datalist(cls, info: Mapping[str, Any], where: str = "<datalist>") -> "LabelSpace":
        """The label space a datalist's top-level fields declare (module docstring); binary when it declares none.

        Raises:
            LabelSpaceError: naming ``where`` — unknown class indices or names, a background that is not
                class 0, duplicate names, a ``num_classes`` that disagrees with ``labels``, a stored value
                mapped to a class that does not exist, a region of unknown or background classes.
        """
        labels, values, regions = info.get("labels"), info.get("label_values"), info.get("regions")
        names = _parse_names(labels, where) if labels is not None else None
        declared_n = info.get("num_classes")
        if declared_n is not None:
            if not isinstance(declared_n, int) or isinstance(declared_n, bool) or declared_n < 2:
                raise LabelSpaceError(f"num_classes in {where} must be an integer >= 2, got {declared_n!r}")
            if names is not None and len(names) != declared_n:
                raise LabelSpaceError(
                    f"{where} declares num_classes={declared_n} but its labels name {len(names)} classes {list(names)}"
                )
            if names is None:
                names = ("background",) + tuple(f"class{i}" for i in range(1, declared_n))
        value_map = parse_label_values(values, where) if values is not None else None
        if names is None:
            n = (max(value_map.values()) + 1) if value_map else 2
            names = ("background", "foreground") if n == 2 else ("background",) + tuple(f"class{i}" for i in range(1, n))
        if value_map is not None:
            bad = sorted({c for c in value_map.values() if c >= len(names)})
            if bad:
                raise LabelSpaceError(f"label_values in {where} map to class indices {bad}, but there are only {len(names)} classes {list(names)}")
            missing = [names[c] for c in range(len(names)) if c not in value_map.values()]
            if missing:
                raise LabelSpaceError(f"label_values in {where} give no stored value for classes {missing}")
        space = cls(
            names=tuple(names),
            regions=_parse_regions(regions, names, where) if regions is not None else {},
            values=value_map,
            declared=any(k in info for k in ("labels", "label_values", "regions", "num_classes")),
        )
        return space

    @classmethod
    def from_config(cls, train_config: Mapping[str, Any]) -> "LabelSpace":
        """The label space a job's ``train_config`` declares (``num_classes``, ``labels``, ``regions``,
        ``label_values``), in the datalist's field names."""
        info = {k: train_config[k] for k in ("labels", "regions", "label_values") if train_config.get(k) is not None}
        if train_config.get("num_classes") is not None:
            info["num_classes"] = int(train_config["num_classes"])
        return cls.from_datalist(info, "the job's train_config")

    # --------------------------------------------------------------------------------- properties
    @property
    def num_classes(self) -> int:
        return len(self.names)

    @property
    def foreground(self) -> Tuple[str, ...]:
        """Class names without the background."""
        return self.names[1:]

    @property
    def multi_class(self) -> bool:
        """Whether per-class / per-region metrics are reported: more than one foreground class, or regions."""
        return self.num_classes > 2 or bool(self.regions)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def region_indices(self) -> Dict[str, Tuple[int, ...]]:
        """``{region: class indices}`` in declaration order."""
        return {r: tuple(self.index(n) for n in members) for r, members in self.regions.items()}

    def evaluated_structures(self) -> Dict[str, Tuple[int, ...]]:
        """``{name: class indices}`` of every per-class and per-region metric: each foreground class on its own,
        then each region (a region named like a class is that class and is not repeated)."""
        out = {name: (i,) for i, name in enumerate(self.names) if i > 0}
        for region, idx in self.region_indices().items():
            out.setdefault(region, idx)
        return out

    def signature(self) -> Dict[str, Any]:
        """What sites must agree on to train one model: class names in index order and regions."""
        return {"labels": list(self.names), "regions": {r: list(m) for r, m in self.regions.items()}}

    def describe(self) -> str:
        """One line for error messages: ``3 classes [background, rim, cup], regions {disc: rim+cup}``."""
        text = f"{self.num_classes} classes [{', '.join(self.names)}]"
        if self.regions:
            text += ", regions {" + ", ".join(f"{r}: {'+'.join(m)}" for r, m in self.regions.items()) + "}"
        return text

    def to_config(self) -> Dict[str, Any]:
        """``train_config`` fields of this space: ``num_classes`` always; ``labels`` / ``regions`` for a multi-class
        space (:attr:`multi_class`)."""
        out: Dict[str, Any] = {"num_classes": self.num_classes}
        if self.multi_class:
            out["labels"] = {n: i for i, n in enumerate(self.names)}
        if self.regions:
            out["regions"] = {r: list(m) for r, m in self.regions.items()}
        return out

    def values_json(self) -> Optional[Dict[str, int]]:
        """``label_values`` as a datalist writes it (string keys), or None."""
        if self.values is None:
            return None
        return {_value_text(v): c for v, c in self.values.items()}

    # --------------------------------------------------------------------------------- checking
    def check_compatible(self, other: "LabelSpace", mine: str, theirs: str) -> None:
        """Raise :class:`LabelSpaceError` naming both sources when the two spaces disagree on classes or regions.

        A space that did not declare class names (generic ``class<k>`` / binary ``foreground``) agrees with any
        space of the same number of classes: only the count is compared then.
        """
        if self.num_classes != other.num_classes:
            raise LabelSpaceError(
                f"label spaces differ: {mine} has {self.describe()}, {theirs} has {other.describe()}; "
                "all sites of a job must share one label space"
            )
        named = declares_names(self) and declares_names(other)
        if (named and self.names != other.names) or (self.regions and other.regions and self.regions != other.regions):
            raise LabelSpaceError(
                f"label spaces differ: {mine} has {self.describe()}, {theirs} has {other.describe()}; "
                "all sites of a job must share one label space"
            )

    # ------------------------------------------------------------------------------- decoding
    def decode(self, mask: np.ndarray, source: str = "<mask>") -> np.ndarray:
        """Stored single-channel mask ``(*spatial)`` -> class indices, int64, same shape, values ``0..C-1``.
        (An RGB mask goes through :meth:`single_channel` or :meth:`decode_channel_first` first.)

        Raises:
            LabelSpaceError: naming ``source`` and listing the values the space does not declare.
        """
        return self._decode_values(np.asarray(mask), source)

    def decode_channel_first(self, mask: np.ndarray, source: str = "<mask>") -> np.ndarray:
        """``(c, *spatial)`` stored mask (MONAI's channel-first layout) -> ``(1, *spatial)`` class indices.
        ``c > 1`` is an RGB(A) mask: the colour channels must be identical (:meth:`decode`)."""
        mask = np.asarray(mask)
        if mask.shape[0] > 1:
            mask = self.single_channel(np.moveaxis(mask, 0, -1), source)
        else:
            mask = mask[0]
        return self._decode_values(mask, source)[None]

    def single_channel(self, mask: np.ndarray, source: str) -> np.ndarray:
        """Channel-last ``(H, W, c)`` -> ``(H, W)``: one channel of an RGB(A) mask whose colour channels agree.

        Raises:
            LabelSpaceError: the datalist declares no ``label_values`` (an RGB mask is then refused, as always),
                or the colour channels differ (which channel would be the label?).
        """
        if self.values is None:
            raise LabelSpaceError(
                f"label {source} must be a single-channel 2D mask, got shape {tuple(mask.shape)} "
                "(an RGB mask is read only where the datalist declares its label_values)"
            )
        colour = mask[..., :3] if mask.shape[-1] >= 3 else mask
        first = colour[..., :1]
        if not np.array_equal(colour, np.broadcast_to(first, colour.shape)):
            differing = int(np.count_nonzero((colour != first).any(axis=-1)))
            raise LabelSpaceError(
                f"label {source} is an RGB mask whose channels differ at {differing} pixels; a label mask must "
                "store the same value in every channel (or be single-channel)"
            )
        return colour[..., 0]

    def _decode_values(self, mask: np.ndarray, source: str) -> np.ndarray:
        found = np.unique(mask)
        if self.values is None:
            if self.num_classes == 2:
                if set(found.tolist()) <= {0, 1} or set(found.tolist()) <= {0, 255}:
                    return (mask > 0).astype(np.int64)
                raise LabelSpaceError(
                    f"label {source} is not a binary mask: found {found.size} distinct values {{{_shown(found)}}}; "
                    "expected values in {0,1} or {0,255} (a multi-class mask needs 'labels' / 'label_values' in its datalist)"
                )
            allowed = np.arange(self.num_classes)
            undeclared = found[~np.isin(found, allowed)]
            if undeclared.size:
                raise LabelSpaceError(
                    f"label {source} has values {{{_shown(undeclared)}}} outside the class indices 0..{self.num_classes - 1} "
                    f"of {self.describe()}; declare 'label_values' in the datalist if the mask stores other values"
                )
            return mask.astype(np.int64)
        keys = np.array(sorted(self.values), dtype=np.float64)
        undeclared = found[~np.isin(found.astype(np.float64), keys)]
        if undeclared.size:
            raise LabelSpaceError(
                f"label {source} has values {{{_shown(undeclared)}}} not declared in label_values "
                f"{self.values_json()} (declared: {{{_shown(keys)}}})"
            )
        classes = np.array([self.values[k] for k in keys], dtype=np.int64)
        return classes[np.searchsorted(keys, mask.astype(np.float64))]

    # ------------------------------------------------------------------------------- encoding
    def output_values(self) -> np.ndarray:
        """``(C,)`` the stored value written for each class: the first declared ``label_values`` key of the class
        (in the datalist's order); without ``label_values`` the class index, and 0 / 255 for a binary space."""
        if self.values is None:
            return np.array([0, 255] if self.num_classes == 2 else list(range(self.num_classes)), dtype=np.float64)
        out = np.zeros(self.num_classes, dtype=np.float64)
        seen = set()
        for value, c in self.values.items():
            if c not in seen:
                out[c], seen = value, seen | {c}
        return out

    def encode(self, classes: np.ndarray) -> np.ndarray:
        """Class indices (any shape, values ``0..C-1``) -> stored values, same shape (float64)."""
        classes = np.asarray(classes).astype(np.int64)
        return self.output_values()[classes]


#: the space of a datalist that declares nothing: background / foreground, masks {0,1} or {0,255}
BINARY = LabelSpace()


def declares_names(space: LabelSpace) -> bool:
    generic = ("background",) + tuple(f"class{i}" for i in range(1, space.num_classes))
    return space.names not in (generic, BINARY.names)


def _shown(values: np.ndarray, limit: int = 8) -> str:
    items = [_value_text(v) for v in np.asarray(values).tolist()[:limit]]
    return ", ".join(items) + (" ..." if np.asarray(values).size > limit else "")


def _value_text(v: Any) -> str:
    v = float(v)
    return str(int(v)) if v.is_integer() else repr(v)


def _parse_names(labels: Any, where: str) -> Tuple[str, ...]:
    """``{"background": 0, ...}`` (name -> index) or ``{"0": "background", ...}`` (index -> name) -> names by index."""
    if not isinstance(labels, Mapping) or len(labels) < 2:
        raise LabelSpaceError(f"labels in {where} must map at least two class names to indices, got {labels!r}")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels.values()):
        pairs = {int(v): str(k) for k, v in labels.items()}
    elif all(isinstance(v, str) for v in labels.values()):
        try:
            pairs = {int(k): v for k, v in labels.items()}
        except ValueError:
            raise LabelSpaceError(f"labels in {where} must be name -> index or index -> name, got {labels!r}") from None
    else:
        raise LabelSpaceError(f"labels in {where} must be name -> index or index -> name, got {labels!r}")
    if len(pairs) != len(labels):
        raise LabelSpaceError(f"labels in {where} give one index to two classes: {labels!r}")
    if sorted(pairs) != list(range(len(pairs))):
        raise LabelSpaceError(f"labels in {where} must use the indices 0..{len(pairs) - 1} once each, got {sorted(pairs)}")
    names = tuple(pairs[i] for i in range(len(pairs)))
    if len(set(names)) != len(names):
        raise LabelSpaceError(f"labels in {where} name a class twice: {list(names)}")
    for name in names:
        if not _NAME.match(name):
            raise LabelSpaceError(f"class name {name!r} in {where} must start with a letter and hold only letters, digits, '_' or '-'")
    return names


def parse_label_values(values: Any, where: str) -> Dict[float, int]:
    """A ``label_values`` field (stored mask value -> class index, keys numbers or their strings) as
    ``{float(value): index}``.

    Raises:
        LabelSpaceError: naming ``where``, for an empty or non-mapping field, a key that is not a number, an index
            that is not an int >= 0, or a stored value listed twice (``"255"`` and ``255.0``).
    """
    if not isinstance(values, Mapping) or not values:
        raise LabelSpaceError(f"label_values in {where} must map stored mask values to class indices, got {values!r}")
    out: Dict[float, int] = {}
    for key, c in values.items():
        number = _as_number(key, where)
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise LabelSpaceError(f"label_values[{key!r}] in {where} must be a class index >= 0, got {c!r}")
        if number in out:
            raise LabelSpaceError(f"label_values in {where} list the stored value {key!r} twice")
        out[number] = c
    return out


def _parse_regions(regions: Any, names: Sequence[str], where: str) -> Dict[str, Tuple[str, ...]]:
    if not isinstance(regions, Mapping) or not regions:
        raise LabelSpaceError(f"regions in {where} must map region names to lists of class names, got {regions!r}")
    out: Dict[str, Tuple[str, ...]] = {}
    for region, members in regions.items():
        if not isinstance(region, str) or not _NAME.match(region):
            raise LabelSpaceError(f"region name {region!r} in {where} must start with a letter and hold only letters, digits, '_' or '-'")
        if isinstance(members, str) or not isinstance(members, Sequence) or not members:
            raise LabelSpaceError(f"region {region!r} in {where} must list at least one class name, got {members!r}")
        unknown = [m for m in members if m not in names]
        if unknown:
            raise LabelSpaceError(f"region {region!r} in {where} names unknown classes {unknown} (classes: {list(names)})")
        if names[0] in members:
            raise LabelSpaceError(f"region {region!r} in {where} includes the background class {names[0]!r}")
        if len(set(members)) != len(members):
            raise LabelSpaceError(f"region {region!r} in {where} lists a class twice: {list(members)}")
        if region in names and tuple(members) != (region,):
            raise LabelSpaceError(f"region {region!r} in {where} has a class's name but is not exactly that class: {list(members)}")
        out[region] = tuple(members)
    return out


#: how training patches are centred in patch mode (``train_config["patch_sampler"]``; None = by the label space)
PATCH_SAMPLERS = ("posneg", "classes")


def resolve_patch_sampler(train_config: Mapping[str, Any], space: LabelSpace) -> str:
    """``train_config["patch_sampler"]`` where set, else ``"classes"`` (MONAI ``RandCropByLabelClassesd``: centres
    drawn class by class, so a rare class such as the optic cup is found) for more than one foreground class, and
    ``"posneg"`` (``RandCropByPosNegLabeld``, foreground vs background) for a binary space."""
    sampler = train_config.get("patch_sampler") or ("classes" if space.num_classes > 2 else "posneg")
    if sampler not in PATCH_SAMPLERS:
        raise ValueError(f"patch_sampler {sampler!r}: expected one of {PATCH_SAMPLERS}")
    return sampler


def site_label_space(train_config: Mapping[str, Any], datalist_info: Mapping[str, Any], where: str) -> LabelSpace:
    """A site's label space (its datalist's), checked against the job's (``train_config``: ``num_classes`` and,
    where declared, ``labels`` / ``regions``).

    Raises:
        LabelSpaceError: naming the datalist and the job when they disagree, so the site stops before training.
    """
    site = LabelSpace.from_datalist(datalist_info, where)
    job = LabelSpace.from_config({k: v for k, v in train_config.items() if k != "label_values"})
    job.check_compatible(site, "the job's train_config", where)
    from dataclasses import replace

    if not declares_names(site) and declares_names(job):
        # a datalist that only counts its classes takes the job's names (for the per-class metric keys)
        site = replace(site, names=job.names)
    if job.regions and not site.regions:
        site = replace(site, regions=job.regions)
    return site



def order_structure_keys(keys: Sequence[str], train_config: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Per-class / per-region metric keys (``dice:cup``, ...) in label order: the job's foreground classes by index,
    then its regions as declared (``train_config``'s ``labels`` / ``regions``), then any other name alphabetically.
    Results travel through JSON and NVFlare's messages, which do not keep key order; tables must."""
    order: List[str] = []
    if train_config and (train_config.get("labels") or train_config.get("regions")):
        try:
            order = list(LabelSpace.from_config({k: v for k, v in train_config.items() if k != "label_values"}).evaluated_structures())
        except (DatalistError, TypeError, ValueError):
            order = []
    rank = {name: i for i, name in enumerate(order)}
    return sorted(dict.fromkeys(keys), key=lambda k: (rank.get(split_metric_key(k)[1], len(rank)), split_metric_key(k)[1] or ""))


def parse_label_values_option(text: Optional[str]) -> Optional[Dict[str, int]]:
    """A ``--label-values`` command-line value (JSON object) -> dict, or None."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LabelSpaceError(f"--label-values must be a JSON object such as '{{\"255\": 0, \"128\": 1, \"0\": 2}}': {exc}") from None
    parse_label_values(value, "--label-values")
    return value
