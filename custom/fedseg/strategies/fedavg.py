"""FedAvg (McMahan et al. 2017): the global model is the sample-weighted mean of the local models."""

from __future__ import annotations

from typing import Any, Dict

from .aggregation import sample_weights, weighted_average
from .base import ClientUpdate, Exchange, ServerStrategy


class FedAvgStrategy(ServerStrategy):
    """theta <- sum_k w_k theta_k with w_k = n_k / sum(n) (``weighting="samples"``) or 1/K (``"uniform"``)."""

    name = "fedavg"
    objective = "fedavg"

    def __init__(self, weighting: str = "samples"):
        super().__init__()
        if weighting not in ("samples", "uniform"):
            raise ValueError(f"weighting must be 'samples' or 'uniform', got {weighting!r}")
        self.weighting = weighting

    def config(self) -> Dict[str, Any]:
        return {"strategy": self.name, "weighting": self.weighting}

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        if self.weighting == "uniform":
            weights = [1.0 / len(sites)] * len(sites)
        else:
            weights = sample_weights({s: updates[s].n_samples for s in sites}, sites)
        self._global = weighted_average([updates[s].params for s in sites], weights)
        return {"aggregation_weight": dict(zip(sites, weights))}
