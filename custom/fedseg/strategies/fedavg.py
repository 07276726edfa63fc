"""FedAvg (McMahan et al. 2017): the global model is the sample-weighted mean of the local models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from fedseg.method_options import MethodOptions, option

from .aggregation import check_aggregation, check_weighting, robust_average, site_weights
from .base import ClientUpdate, Exchange, ServerStrategy


@dataclass(frozen=True)
class FedAvgOptions(MethodOptions):
    """FedAvg's server options (every strategy that averages like it extends them)."""

    weighting: str = option("samples", "samples (n_k / sum n) or uniform (1/K): the weights of the mean")
    aggregation: str = option("mean", "mean (FedAvg), or for federations that cannot trust every site the coordinate-wise "
                              "median or trimmed_mean (unweighted; aggregation.robust_average)")
    trim: float = option(0.1, "fraction of the sites cut from each end per coordinate by trimmed_mean")

    def __post_init__(self):
        check_weighting(self.weighting)
        check_aggregation(self.aggregation, self.trim)
        self._set("trim", float(self.trim))


class FedAvgStrategy(ServerStrategy):
    """theta <- sum_k w_k theta_k with w_k = n_k / sum(n) (``weighting="samples"``) or 1/K (``"uniform"``); options:
    :class:`FedAvgOptions`."""

    name = "fedavg"
    objective = "fedavg"
    options_class = FedAvgOptions
    he_refusal_reason = None

    def he_refusal(self):
        if self.aggregation != "mean":
            return (f"aggregation={self.aggregation} sorts the sites' values coordinate by coordinate, which needs them "
                    "in the clear; use aggregation=mean")
        return None

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        weights = site_weights(self.weighting, {s: updates[s].n_samples for s in sites}, sites)
        self._global = robust_average([updates[s].params for s in sites], weights, self.aggregation, self.trim)
        if self.aggregation != "mean":  # a robust statistic gives no site a weight
            return {"aggregated": sites}
        return {"aggregation_weight": dict(zip(sites, weights))}
