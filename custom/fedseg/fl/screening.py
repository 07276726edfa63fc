"""Screening of site results before aggregation: hostile or broken updates are rejected with a reason.

``fedseg.fl.validation`` checks one result on its own (names, shapes, NaN/Inf). This module adds the checks
a server can make once it knows what it sent and what the other sites answered:

* **per result** (:func:`check_result`): a stale answer (its round is not the current round), declared
  statistics outside their valid range (each objective's ``statistic_ranges``, e.g. an uncertainty
  ``U < 0``, a probability ``> 1``, a negative sample count), an all-zero model;
* **against what the server sent and across the sites of one task** (:func:`screen_models`), with
  ``u_i = w_i - w_sent_i`` the update of site ``i`` against the model the server sent it:
    - ``cos(w_i, w_sent_i) < min_model_cosine``: a sign-flipped / opposite model (honest local training
      moves a model a little, so the cosine stays near 1; a negated model has cosine near -1);
    - ``||u_i|| > max_update_norm`` (absolute bound, off by default);
    - ``||u_i|| > norm_factor * median_{j != i} ||u_j||`` (a scaled model), only with ``min_sites`` or more
      sites, because with two sites "the others" is one site and nobody can tell which is wrong;
    - ``cos(u_i, median_j u_j) < min_update_cosine`` with the coordinate-wise median update over all sites (an
      update pointing back against the others'), also only with ``min_sites`` or more sites. Honest updates
      need not agree much: with Adam, three local epochs and non-IID sites we measured pairwise cosines of
      only 0.04-0.06 between honest updates (tiny profile, 4 polyp sites), so a flipped honest-sized update
      sits at about -0.05 and cannot be told apart; the rule catches a flip against a clear consensus
      (cosine of the honest updates well above ``-min_update_cosine``) and is set low so as never to reject
      an honest site.

A result may carry several models (``fedseg.fl.protocol.pack_models``, FedEFM's overseas experts): each
is screened, against the model of the same name the server sent when there is one, and one bad model
rejects the site's whole result. Only norms and cosines are computed; nothing is stored.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

import torch

from fedseg.fl.validation import InvalidUpdateError
from fedseg.strategies.base import Params

#: ranges every result obeys whatever the method: ``{key: (low, high)}``, inclusive
BASE_STATISTIC_RANGES: Dict[str, Tuple[float, float]] = {"n_samples": (0.0, math.inf)}
#: ranges of the metrics the site loop sends (Dice is a fraction; counts and seconds are not negative)
METRIC_RANGES: Dict[str, Tuple[float, float]] = {
    "val_dice": (0.0, 1.0),
    "dice": (0.0, 1.0),
    "dice_fov": (0.0, 1.0),
    "val_accuracy": (0.0, 1.0),
    "accuracy": (0.0, 1.0),
    "balanced_accuracy": (0.0, 1.0),
    "steps": (0.0, math.inf),
    "compute_time": (0.0, math.inf),
}
#: name under which a result's main (unpacked) model is screened
MAIN_MODEL = ""


@dataclass(frozen=True)
class ScreeningConfig:
    """What the server checks before aggregating (job option ``screening``, a dict of these fields).

    Attributes:
        enabled: ``False`` turns every check of this module off (NaN/Inf/shape checks stay).
        reject_zero_models: reject a model whose floating-point weights are all exactly zero.
        norm_factor: reject ``||u_i|| > norm_factor x`` the median update norm of the other sites
            (``0`` = off). 10 leaves honest non-IID sites (a few times apart) alone.
        max_update_norm: reject ``||u_i||`` above this absolute bound (``None`` = off); depends on the
            model and learning rate, so it is off unless a user sets it.
        min_model_cosine: reject ``cos(w_i, w_sent_i) <`` this (``None`` = off): a returned model pointing away
            from the one the site was sent (a sign-flipped model). Honest training keeps it near 1.
        min_update_cosine: reject ``cos(u_i, median update) <`` this (``None`` = off): an update pointing
            against the others' (see the module notes for why the default is low).
        min_sites: fewest screened sites for the two relative rules (below it they are skipped).
        check_round: reject a result whose round is not the round the task was sent for.
    """

    enabled: bool = True
    reject_zero_models: bool = True
    norm_factor: float = 10.0
    max_update_norm: Optional[float] = None
    min_model_cosine: Optional[float] = 0.0
    # off by default: silos with disjoint label sets (FedEFM, unseen 100 %) pull honestly against each other
    min_update_cosine: Optional[float] = None
    min_sites: int = 3
    check_round: bool = True

    def __post_init__(self) -> None:
        if not (self.norm_factor == 0 or self.norm_factor > 1):
            raise ValueError(f"screening norm_factor must be 0 (off) or > 1, got {self.norm_factor}")
        if self.max_update_norm is not None and not self.max_update_norm > 0:
            raise ValueError(f"screening max_update_norm must be > 0 or None, got {self.max_update_norm}")
        for name in ("min_model_cosine", "min_update_cosine"):
            value = getattr(self, name)
            if value is not None and not -1.0 <= value <= 1.0:
                raise ValueError(f"screening {name} must lie in [-1, 1] or be None, got {value}")
        if int(self.min_sites) < 3:
            raise ValueError(f"screening min_sites must be >= 3 (with two sites neither can be called the outlier), got {self.min_sites}")

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]]) -> "ScreeningConfig":
        """Build from a job's ``screening`` dict; unknown keys are an error naming them."""
        options = dict(options or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown screening options {unknown}; known: {sorted(known)}")
        return cls(**options)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------ one result
def check_statistic_ranges(site: str, values: Mapping[str, Any], ranges: Mapping[str, Tuple[float, float]]) -> None:
    """Every value (or every element of a list) of a key in ``ranges`` lies in ``[low, high]``.

    Raises:
        InvalidUpdateError: naming the site, the statistic, its value and the valid range.
    """
    for key, (low, high) in ranges.items():
        if key not in values:
            continue
        value = values[key]
        items = value.flatten().tolist() if isinstance(value, torch.Tensor) else value
        items = items if isinstance(items, (list, tuple)) else [items]
        for item in items:
            x = float(item)
            if not low <= x <= high:
                raise InvalidUpdateError(f"{site}: statistic '{key}' = {value!r} outside its valid range [{low}, {high}]")


def check_round(site: str, result_round: Optional[float], expected: Optional[int]) -> None:
    """A result that says it belongs to another round is stale (a cached or replayed answer)."""
    if result_round is not None and expected is not None and int(result_round) != int(expected):
        raise InvalidUpdateError(f"{site}: stale update: result is for round {int(result_round)}, current round is {int(expected)}")


def is_zero_model(params: Params) -> bool:
    """All floating-point entries exactly zero (an empty or integer-only state dict is not a "zero model")."""
    floats = [v for v in params.values() if torch.is_floating_point(v)]
    return bool(floats) and all(not bool(v.any()) for v in floats)


def check_result(
    site: str,
    models: Mapping[str, Params],
    statistics: Mapping[str, Any],
    ranges: Mapping[str, Tuple[float, float]],
    result_round: Optional[int],
    expected_round: Optional[int],
    config: ScreeningConfig,
) -> None:
    """The per-result checks (stale round, statistic ranges, all-zero models); raises InvalidUpdateError."""
    if not config.enabled:
        return
    if config.check_round:
        check_round(site, result_round, expected_round)
    check_statistic_ranges(site, statistics, ranges)
    if config.reject_zero_models:
        for name, params in models.items():
            if is_zero_model(params):
                raise InvalidUpdateError(f"{site}{_label(name)}: all-zero model")


# ----------------------------------------------------------------------------------- across sites
def _update(params: Params, sent: Params, key: str) -> torch.Tensor:
    return params[key].detach().to(torch.float64).flatten() - sent[key].detach().to(torch.float64).flatten()


#: up to this many sites the median is taken by a sorting network of element-wise min / max (K^2 / 2 of them, each
#: one pass over the parameters), several times faster than a sort along the first axis at a handful of sites
SORTING_NETWORK_SITES = 16


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """Median over dim 0 of ``(K, ...)``; the mean of the two middle values for even ``K`` (numpy's median)."""
    k = stacked.shape[0]
    if k > SORTING_NETWORK_SITES:
        ordered = list(torch.sort(stacked, dim=0).values.unbind(0))
    else:  # odd-even transposition sort of the K rows: exact, the same order statistics as a sort
        ordered = list(stacked.unbind(0))
        for phase in range(k):
            for i in range(phase % 2, k - 1, 2):
                ordered[i], ordered[i + 1] = torch.minimum(ordered[i], ordered[i + 1]), torch.maximum(ordered[i], ordered[i + 1])
    if k % 2:
        return ordered[k // 2]
    return 0.5 * (ordered[k // 2 - 1] + ordered[k // 2])


def update_geometry(
    models: Mapping[Tuple[str, str], Params], sent: Mapping[Tuple[str, str], Params]
) -> Dict[Tuple[str, str], Tuple[float, float, float]]:
    """``{(site, model): (||u||, cos(u, coordinate-wise median of all u), cos(w, w_sent))}`` for the models
    with a sent counterpart (floating-point entries only).

    Computed one parameter at a time, so memory is K times one parameter tensor, not K models.
    A cosine is ``nan`` where one of its vectors is zero.
    """
    ids = [i for i in models if i in sent]
    if not ids:
        return {}
    keys = [k for k, v in sent[ids[0]].items() if torch.is_floating_point(v)]
    sq, dot, w_sq, s_sq, ws = (torch.zeros(len(ids), dtype=torch.float64) for _ in range(5))
    med_sq = torch.zeros((), dtype=torch.float64)
    for key in keys:
        stacked = torch.stack([_update(models[i], sent[i], key) for i in ids])  # (K, n_key)
        median = coordinate_median(stacked)
        sq += (stacked**2).sum(dim=1)
        dot += stacked @ median
        med_sq += (median**2).sum()
        w = torch.stack([models[i][key].detach().to(torch.float64).flatten() for i in ids])
        s = torch.stack([sent[i][key].detach().to(torch.float64).flatten() for i in ids])
        w_sq += (w**2).sum(dim=1)
        s_sq += (s**2).sum(dim=1)
        ws += (w * s).sum(dim=1)
    norms = sq.sqrt()
    cos = _cosine(dot, norms * med_sq.sqrt())
    model_cos = _cosine(ws, w_sq.sqrt() * s_sq.sqrt())
    return {i: (float(n), float(c), float(m)) for i, n, c, m in zip(ids, norms, cos, model_cos)}


def _cosine(dot: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return torch.where(denominator > 0, dot / denominator.clamp_min(1e-300), torch.full_like(dot, math.nan))


def screen_models(
    models: Mapping[str, Mapping[str, Params]],
    sent: Mapping[str, Mapping[str, Params]],
    config: ScreeningConfig,
    geometry_out: Optional[Dict[str, Dict[str, float]]] = None,
) -> Dict[str, str]:
    """Cross-site checks of one task's results.

    Args:
        models: ``{site: {model name: params}}`` as returned (main model under ``MAIN_MODEL``).
        sent: ``{site: {model name: params}}`` as the server sent them (what ``u`` is measured from).
        config: thresholds.
        geometry_out: filled with ``{site[ model]: {"update_norm", "update_cosine", "model_cosine"}}`` (for the report: what
            the thresholds were compared with).
    Returns:
        ``{site: reason}`` for each site to reject (the others pass).
    """
    if not config.enabled:
        return {}
    flat = {(s, n): p for s, named in models.items() for n, p in named.items()}
    reference = {(s, n): p for s, named in sent.items() for n, p in named.items() if (s, n) in flat}
    geometry = update_geometry(flat, reference)
    if geometry_out is not None:
        for (site, name), (norm, cos, model_cos) in geometry.items():
            geometry_out[f"{site}{_label(name)}"] = {"update_norm": norm, "update_cosine": cos, "model_cosine": model_cos}
    rejected: Dict[str, str] = {}

    def reject(ident: Tuple[str, str], reason: str) -> None:
        rejected.setdefault(ident[0], f"{ident[0]}{_label(ident[1])}: {reason}")

    if config.min_model_cosine is not None:
        for ident, (_, _, model_cos) in geometry.items():
            if math.isfinite(model_cos) and model_cos < config.min_model_cosine:
                reject(ident, f"opposite model: cosine {model_cos:.3f} with the model it was sent (limit {config.min_model_cosine:g})")
    if config.max_update_norm is not None:
        for ident, (norm, _, _) in geometry.items():
            if norm > config.max_update_norm:
                reject(ident, f"update norm {norm:.4g} above max_update_norm {config.max_update_norm:.4g}")
    sites = {s for s, _ in geometry}
    if len(sites) < config.min_sites:
        return rejected
    if config.norm_factor:
        for ident, (norm, _, _) in geometry.items():
            others = torch.tensor([g[0] for (s, _), g in geometry.items() if s != ident[0]], dtype=torch.float64)
            median = float(coordinate_median(others))
            if median > 0 and norm > config.norm_factor * median:
                reject(ident, f"update norm {norm:.4g} is {norm / median:.1f}x the median of the other sites ({median:.4g}; limit {config.norm_factor:g}x)")
    if config.min_update_cosine is not None:
        for ident, (_, cos, _) in geometry.items():
            if math.isfinite(cos) and cos < config.min_update_cosine:
                reject(ident, f"update points against the other sites' (cosine {cos:.3f} with the median update, limit {config.min_update_cosine:g})")
    return rejected


def duplicated_sites(names: Iterable[str]) -> Dict[str, int]:
    """``{name: count}`` of the names that occur more than once."""
    counts: Dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return {n: c for n, c in counts.items() if c > 1}


def _label(name: str) -> str:
    return f" [{name}]" if name != MAIN_MODEL else ""
