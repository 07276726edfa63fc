"""FedEFM's server side (``shared/methods/fedefm.md``): overseas training, then CFL averaging or DFL relay.

One round ``r`` (the controller runs the ``train`` task, then :meth:`FedEFMStrategy.aggregate`):

1. ``train``: silo ``i`` receives its model ``theta_i`` and, from round 1, its overseas experts
   ``theta_ij`` (one per out-neighbour ``j``, trained there last round) as extra models; it distils from
   them (round 0: plain cross-entropy) and returns ``theta_i``.
2. mixing. **CFL**: the server averages the silo models (sample-weighted) and every silo continues from
   the average. **DFL**: the server only relays: silo ``i`` gets its in-neighbours' models in a ``gossip``
   task and mixes them itself (``fedseg.foundation.topology.gossip_mix``); no global model exists and the
   server never combines weights during training.
3. ``overseas_train`` (every round but the last): silo ``j`` receives the models of the silos it hosts
   (its in-neighbours) and returns a copy of each trained on its own data: the experts of round ``r+1``.

After the last round :meth:`finish` averages the silo models into the foundation weights (in DFL this is
the only averaging). Only weights and the declared scalars ``teacher_emd`` / ``teacher_weights`` move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from fedseg.fl.protocol import pack_models
from fedseg.foundation.topology import TOPOLOGIES, in_neighbours, mixing_matrix, out_neighbours
from fedseg.method_options import MethodOptions, option

from .aggregation import check_aggregation, check_weighting, robust_average, site_weights, weighted_average
from .base import ClientUpdate, Exchange, Params, ServerStrategy, SitePayload, clone_params

OVERSEAS_TASK = "overseas_train"
GOSSIP_TASK = "gossip"
#: extra-model name prefixes (``<prefix>@<silo>``)
EXPERT, NEIGHBOUR, GUEST = "expert", "neighbour", "guest"


def model_name(prefix: str, silo: str) -> str:
    """``"expert@site-2"``: the name an extra model travels under (``/`` is not allowed in it)."""
    return f"{prefix}@{silo.replace('/', '_')}"


@dataclass(frozen=True)
class FedEFMOptions(MethodOptions):
    """FedEFM's server options."""

    mode: str = option("cfl", "cfl (the server averages every round) or dfl (gossip over the topology; the server only "
                       "relays)")
    topology: str = option("ring", "ring (directed ring in the sites' order) or full")
    overseas: bool = option(True, "train overseas experts (off: no experts, so the silos train plain CE: the FedAvg "
                            "(CFL) / gossip (DFL) baselines of the same schedule)")
    gossip_self_weight: float = option(0.5, "DFL mixing weight on a silo's own model")
    weighting: str = option("samples", "CFL / final averaging: samples or uniform")
    aggregation: str = option("mean", "CFL per-round combination: mean (weighted by weighting), or the robust "
                              "coordinate-wise median / trimmed_mean (aggregation.robust_average)")
    trim: float = option(0.1, "fraction cut from each end by trimmed_mean")

    def __post_init__(self):
        if self.mode not in ("cfl", "dfl"):
            raise ValueError(f"mode must be 'cfl' or 'dfl', got {self.mode!r}")
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {self.topology!r}")
        if not 0.0 <= self.gossip_self_weight <= 1.0:
            raise ValueError(f"gossip_self_weight must lie in [0, 1], got {self.gossip_self_weight}")
        check_weighting(self.weighting)
        check_aggregation(self.aggregation, self.trim)
        self._set("overseas", bool(self.overseas))
        self._set("gossip_self_weight", float(self.gossip_self_weight))
        self._set("trim", float(self.trim))


