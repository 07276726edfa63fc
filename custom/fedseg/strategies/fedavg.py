"""FedAvg (McMahan et al. 2017): the global model is the sample-weighted mean of the local models."""

from __future__ import annotations

from typing import Any, Dict

from .aggregation import check_aggregation, robust_average, site_weights
from .base import ClientUpdate, Exchange, ServerStrategy


class FedAvgStrategy(ServerStrategy):
    """theta <- sum_k w_k theta_k with w_k = n_k / sum(n) (``weighting="samples"``) or 1/K (``"uniform"``).

    Args:
        weighting: ``"samples"`` or ``"uniform"`` (used by ``aggregation="mean"``).
        aggregation: ``"mean"`` (FedAvg), or for federations that cannot trust every site the coordinate-wise
            ``"median"`` or ``"trimmed_mean"`` (unweighted; ``fedseg.strategies.aggregation.robust_average``).
        trim: fraction of the sites cut from each end per coordinate by ``"trimmed_mean"``.
    """

    name = "fedavg"
    objective = "fedavg"

    def __init__(self, weighting: str = "samples", aggregation: str = "mean", trim: float = 0.1):
        super().__init__()
        if weighting not in ("samples", "uniform"):
            raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")
        check_aggregation(aggregation, trim)
        self.weighting = weighting
        self.aggregation = aggregation
        self.trim = float(trim)

    def config(self) -> Dict[str, Any]:
        return {"strategy": self.name, "weighting": self.weighting, "aggregation": self.aggregation, "trim": self.trim}

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        weights = site_weights(self.weighting, {s: updates[s].n_samples for s in sites}, sites)
        self._global = robust_average([updates[s].params for s in sites], weights, self.aggregation, self.trim)
        if self.aggregation != "mean":  # a robust statistic gives no site a weight
            return {"aggregated": sites}
        return {"aggregation_weight": dict(zip(sites, weights))}
