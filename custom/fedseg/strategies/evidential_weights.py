"""FedEvi's aggregation-weight update (paper Eqs. 7-8; reference code main loop).

    beta_k^r = beta_k^{r-1} + delta * G_k * R_k        G_k: surrogate's epistemic uncertainty on site k
              (``accumulate=False``: delta * G_k * R_k alone, the previous weights forgotten)
    beta^r  <- beta^r / sum(beta^r)                     R_k: reliability of site k's local model
    beta^r  <- max(beta^r, clip)                        (reference code: clip = 1e-3)
    beta^r  <- beta^r / sum(beta^r)                     (only with ``renormalise_after_clip``)

Reliability R_k, two forms:
    "code"   R = 1 / A,  A = mean over validation images of the pixel-mean aleatoric uncertainty
             (reference code: ``client_weight += ratio * u_dis / u_data``)
    "paper"  R = mean over validation images of 1 / (pixel-mean aleatoric uncertainty)   (Eq. 7)
By Jensen, paper >= code, and one very confident image can dominate the paper form.

Accumulating or not: the reference code's published version and its log (weights drifting round by round from the
sample shares) accumulate (``client_weight += ...``); another version of its main loop in the public repository
assigns (``client_weight = ...``), so that each round's weights depend on that round's G / A only. Both are here
(``accumulate``); the default is the published run's.

Renormalising after the clip: the reference code clips without renormalising, so when the clip binds
the weights sum to slightly more than 1 and the "average" scales the model up. The weights here feed
``weighted_average``, which requires a convex combination, so the strategy renormalises (the floor is
then ``clip / sum`` ~ ``clip``, not exactly ``clip``). ``renormalise_after_clip=False`` reproduces the
reference arithmetic. When no weight falls below ``clip`` (the usual case) both give the same result.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence, Union

import numpy as np

Weights = Union[Mapping[str, float], Sequence[float], np.ndarray]
RELIABILITY_FORMS = ("code", "paper")


def _as_array(values: Weights, sites: Optional[Sequence[str]], name: str) -> np.ndarray:
    if isinstance(values, Mapping):
        missing = [s for s in sites if s not in values]  # type: ignore[union-attr]
        if missing:
            raise ValueError(f"{name} has no value for sites {missing}")
        arr = np.array([float(values[s]) for s in sites], dtype=np.float64)  # type: ignore[union-attr]
    else:
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return arr


def update_beta(
    beta_prev: Weights,
    G: Weights,
    R: Weights,
    delta: float = 1.0,
    clip: float = 1e-3,
    renormalise_after_clip: bool = True,
    accumulate: bool = True,
) -> Weights:
    """One FedEvi weight update; returns the new weights in the same form as ``beta_prev``.

    Args:
        beta_prev: previous weights, a ``{site: w}`` mapping or a K-vector (fixed site order).
            Need not sum to 1 (it is the previous round's weights restricted to the present sites).
        G: generalisation gaps (>= 0), same form and sites/order as ``beta_prev``.
        R: reliabilities (>= 0), same form and sites/order as ``beta_prev``.
        delta: adjustment magnitude (paper: 1.0).
        clip: lower bound applied after normalising (reference code: 1e-3); 0 disables it.
        renormalise_after_clip: renormalise to sum 1 after clipping (see module docstring).
        accumulate: add the update to ``beta_prev`` (default) or replace it (module docstring).

    Returns:
        a mapping with ``beta_prev``'s keys, or a float64 array of length K.
    """
    sites = list(beta_prev) if isinstance(beta_prev, Mapping) else None
    prev = _as_array(beta_prev, sites, "beta_prev")
    gap = _as_array(G, sites, "G")
    rel = _as_array(R, sites, "R")
    if not (prev.shape == gap.shape == rel.shape):
        raise ValueError(f"beta_prev, G, R need the same length, got {prev.shape}, {gap.shape}, {rel.shape}")
    if np.any(prev < 0) or np.any(gap < 0) or np.any(rel < 0) or delta < 0:
        raise ValueError("beta_prev, G, R and delta must be non-negative")
    beta = (prev if accumulate else 0.0) + delta * gap * rel
    total = beta.sum()
    if total <= 0:
        raise ValueError("all weights are zero: cannot normalise")
    beta = np.maximum(beta / total, clip)
    if renormalise_after_clip:
        beta = beta / beta.sum()
    if sites is not None:
        return {s: float(b) for s, b in zip(sites, beta)}
    return beta


def reliability(
    A: Optional[float] = None,
    form: str = "code",
    inv_mean: Optional[float] = None,
) -> float:
    """Local reliability R of one site's local model.

    Args:
        A: mean aleatoric uncertainty over the site's validation images (needed for ``form="code"``).
        form: "code" -> ``1 / A``; "paper" -> ``inv_mean``.
        inv_mean: mean over validation images of ``1 / U_ale`` (needed for ``form="paper"``).
    """
    if form == "code":
        if A is None or not math.isfinite(A) or A <= 0:
            raise ValueError(f"form='code' needs a finite A > 0, got {A!r}")
        return 1.0 / float(A)
    if form == "paper":
        if inv_mean is None or not math.isfinite(inv_mean) or inv_mean < 0:
            raise ValueError(f"form='paper' needs a finite inv_mean >= 0, got {inv_mean!r}")
        return float(inv_mean)
    raise ValueError(f"form must be one of {RELIABILITY_FORMS}, got {form!r}")
