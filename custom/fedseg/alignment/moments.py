"""Adaptive feature alignment (AFA, PathFL section 3.4), server side: global bottleneck moments."""

from __future__ import annotations

import math
from typing import Sequence, Tuple


def global_feature_moments(means: Sequence[float], square_means: Sequence[float]) -> Tuple[float, float]:
    """PathFL eqs. 10-11 from each site's first and second moments of its bottleneck elements.

    ``mu = mean_m E_m[Z]`` and ``sigma = mean_m sqrt(E_m[(Z - mu)^2])`` with
    ``E_m[(Z - mu)^2] = E_m[Z^2] - 2 mu E_m[Z] + mu^2`` (so only two numbers leave each site).
    Every site weighs the same, as in the paper (sites with equal element counts make ``mu`` the pooled mean).

    Args:
        means: ``E_m[Z]`` per site.
        square_means: ``E_m[Z^2]`` per site (same order).
    Returns:
        ``(mu, sigma)``.
    Raises:
        ValueError: empty or mismatched inputs, or a second moment below the squared first moment
            (impossible for real data beyond rounding).
    """
    if not means or len(means) != len(square_means):
        raise ValueError(f"need one (E[Z], E[Z^2]) pair per site, got {len(means)} and {len(square_means)}")
    for m, s in zip(means, square_means):
        if s < m * m - 1e-6 * max(1.0, abs(s)):
            raise ValueError(f"invalid moments: E[Z^2] = {s} < E[Z]^2 = {m * m}")
    mu = sum(means) / len(means)
    sigma = sum(math.sqrt(max(s - 2 * mu * m + mu * mu, 0.0)) for m, s in zip(means, square_means)) / len(means)
    return mu, sigma
