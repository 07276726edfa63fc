"""FedCE (Jiang et al., CVPR 2023), server side: NVFlare's ``FedCEModelAggregator`` on our updates.

Each round every site sends its trained weights ``w_k`` and its minus-model score ``fedce_minus_val``
(``fedseg.objectives.fedce``). The wrapper hands the aggregator what it expects from NVFlare's FedCE
workflow — one ``FLModel`` per site with the weight difference ``w_k - w_global`` (``ParamsType.DIFF``, the
floating-point entries), the score, the site name and the previous contribution weights — and adds the
aggregated difference to the global model. The aggregator combines a gradient-space score (one minus the
running mean cosine between a site's update and the others' weighted sum) and the performance-space scores
into the contribution weights ``fedce_coef``, which weight the average and go to the sites with the next
model. Its running state (weights, cosine means) is part of the server checkpoint; the aggregator keeps it in
private attributes, read and written through ``fedseg.fl.nvflare_internals``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

import torch
from nvflare.app_common.abstract.fl_model import FLModel, ParamsType
from nvflare.app_opt.pt.fedce import FedCEModelAggregator

from fedseg.fl.nvflare_internals import fedce_contribution_weights, fedce_cosine_means, fedce_state, restore_fedce_state
from fedseg.method_options import MethodOptions, option
from fedseg.objectives.fedce import MINUS_SCORE, WEIGHTS

from .base import ClientUpdate, Exchange, Params, ServerStrategy, SitePayload, parameter_keys


@dataclass(frozen=True)
class FedCEOptions(MethodOptions):
    """FedCE's server options."""

    mode: str = option("plus", "how the two scores combine: plus (NVFlare's default) or times")
    epsilon: float = option(1e-6, "floor of a normalised score (NVFlare's default)")

    def __post_init__(self):
        if self.mode not in FedCEModelAggregator.MODES:
            raise ValueError(f"FedCE mode must be one of {FedCEModelAggregator.MODES}, got {self.mode!r}")
        if not self.epsilon > 0:
            raise ValueError(f"FedCE epsilon must be > 0, got {self.epsilon}")
        self._set("epsilon", float(self.epsilon))


class FedCEStrategy(ServerStrategy):
    """FedCE's server half; options: :class:`FedCEOptions`."""

    name = "fedce"
    he_refusal_reason = ("its contribution estimate compares each site's update with the others' (gradient cosines), which the server must read")
    objective = "fedce"
    needs_network = True
    options_class = FedCEOptions
    #: NVFlare's aggregator with its running state (built by ``start``)
    aggregator: FedCEModelAggregator

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(clients, initial_params)
        self.aggregator = FedCEModelAggregator(mode=self.mode, trainable_param_names=parameter_keys(self.network_factory()),
                                               epsilon=self.epsilon)

    @property
    def contribution_weights(self) -> Dict[str, float]:
        return fedce_contribution_weights(self.aggregator)

    def payload(self, site: str, round_: int) -> SitePayload:
        return SitePayload(params=self._global, meta={WEIGHTS: self.contribution_weights})

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        floats = [k for k, v in self._global.items() if torch.is_floating_point(v)]
        prior = self.contribution_weights
        self.aggregator.reset_stats()
        for s in sites:
            if MINUS_SCORE not in updates[s].meta:
                raise ValueError(f"site {s!r} sent no '{MINUS_SCORE}'; FedCE needs the fedce objective")
            diff = {k: (updates[s].params[k] - self._global[k]).numpy() for k in floats}
            self.aggregator.accept_model(FLModel(
                params=diff, params_type=ParamsType.DIFF, current_round=round_,
                meta={"client_name": s, MINUS_SCORE: float(updates[s].meta[MINUS_SCORE]), "props": {WEIGHTS: prior}},
            ))
        result = self.aggregator.aggregate_model()
        new_global = dict(self._global)
        for k in floats:
            new_global[k] = (self._global[k].to(torch.float64) + torch.as_tensor(result.params[k]).to(torch.float64)).to(self._global[k].dtype)
        for k in self._global:
            if k not in floats:  # integer counters: from the first site, as FedAvg's average takes them
                new_global[k] = updates[sites[0]].params[k].clone()
        self._global = new_global
        weights = result.meta[WEIGHTS]
        cosine_means = fedce_cosine_means(self.aggregator)
        return {
            "aggregation_weight": {s: float(weights[s]) for s in sites},
            MINUS_SCORE: {s: float(updates[s].meta[MINUS_SCORE]) for s in sites},
            "fedce_cosine_mean": {s: float(cosine_means[s]) for s in sites},
        }

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), **fedce_state(self.aggregator)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        restore_fedce_state(self.aggregator, state)
