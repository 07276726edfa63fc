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
    since averaging counters is meaningless.
    """
    if len(models) == 0 or len(models) != len(weights):
        raise ValueError(f"need one weight per model, got {len(models)} models and {len(weights)} weights")
    w = torch.as_tensor([float(x) for x in weights], dtype=torch.float64)
    if torch.any(w < 0) or not torch.isclose(w.sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-6):
        raise ValueError(f"weights must be a convex combination, got {w.tolist()}")
    out: Params = {}
    for key, ref in models[0].items():
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