class FedEFMStrategy(ServerStrategy):
    """FedEFM's server half; options: :class:`FedEFMOptions`."""

    name = "fedefm"
    he_refusal_reason = ("it has no global model: the sites exchange their models with each other through the server (decentralised), which server-side aggregation of ciphertexts does not cover")
    objective = "fedefm"
    extra_tasks = (OVERSEAS_TASK, GOSSIP_TASK)
    options_class = FedEFMOptions

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.has_global_model = self.mode == "cfl"
        self._models: Dict[str, Params] = {}
        #: experts[i][j] = theta_ij, trained at j last round, sent to i with the next train task
        self._experts: Dict[str, Dict[str, Params]] = {}
        self._n_samples: Dict[str, int] = {}

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(clients, initial_params)
        self.out_neighbours = out_neighbours(self.clients, self.topology)
        self.in_neighbours = in_neighbours(self.clients, self.topology)
        # every silo starts from the same initial model; DFL silos then drift apart
        self._models = {s: self._global for s in self.clients}
        self._experts = {}

    def state_dict(self) -> Dict[str, Any]:
        # silo models (CFL: all the global model), the experts waiting for their owners, sample counts
        return {
            **super().state_dict(),
            "models": {s: clone_params(m) for s, m in self._models.items()},
            "experts": {i: {j: clone_params(m) for j, m in e.items()} for i, e in self._experts.items()},
            "n_samples": dict(self._n_samples),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.mode == "cfl":
            # CFL silos all continue from the one global model (kept as one object, as ``aggregate`` does)
            self._models = {s: self._global for s in self.clients}
        else:
            self._models = {s: clone_params(m) for s, m in state["models"].items()}
        self._experts = {i: {j: clone_params(m) for j, m in e.items()} for i, e in state["experts"].items()}
        self._n_samples = {s: int(n) for s, n in state["n_samples"].items()}

    def set_global(self, params: Params) -> None:
        """CFL after the server step: every silo continues from the stepped model (this round's overseas experts
        were trained from the average, before the step: the step closes the round)."""
        self._global = params
        self._models = {s: params for s in self.clients}

    # ------------------------------------------------------------------------------------ rounds
    def payload(self, site: str, round_: int) -> SitePayload:
        experts = self._experts.get(site, {})
        models = {model_name(EXPERT, j): experts[j] for j in sorted(experts)}
        return SitePayload(params=pack_models(models, main=self._models[site]), meta={"fedefm_teachers": sorted(experts)})

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        sites = sorted(updates)
        for s in sites:
            self._models[s] = updates[s].params
            self._n_samples[s] = updates[s].n_samples
        fields: Dict[str, Any] = {
            "teacher_emd": {s: updates[s].meta["teacher_emd"] for s in sites if "teacher_emd" in updates[s].meta},
            "teacher_weights": {s: updates[s].meta["teacher_weights"] for s in sites if "teacher_weights" in updates[s].meta},
            "teachers": {s: sorted(self._experts.get(s, {})) for s in sites},
            "val_accuracy": {s: updates[s].metrics.get("val_accuracy") for s in sites if "val_accuracy" in updates[s].metrics},
        }
        if self.mode == "cfl":
            weights = self._weights(sites)
            self._global = robust_average([self._models[s] for s in sites], weights, self.aggregation, self.trim)
            self._models = {s: self._global for s in self.clients}
            fields["aggregation_weight"] = dict(zip(sites, weights))
        else:
            fields["gossip"] = self._gossip(exchange)
        self._experts = {}
        if self.overseas and round_ < self.total_rounds - 1:
            fields["overseas_experts"] = self._overseas(exchange)
        return fields

    def _weights(self, sites: List[str]) -> List[float]:
        return site_weights(self.weighting, self._n_samples, sites)

    def _gossip(self, exchange: Exchange) -> Dict[str, Any]:
        """DFL mixing: relay each silo's in-neighbour models to it; the silo mixes. No server averaging."""
        payloads = {
            s: SitePayload(
                params=pack_models({model_name(NEIGHBOUR, k): self._models[k] for k in self.in_neighbours[s]}, main=self._models[s])
            )
            for s in self.clients
        }
        mixed = exchange(GOSSIP_TASK, payloads)
        for s, update in mixed.items():
            self._models[s] = update.params
        w = mixing_matrix(self.clients, self.topology, self.gossip_self_weight)
        return {"mixing_matrix": w.tolist(), "mixed": sorted(mixed)}

    def _overseas(self, exchange: Exchange) -> Dict[str, List[str]]:
        """Each host j trains a copy of every guest i (i -> j an edge) on its own data; returns
        ``{silo i: [hosts whose expert it will receive]}``."""
        payloads = {
            j: SitePayload(params=pack_models({model_name(GUEST, i): self._models[i] for i in self.in_neighbours[j]}))
            for j in self.clients
        }
        results = exchange(OVERSEAS_TASK, payloads)
        for j, update in results.items():
            for i in self.in_neighbours[j]:
                expert = update.models.get(model_name(GUEST, i))
                if expert is not None:
                    self._experts.setdefault(i, {})[j] = expert
        return {i: sorted(self._experts.get(i, {})) for i in self.clients}

    # ----------------------------------------------------------------------------------- results
    def finish(self) -> Dict[str, Any]:
        """Average the silo models into the foundation weights (DFL's only averaging)."""
        sites = [s for s in self.clients if s in self._n_samples] or list(self.clients)
        if not self._n_samples:
            weights = [1.0 / len(sites)] * len(sites)
        else:
            weights = self._weights(sites)
        self._global = weighted_average([self._models[s] for s in sites], weights)
        return {"foundation_weight": dict(zip(sites, weights))}

    def personalized_params(self) -> Optional[Dict[str, Params]]:
        """DFL: each silo's own model at the end (CFL has one model for all)."""
        return dict(self._models) if self.mode == "dfl" else None
