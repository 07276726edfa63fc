"""Weighted parameter averaging shared by every strategy."""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from .base import Params


def weighted_average(models: Sequence[Params], weights: Sequence[float]) -> Params:
    """``sum_k w_k * theta_k`` for floating-point entries.

    Args:
        models: K state dicts with identical keys and shapes.
        weights: K non-negative weights summing to 1 (a convex combination).

    Non-floating entries (e.g. BatchNorm's ``num_batches_tracked``) are taken from the first model,
    since averaging counters is meaningless. Entries that are not tensors are encrypted ones
    (``fedseg.fl.homomorphic.Ciphertext``): their class sums them with the same weights, in the encrypted domain.
    """
    if len(models) == 0 or len(models) != len(weights):
        raise ValueError(f"need one weight per model, got {len(models)} models and {len(weights)} weights")
    w = torch.as_tensor([float(x) for x in weights], dtype=torch.float64)
    if torch.any(w < 0) or not torch.isclose(w.sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-6):
        raise ValueError(f"weights must be a convex combination, got {w.tolist()}")
    out: Params = {}
    for key, ref in models[0].items():
        if not isinstance(ref, torch.Tensor):
            out[key] = type(ref).weighted_sum([model[key] for model in models], w.tolist())
            continue
        if not torch.is_floating_point(ref):
            out[key] = ref.clone()
            continue
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for wk, model in zip(w, models):
            acc += wk * model[key].to(torch.float64)
        out[key] = acc.to(ref.dtype)
    return out


def sample_weights(n_samples: Mapping[str, int], sites: Sequence[str]) -> list:
    """``p_j = n_j / sum(n)`` in ``sites`` order."""
    total = float(sum(n_samples[s] for s in sites))
    if total <= 0:
        raise ValueError(f"sample counts must be positive, got {dict(n_samples)}")
    return [n_samples[s] / total for s in sites]


#: how a strategy weights the sites' models: by their training images, or equally
WEIGHTINGS = ("samples", "uniform")


def check_weighting(weighting: str, name: str = "weighting") -> None:
    """Refuse a weighting that is not one of :data:`WEIGHTINGS` (``name``: the option's name in the message)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"{name} must be 'samples' or 'uniform', got {weighting!r}")


def site_weights(weighting: str, n_samples: Mapping[str, int], sites: Sequence[str]) -> list:
    """Aggregation weights in ``sites`` order: ``1 / K`` each for ``weighting="uniform"``, else
    :func:`sample_weights` (each site's share of the training images)."""
    if weighting == "uniform":
        return [1.0 / len(sites)] * len(sites)
    return sample_weights(n_samples, sites)


#: ways to combine the sites' models: the weighted mean, or a robust statistic per coordinate
AGGREGATIONS = ("mean", "median", "trimmed_mean")


def check_aggregation(aggregation: str, trim: float) -> None:
    """Refuse an unknown aggregation or a trim fraction outside ``[0, 0.5)``."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if not 0.0 <= float(trim) < 0.5:
        raise ValueError(f"trim must lie in [0, 0.5) (the fraction cut from each end), got {trim}")


def coordinate_median(models: Sequence[Params]) -> Params:
    """Coordinate-wise median of K models (the mean of the two middle values for even K, as numpy's).

    With f < K/2 arbitrary models every coordinate stays within the others' range. Unweighted; non-floating
    entries are taken from the first model.
    """
    return _per_coordinate(models, _median_of_sorted)


def trimmed_mean(models: Sequence[Params], trim: float) -> Params:
    """Coordinate-wise trimmed mean: drop ``floor(trim * K)`` smallest and largest values, average the rest
    (``scipy.stats.trim_mean``'s rule). With f <= trim*K arbitrary models every coordinate stays within
    the others' range. Unweighted; non-floating entries are taken from the first model."""
    check_aggregation("trimmed_mean", trim)
    return _per_coordinate(models, lambda ordered: _trimmed_of_sorted(ordered, trim))


def robust_average(models: Sequence[Params], weights: Sequence[float], aggregation: str = "mean", trim: float = 0.1) -> Params:
    """``aggregation="mean"``: :func:`weighted_average` with ``weights``; ``"median"`` / ``"trimmed_mean"``:
    the unweighted robust statistics above (a hostile site could otherwise buy influence with a large
    sample count, so its weight is not used)."""
    check_aggregation(aggregation, trim)
    if aggregation == "mean":
        return weighted_average(models, weights)
    if len(models) == 0:
        raise ValueError("need at least one model")
    return coordinate_median(models) if aggregation == "median" else trimmed_mean(models, trim)


def _median_of_sorted(ordered: torch.Tensor) -> torch.Tensor:
    k = ordered.shape[0]
    return ordered[k // 2] if k % 2 else 0.5 * (ordered[k // 2 - 1] + ordered[k // 2])


def _trimmed_of_sorted(ordered: torch.Tensor, trim: float) -> torch.Tensor:
    k = ordered.shape[0]
    cut = int(trim * k)
    return ordered[cut : k - cut].mean(dim=0)


def _per_coordinate(models: Sequence[Params], reduce) -> Params:
    """Apply ``reduce`` to the models' values sorted along the site axis, one parameter at a time."""
    if len(models) == 0:
        raise ValueError("need at least one model")
    out: Params = {}
    for key, ref in models[0].items():
        if not torch.is_floating_point(ref):
            out[key] = ref.clone()
            continue
        stacked = torch.stack([m[key].to(torch.float64) for m in models])  # (K, *shape)
        out[key] = reduce(torch.sort(stacked, dim=0).values).to(ref.dtype)
    return out
