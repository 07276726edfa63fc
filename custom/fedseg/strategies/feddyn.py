"""FedDyn (Acar et al., ICLR 2021), server side: the averaged local models corrected by the server state h.

With ``theta`` the global model the sites trained from, ``P`` the sites that answered and ``m`` the sites of
the job (Algorithm 1, over the trainable parameters):
    h     <- h - (alpha / m) sum_{k in P} (w_k - theta)
    theta <- (1 / |P|) sum_{k in P} w_k - h / alpha
Buffers (batch-norm statistics) are averaged; ``h`` starts at 0 and is part of the server checkpoint. The
site half (the dynamic regulariser and its state) is ``fedseg.objectives.feddyn``; the server sends its
``alpha`` so that both halves use the same one.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from fedseg.objectives.feddyn import META_KEY, FedDynOptions

from .aggregation import weighted_average
from .base import ClientUpdate, Exchange, Params, ServerStrategy, SitePayload, clone_params, parameter_keys


def feddyn_server_update(theta: Params, models: Dict[str, Params], h: Params, alpha: float, n_sites: int):
    """``(new theta, new h)`` by the rule above; ``h`` covers the trainable parameters, the other floating
    entries of ``theta`` are averaged and integer entries taken from the first model."""
    sites = sorted(models)
    mean = weighted_average([models[s] for s in sites], [1.0 / len(sites)] * len(sites))
    new_h, new_theta = {}, dict(mean)
    for key, value in h.items():
        drift = sum(models[s][key].to(torch.float64) - theta[key].to(torch.float64) for s in sites)
        new_h[key] = (value.to(torch.float64) - (alpha / n_sites) * drift).to(value.dtype)
        new_theta[key] = (mean[key].to(torch.float64) - new_h[key].to(torch.float64) / alpha).to(theta[key].dtype)
    return new_theta, new_h


class FedDynStrategy(ServerStrategy):
    """FedDyn's server half; options: :class:`fedseg.objectives.feddyn.FedDynOptions` (the one ``alpha`` of both
    halves, sent to the sites)."""

    name = "feddyn"
    he_refusal_reason = ("its server shifts the mean by a correction state h it keeps of the sites' models, which this encryption path does not cover")
    objective = "feddyn"
    needs_network = True
    options_class = FedDynOptions
    #: the server state h over the trainable parameters (zeros from ``start``)
    h: Params

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(clients, initial_params)
        self.h = {k: torch.zeros_like(self._global[k]) for k in parameter_keys(self.network_factory())}

    def payload(self, site: str, round_: int) -> SitePayload:
        return SitePayload(params=self._global, meta={META_KEY: {"alpha": self.alpha}})

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        self._global, self.h = feddyn_server_update(self._global, {s: updates[s].params for s in sites}, self.h,
                                                    self.alpha, len(self.clients))
        h_norm = float(torch.sqrt(sum((v.to(torch.float64) ** 2).sum() for v in self.h.values())))
        return {"aggregation_weight": {s: 1.0 / len(sites) for s in sites}, "h_norm": h_norm}

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "h": clone_params(self.h)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.h = clone_params(state["h"])
