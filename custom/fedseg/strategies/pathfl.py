"""PathFL server strategy: the style pool (CSE), global bottleneck moments (AFA) and stratified similarity
aggregation (SSA), each switchable for the paper's 8-way ablation.

Per round, from the sites' validated results:
  * CSE: the pool holds each site's latest per-channel (mean, std); it is sent to every site with the next
    model (``cse_style_pool``);
  * AFA: ``(mu_z, sigma_z)`` from the sites' bottleneck moments (``fedseg.alignment.moments``), written into
    the aggregated model's ``bottleneck_alignment`` buffers, which activates the layer at every site;
  * SSA: the server runs site m's model on site m's noise batch, compares stratum outputs between sites and
    averages each stratum with its own convex weights (``fedseg.alignment.stratified``); with SSA off the
    model is FedAvg's (``weighting``).
Report fields: ``style_pool_size``, ``afa_global_mean``/``afa_global_std``, ``ssa_sites``, and per stratum
``ssa_similarity`` and ``ssa_coefficients`` (``K x K``, row i = site i of ``ssa_sites``; row m is site m's
term of the average, ``P = (I + S) / 2``) and ``ssa_weights`` (the weight of each site's stratum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from fedseg.alignment.moments import global_feature_moments
from fedseg.method_options import MethodOptions, option
from fedseg.alignment.strata import entry_stratum, network_stratum_outputs, network_strata
from fedseg.alignment.stratified import similarity_matrix, ssa_mixing_matrix, stratified_average

from .aggregation import check_weighting, site_weights, weighted_average
from .base import ClientUpdate, Exchange, ServerStrategy, SitePayload

#: FeatureAlignment buffers in the state_dict
ALIGN = "bottleneck_alignment."


@dataclass(frozen=True)
class PathFLOptions(MethodOptions):
    """PathFL's server options (the three modules: all on = PathFL, all off = FedAvg's schedule)."""

    use_cse: bool = option(True, "CSE: pool the sites' styles and send the pool with the model")
    use_afa: bool = option(True, "AFA: global bottleneck moments written into the alignment layer")
    use_ssa: bool = option(True, "SSA: stratified similarity aggregation (off: FedAvg with weighting)")
    weighting: str = option("samples", "FedAvg weighting used when SSA is off: samples or uniform")
    afa_at_inference: bool = option(True, "keep the feature alignment on in eval mode (validation, test, bundle inference)")

    def __post_init__(self):
        check_weighting(self.weighting)
        for name in ("use_cse", "use_afa", "use_ssa", "afa_at_inference"):
            self._set(name, bool(getattr(self, name)))


class PathFLStrategy(ServerStrategy):
    """PathFL's server half; options: :class:`PathFLOptions`."""

    name = "pathfl"
    objective = "pathfl"
    #: the controller sets ``network_factory`` (a callable returning a fresh bundle network) before start
    needs_network = True
    options_class = PathFLOptions
    he_refusal_reason = None

    def he_refusal(self):
        if self.use_ssa:
            return ("SSA weighs each site by running its model on noise at the server, which needs the model in the "
                    "clear; use_ssa=false aggregates by the weighted mean")
        return None

    def __init__(self, **options: Any):
        super().__init__(**options)
        self._styles: Dict[str, tuple] = {}
        self._network: Optional[torch.nn.Module] = None

    def start(self, clients: List[str], initial_params) -> None:
        super().start(clients, initial_params)
        if self.use_afa and not any(k.startswith(ALIGN) for k in initial_params):
            raise ValueError("AFA needs the network built with feature_alignment=True (train_config['feature_alignment'])")
        if self.use_ssa and self.network_factory is None:
            raise RuntimeError("SSA runs the sites' models on the server: set network_factory before start()")

    def state_dict(self) -> Dict[str, Any]:
        # the style pool: each site's latest (mean, std); the server network is a cache rebuilt on demand
        return {**super().state_dict(), "styles": {s: [list(m), list(sd)] for s, (m, sd) in self._styles.items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._styles = {s: (list(m), list(sd)) for s, (m, sd) in state["styles"].items()}

    def style_pool(self) -> Dict[str, list]:
        sites = [s for s in self.clients if s in self._styles]
        return {"mean": [self._styles[s][0] for s in sites], "std": [self._styles[s][1] for s in sites]}

    def payload(self, site: str, round_: int) -> SitePayload:
        meta = {"cse_style_pool": self.style_pool()} if self.use_cse and self._styles else {}
        return SitePayload(params=self._global, meta=meta)

    # ------------------------------------------------------------------------------------ aggregate
    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = [s for s in self.clients if s in updates]
        models = [updates[s].params for s in sites]
        fields: Dict[str, Any] = {}
        if self.use_ssa:
            weights, ssa_fields = self._ssa_weights(sites, updates)
            self._global = stratified_average(models, weights, entry_stratum(self._network))
            fields.update(ssa_fields)
        else:
            w = site_weights(self.weighting, {s: updates[s].n_samples for s in sites}, sites)
            self._global = weighted_average(models, w)
            fields["aggregation_weight"] = dict(zip(sites, w))
        if self.use_cse:
            for s in sites:
                meta = updates[s].meta
                if "cse_mean" in meta and "cse_std" in meta:
                    self._styles[s] = (list(meta["cse_mean"]), [max(float(v), 1e-6) for v in meta["cse_std"]])
            fields["style_pool_size"] = len(self._styles)
        if self.use_afa:
            fields.update(self._align(sites, updates))
        return fields

    def _align(self, sites: List[str], updates: Dict[str, ClientUpdate]) -> Dict[str, Any]:
        reporting = [s for s in sites if "afa_mean" in updates[s].meta and "afa_sq_mean" in updates[s].meta]
        if not reporting:
            return {}
        mu, sigma = global_feature_moments(
            [updates[s].meta["afa_mean"] for s in reporting], [updates[s].meta["afa_sq_mean"] for s in reporting]
        )
        current = self._global[ALIGN + "target_mean"]
        # under homomorphic aggregation the entry arrived encrypted; the moments come from declared statistics and
        # replace it in the clear
        dtype = current.dtype if isinstance(current, torch.Tensor) else torch.float32
        self._global[ALIGN + "target_mean"] = torch.tensor(mu, dtype=dtype)
        self._global[ALIGN + "target_std"] = torch.tensor(max(sigma, 1e-6), dtype=dtype)
        self._global[ALIGN + "active"] = torch.tensor(1.0, dtype=dtype)
        self._global[ALIGN + "at_inference"] = torch.tensor(1.0 if self.afa_at_inference else 0.0, dtype=dtype)
        return {"afa_global_mean": mu, "afa_global_std": sigma}

    # ------------------------------------------------------------------------------------------ SSA
    @torch.no_grad()
    def _ssa_weights(self, sites: List[str], updates: Dict[str, ClientUpdate]):
        """Per-stratum aggregation weights from the stratum outputs of model m on noise batch m."""
        missing = [s for s in sites if "ssa_noise" not in updates[s].meta]
        if missing:
            raise ValueError(f"SSA: no noise batch from {missing}")
        if self._network is None:
            self._network = self.network_factory().cpu().eval()
        outputs: List[Dict[str, torch.Tensor]] = []
        for s in sites:
            self._network.load_state_dict(updates[s].params)
            noise = torch.as_tensor(updates[s].meta["ssa_noise"], dtype=torch.float32)
            outputs.append({k: v.detach().clone() for k, v in network_stratum_outputs(self._network, noise).items()})
        weights, similarity, coefficients = {}, {}, {}
        for stratum in network_strata(self._network):
            sim = similarity_matrix([o[stratum] for o in outputs])
            mixing = ssa_mixing_matrix(sim)
            weights[stratum] = mixing.mean(0).tolist()
            similarity[stratum] = sim.tolist()
            coefficients[stratum] = mixing.tolist()
        return weights, {"ssa_sites": sites, "ssa_similarity": similarity, "ssa_coefficients": coefficients, "ssa_weights": weights}
