"""SCAFFOLD (Karimireddy et al., ICML 2020), server side: the global model and the global control variate.

Every site receives the global model ``x`` and the control ``c`` (extra model ``scaffold_c_global``, the
trainable parameters only) and returns its trained weights ``y_i`` and control delta ``delta c_i``
(``scaffold_c_delta``; ``fedseg.objectives.scaffold``). With the sites ``S`` that answered and weights
``w_i`` over them (``n_i / sum n``, as FedAvg; ``"uniform"``: ``1 / |S|``):
    x <- sum_i w_i y_i                       (global step size 1)
    c <- c + (|S| / N) sum_i w_i delta c_i   (N = sites of the job)
With every site present this is NVFlare's ``Scaffold`` workflow (model and controls averaged with the same
weights); ``|S| / N`` is the paper's factor for partial participation. The control travels in both
directions as model-sized tensors: it is counted in ``bytes_sent`` / ``bytes_received`` like the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

import torch

from fedseg.fl.protocol import pack_models
from fedseg.method_options import MethodOptions, option
from fedseg.objectives.scaffold import CONTROL_DELTA, CONTROL_GLOBAL

from .aggregation import check_weighting, site_weights, weighted_average
from .base import ClientUpdate, Exchange, Params, ServerStrategy, SitePayload, clone_params, parameter_keys


def control_update(control: Params, deltas: Dict[str, Params], weights: Dict[str, float], n_sites: int) -> Params:
    """``c + (|S| / N) sum_i w_i delta c_i`` (float64 accumulation; ``weights`` sum to 1 over ``deltas``)."""
    factor = len(deltas) / float(n_sites)
    out = {}
    for key, value in control.items():
        acc = value.to(torch.float64).clone()
        for site, delta in deltas.items():
            acc += factor * weights[site] * delta[key].to(torch.float64)
        out[key] = acc.to(value.dtype)
    return out


@dataclass(frozen=True)
class ScaffoldOptions(MethodOptions):
    """SCAFFOLD's server options."""

    weighting: str = option("samples", "weights of the models and controls: samples (n_i / sum n, as FedAvg and "
                            "NVFlare's workflow) or uniform (the paper's 1/|S|)")

    def __post_init__(self):
        check_weighting(self.weighting)


class ScaffoldStrategy(ServerStrategy):
    """SCAFFOLD's server half; options: :class:`ScaffoldOptions`."""

    name = "scaffold"
    he_refusal_reason = ("its control variates travel as a second model beside the weights, which this encryption path does not cover")
    objective = "scaffold"
    needs_network = True
    options_class = ScaffoldOptions
    #: the global control c over the trainable parameters (zeros from ``start``)
    control: Params

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(clients, initial_params)
        keys = parameter_keys(self.network_factory())
        self.control = {k: torch.zeros_like(self._global[k]) for k in keys}
        self._payload = None

    def payload(self, site: str, round_: int) -> SitePayload:
        if self._payload is None:  # one object for every site: one task, one serialisation
            self._payload = pack_models({CONTROL_GLOBAL: self.control}, main=self._global)
        return SitePayload(params=self._payload)

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        deltas = {}
        for s in sites:
            delta = updates[s].models.get(CONTROL_DELTA)
            if delta is None:
                raise ValueError(f"site {s!r} sent no '{CONTROL_DELTA}'; SCAFFOLD needs the scaffold objective")
            if set(delta) != set(self.control):
                raise ValueError(f"site {s!r}: control delta entries differ from the model's trainable parameters")
            deltas[s] = delta
        weights = site_weights(self.weighting, {s: updates[s].n_samples for s in sites}, sites)
        self._global = weighted_average([updates[s].params for s in sites], weights)
        self.control = control_update(self.control, deltas, dict(zip(sites, weights)), len(self.clients))
        self._payload = None
        norm = float(torch.sqrt(sum((v.to(torch.float64) ** 2).sum() for v in self.control.values())))
        return {"aggregation_weight": dict(zip(sites, weights)), "control_norm": norm}

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "control": clone_params(self.control)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.control = clone_params(state["control"])
        self._payload = None
