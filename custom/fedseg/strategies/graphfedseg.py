"""GraphFedSeg (Acta Electronica Sinica 2026): uncertainty-aware collaboration graph + dual-layer aggregation.

Round r, after the train task returns the local models theta_j and their uncertainties U_j:
    1. p_j = n_j / sum(n); cos_ij between flattened trainable parameters (``similarity`` below)
    2. W row i = argmin_w sum_j (w_j - p_j)^2 - alpha sum_j w_j cos_ij + gamma sum_j w_j U_j on the
       simplex (Eq. 2), by cvxpy (default) or the closed-form simplex projection
    3. theta_neigh[i] = sum_j W_ij theta_j (client i's personalised model), theta_base = sum_j p_j theta_j,
       theta_global = lam theta_base + (1 - lam) mean_i theta_neigh[i]  (Eqs. 6-9)
    4. every site trains from theta_global next round, with the regulariser of Eq. (5) built from this
       round's W and models (see ``payload``)
Maths: ``collaboration_graph``. Client side: ``fedseg.objectives.graphfedseg``.

Similarity. ``similarity="update"`` (default) compares theta_j - theta_0 with theta_0 the initial
(round-0) model, as pFedGraph does; ``"weights"`` compares raw weights as Eq. (1) literally says. Raw
weights of models that share an initialisation have cosines ~1 after a few local epochs, so the cos
term of Eq. (2) is nearly constant across j and the graph collapses to the p/U-only solution; the
update keeps the differences between sites. Either way the cosine of Eq. (2) uses the trainable float
entries of the state dict (``similarity_keys``).

Regulariser (Eq. 5). The client needs sum_{j != i} W_ij cos(theta_i, theta_j) with the previous
round's W and local models. The server sends ``d_i = sum_{j != i} W_ij theta_j / ||theta_j||`` (raw
weights, as in Eq. 5 and pFedGraph's client code) and the client computes
``-(lambda1/2) <theta_i/||theta_i||, d_i>``; j != i because the paper's text calls the theta_j "the
other clients' models". Round 0 has no neighbour models: no direction, regulariser off.

Sites missing from a round (dropped out). The round is computed over the sites that returned a model:
p is renormalised over them, W is |present| x |present| (report field ``graph_sites`` gives the
order), and theta_global and their personalised models are updated. A missing site keeps its last
personalised model (or theta_global if it never trained), trains next round from theta_global with the
regulariser off (it has no row in the latest graph), and rejoins the graph when it returns. alpha is
fixed at ``start`` (0.08 * number of clients) so that ``config()`` reports the value used in every round.

The authors' code (the ``paper`` profile; docs/methods.md, GraphFedSeg) differs in five places, each an option:
``graph_in_aggregation="previous"`` (theta_global from the previous round's W, then the new W), ``similarity=
"update_global"`` (cosines of theta_j - the new theta_global), ``similarity_snap=0.9``, ``prior=
"samples_over_uncertainty"`` with ``gamma=0`` (U enters the QP through its target p, not a penalty), alpha = 1/0.7
(their QP is ``0.7 ||w||^2 - 1.4 p.w - cos.w``, i.e. this one divided by 0.7), ``initial_graph="uniform_others"``
and ``regulariser="top_k"``. With two sites and ``update_global`` the two changes are opposite (a convex mix of two
models lies on the segment between them: cosine -1), so W = I whenever ``|p_1 - p_2| <= alpha - 1``
(:func:`fedseg.strategies.collaboration_graph.two_site_identity_holds`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from fedseg.method_options import MethodOptions, option
from fedseg.uncertainty.client_uncertainty import check_estimator

from .aggregation import sample_weights
from .base import ClientUpdate, Exchange, Params, ServerStrategy, SitePayload, clone_params
from .collaboration_graph import (
    INITIAL_GRAPHS,
    collaboration_graph,
    dual_layer_aggregate,
    effective_weight,
    flatten_params,
    graph_rows_closed_form,
    initial_graph,
    neighbour_direction_from_flat,
    pairwise_cosine,
    restrict_graph,
    row_norms,
    similarity_keys,
    snap_cosine,
    top_k_neighbours,
    uncertainty_prior,
    unflatten_params,
)

logger = logging.getLogger(__name__)

#: the paper's alpha = K * 0.08 (Sec. 2.2.1)
ALPHA_PER_CLIENT = 0.08
#: what the cosines of the graph compare: theta - theta_round0, raw theta, or theta - this round's new global model
SIMILARITIES = ("update", "weights", "update_global")
#: the QP's target p: sample shares, or sample shares divided by the client uncertainties (the authors' code)
PRIORS = ("samples", "samples_over_uncertainty")
#: the graph theta_global is aggregated with: this round's, or the previous round's (the authors' code)
AGGREGATION_GRAPHS = ("current", "previous")
#: the client's similarity term: the paper's Eq. (5), or the authors' code's top-k cosine distance
REGULARISERS = ("paper", "top_k")
#: cvxpy and the closed form must agree to this (spec); a larger gap is logged
SOLVER_TOLERANCE = 1e-6
META_KEY = "graphfedseg"


@dataclass(frozen=True)
class GraphFedSegOptions(MethodOptions):
    """GraphFedSeg's server options: the graph's, then the uncertainty estimator's (sent to the sites)."""

    alpha: Optional[float] = option(None, "similarity reward in Eq. (2); None: 0.08 * K (K = sites at start)")
    gamma: float = option(0.4, "uncertainty penalty in Eq. (2) (paper: 0.4)")
    lam: float = option(0.2, "fusion coefficient of Eq. (6): weight of the sample-weighted base model (paper: 0.2)")
    lambda1: float = option(0.01, "client regulariser weight of Eq. (5) (0 disables it)")
    similarity: str = option("update", "what cos_ij compares: update (theta - theta_0), weights (raw theta) or "
                             "update_global (theta - this round's new global model; needs graph_in_aggregation=previous)")
    similarity_snap: Optional[float] = option(None, "cosines above it count as 1 (the authors' code: 0.9); None: as "
                                              "measured")
    prior: str = option("samples", "the QP's target p: samples (n / sum n, the paper) or samples_over_uncertainty "
                        "(n / (U + 1e-6), renormalised: the authors' code); the data-based layer keeps n / sum n")
    graph_in_aggregation: str = option("current", "the W theta_global is aggregated with: current (this round's, the "
                                       "paper) or previous (the round before's, as the authors' code)")
    initial_graph: str = option("uniform", "W before the first round: uniform (1/K, the paper's Fig. 6a) or "
                                "uniform_others (1/(K-1) off the diagonal, the authors' code)")
    regulariser: str = option("paper", "the client's similarity term: paper (Eq. 5, sum over j != i) or top_k (the "
                              "authors' code: lambda1 (1 - weighted mean cosine to the row's top_k largest entries))")
    top_k: int = option(3, "neighbours of the top_k term (the authors' code: 3)")
    uncertainty_pass: str = option("after_training", "when the sites measure U: after_training (paper), last_epoch or "
                                   "training_batches (evidential only; objectives.graphfedseg)")
    solver: str = option("cvxpy", "cvxpy (cross-checked against the closed form every round) or closed_form")
    uncertainty: str = option("evidential", "the sites' estimator: evidential (paper) or mc_dropout (Sec. 3.7)")
    mc_samples: int = option(5, "T for mc_dropout (paper: 5 or 10)")

    def __post_init__(self):
        alpha, similarity_snap, top_k = self.alpha, self.similarity_snap, self.top_k
        if alpha is not None and not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be None or a finite number >= 0, got {alpha}")
        if not (math.isfinite(self.gamma) and self.gamma >= 0):
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")
        if not (math.isfinite(self.lambda1) and self.lambda1 >= 0):
            raise ValueError(f"lambda1 must be >= 0, got {self.lambda1}")
        for name, allowed in (("similarity", SIMILARITIES), ("prior", PRIORS),
                              ("graph_in_aggregation", AGGREGATION_GRAPHS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.similarity == "update_global" and self.graph_in_aggregation != "previous":
            raise ValueError("similarity='update_global' compares each site's model with this round's new global model, "
                             "which must exist before the graph: use graph_in_aggregation='previous'")
        for name, allowed in (("initial_graph", INITIAL_GRAPHS), ("regulariser", REGULARISERS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        if similarity_snap is not None and not (math.isfinite(similarity_snap) and -1.0 <= similarity_snap <= 1.0):
            raise ValueError(f"similarity_snap must be None or in [-1, 1], got {similarity_snap}")
        if self.solver not in ("cvxpy", "closed_form"):
            raise ValueError(f"solver must be 'cvxpy' or 'closed_form', got {self.solver!r}")
        check_estimator(self.uncertainty, self.mc_samples, self.uncertainty_pass)
        self._set("alpha", None if alpha is None else float(alpha))
        self._set("similarity_snap", None if similarity_snap is None else float(similarity_snap))
        for name in ("gamma", "lam", "lambda1"):
            self._set(name, float(getattr(self, name)))
        self._set("mc_samples", int(self.mc_samples))


class GraphFedSegStrategy(ServerStrategy):
    """Uncertainty-aware collaboration graph and dual-layer aggregation; options: :class:`GraphFedSegOptions`."""

    name = "graphfedseg"
    he_refusal_reason = ("its collaboration graph is solved from the cosine similarity of the sites' models, which the server must read")
    objective = "graphfedseg"
    options_class = GraphFedSegOptions

    def __init__(self, **options: Any):
        super().__init__(**options)
        #: alpha actually used (set by ``start``)
        self.alpha_used: Optional[float] = self.alpha
        #: latest graph (K_present x K_present) and the sites of its rows; uniform 1/K before round 0
        self.graph: np.ndarray = np.zeros((0, 0))
        self.graph_sites: List[str] = []
        self._keys: List[str] = []
        self._initial_flat: Optional[torch.Tensor] = None
        self._personal: Dict[str, Params] = {}
        # last round's flattened raw local models (K_present, D), rows in graph_sites order
        self._neighbour_flat: Optional[torch.Tensor] = None
        self._template: Params = {}

    def config(self) -> Dict[str, Any]:
        """The options, with the alpha used (0.08 K when ``alpha`` is None) and how it was chosen."""
        options = self.options.as_dict()
        del options["alpha"]
        return {"strategy": self.name, "alpha": self.alpha_used, "alpha_rule": "0.08*K" if self.alpha is None else "fixed",
                **options}

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(sorted(clients), initial_params)
        k = len(self.clients)
        if k == 0:
            raise ValueError("GraphFedSeg needs at least one client")
        self.alpha_used = ALPHA_PER_CLIENT * k if self.alpha is None else self.alpha
        self._keys = similarity_keys(self._global)
        self._initial_flat = flatten_params(self._global, self._keys)
        self._template = {key: self._global[key] for key in self._keys}
        self.graph = initial_graph(k, self.initial_graph)  # the paper's Fig. 6a, or the authors' code's
        self.graph_sites = list(self.clients)
        self._personal = {}
        self._neighbour_flat = None
        self._neighbour_norms = None

    def state_dict(self) -> Dict[str, Any]:
        """Adds the latest graph and its sites, the personalised models, the round-0 model (the origin of
        ``similarity="update"``) and last round's local models (the regulariser's neighbours)."""
        return {
            **super().state_dict(),
            "graph": torch.as_tensor(self.graph, dtype=torch.float64).clone(),
            "graph_sites": list(self.graph_sites),
            "personal": {s: clone_params(m) for s, m in self._personal.items()},
            "initial_flat": self._initial_flat.detach().clone(),
            "neighbour_flat": None if self._neighbour_flat is None else self._neighbour_flat.detach().clone(),
            "neighbour_norms": None if self._neighbour_norms is None else self._neighbour_norms.detach().clone(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.graph = state["graph"].numpy().astype(np.float64)
        self.graph_sites = list(state["graph_sites"])
        self._personal = {s: clone_params(m) for s, m in state["personal"].items()}
        # the restarted job's initial model may be a fresh initialisation; the similarity origin is the run's own
        self._initial_flat = state["initial_flat"].clone()
        self._template = {key: self._global[key] for key in self._keys}
        self._neighbour_flat = None if state["neighbour_flat"] is None else state["neighbour_flat"].clone()
        self._neighbour_norms = None if state["neighbour_norms"] is None else state["neighbour_norms"].clone()

    def payload(self, site: str, round_: int) -> SitePayload:
        """theta_global plus ``meta["graphfedseg"]`` = {lambda1, uncertainty, mc_samples,
        uncertainty_pass, direction}.

        ``direction`` is ``{key: float32 numpy array}`` over the trainable keys (the size of the model;
        numpy because FLModel meta is serialised without relying on a tensor decomposer), i.e.
        ``d_i = sum_{j != i} W_ij theta_j / ||theta_j||`` from the previous round, or None when the
        regulariser is off (round 0, lambda1 = 0, the site missed the last round, or no neighbours).
        ``regulariser="top_k"``: the sum runs over the row's ``top_k`` largest entries without i, and the meta adds
        ``self_weight`` (W_ii when i is among them, else 0) and ``weight_sum`` (their sum of W); before any local
        model exists (round 0) every neighbour's model is the initial one, the model a site holds before it trains.
        """
        direction, weights = self._direction_for(site) if self.regulariser == "paper" else self._top_k_direction_for(site)
        meta = {
            "lambda1": self.lambda1,
            "uncertainty": self.uncertainty,
            "mc_samples": self.mc_samples,
            "uncertainty_pass": self.uncertainty_pass,
            "regulariser": self.regulariser,
            "direction": direction,
            **weights,
        }
        # A site-specific meta goes out as its own task anyway; a distinct (shallow) params dict says so
        # to the controller, which otherwise groups sites by params object and compares their metas
        # with ``!=`` (ambiguous for arrays). The tensors are shared, nothing is copied.
        params = self._global if direction is None else dict(self._global)
        return SitePayload(params=params, meta={META_KEY: meta})

    def aggregate(self, round_: int, updates: Dict[str, ClientUpdate], exchange: Exchange) -> Dict[str, Any]:
        unknown = sorted(set(updates) - set(self.clients))
        if unknown:
            raise ValueError(f"updates from sites not in this job: {unknown}")
        sites = [s for s in self.clients if s in updates]
        if not sites:
            raise ValueError("no site returned a model this round")
        models = [updates[s].params for s in sites]
        p = np.asarray(sample_weights({s: updates[s].n_samples for s in sites}, sites), dtype=np.float64)
        U = np.asarray([_uncertainty_of(updates[s]) for s in sites], dtype=np.float64)

        raw = torch.stack([flatten_params(m, self._keys) for m in models])  # (K, D)
        theta_global = None
        W_aggregation = None
        if self.graph_in_aggregation == "previous":  # the authors' code: aggregate first, with last round's graph
            W_aggregation = restrict_graph(self.graph, self.graph_sites, sites, self.initial_graph)
            theta_global = dual_layer_aggregate(models, p, W_aggregation, self.lam)[0]
        if self.similarity == "update":
            origin = self._initial_flat
        elif self.similarity == "update_global":
            origin = flatten_params(theta_global, self._keys)
        else:
            origin = None
        cos = snap_cosine(pairwise_cosine(raw if origin is None else raw - origin), self.similarity_snap)
        prior = p if self.prior == "samples" else uncertainty_prior([updates[s].n_samples for s in sites], U)
        W, gap = self._solve_graph(prior, cos, U)
        # the personalised models: this round's graph over this round's models
        aggregated, neigh, _, _ = dual_layer_aggregate(models, p, W, self.lam)
        if W_aggregation is None:
            W_aggregation, theta_global = W, aggregated
        self._global = theta_global
        self._personal.update(zip(sites, neigh))
        self.graph, self.graph_sites = W, sites
        # only the regulariser needs them; the norms are shared by every site's direction
        self._neighbour_flat = raw if self.lambda1 > 0 else None
        self._neighbour_norms = row_norms(raw) if self.lambda1 > 0 else None
        weights = effective_weight(p, W_aggregation, self.lam)
        fields = {
            "graph_sites": sites,
            "dropped": [s for s in self.clients if s not in updates],
            "alpha": self.alpha_used,
            "p": p.tolist(),
            "uncertainty": dict(zip(sites, U.tolist())),
            "cos": cos.tolist(),
            "graph": W.tolist(),
            "effective_weight": dict(zip(sites, weights.tolist())),
            "graph_solver_gap": gap,
        }
        if self.prior != "samples":
            fields["prior"] = prior.tolist()
        if self.graph_in_aggregation == "previous":
            fields["aggregation_graph"] = W_aggregation.tolist()
        return fields

    def personalized_params(self) -> Optional[Dict[str, Params]]:
        """{site: theta_neigh[site]}; a site that never trained gets theta_global. None before round 0 ends."""
        if not self._personal:
            return None
        return {s: self._personal.get(s, self._global) for s in self.clients}

    # ------------------------------------------------------------------------------------------------

    def _solve_graph(self, p: np.ndarray, cos: np.ndarray, U: np.ndarray) -> Tuple[np.ndarray, Optional[float]]:
        """W by the configured solver; with cvxpy also the max |W_cvxpy - W_closed_form| (None otherwise)."""
        closed = graph_rows_closed_form(p, cos, U, self.alpha_used, self.gamma)
        if self.solver == "closed_form":
            return closed, None
        W = collaboration_graph(p, cos, U, self.alpha_used, self.gamma, solver="cvxpy")
        gap = float(np.abs(W - closed).max())
        if gap > SOLVER_TOLERANCE:
            logger.warning("graph QP (cvxpy) and closed form differ by %.3g > %.0e", gap, SOLVER_TOLERANCE)
        return W, gap

    def _direction_for(self, site: str) -> Tuple[Optional[Dict[str, np.ndarray]], Dict[str, float]]:
        if self.lambda1 == 0 or self._neighbour_flat is None or site not in self.graph_sites:
            return None, {}
        i = self.graph_sites.index(site)
        row = self.graph[i]
        if not np.any(np.delete(row, i) > 0):
            return None, {}  # no weight on other clients: the regulariser would be identically 0
        # j != i: the paper's "other clients"
        direction = neighbour_direction_from_flat(self._neighbour_flat, row, exclude=i, norms=self._neighbour_norms)
        return self._unflatten(direction), {}

    def _top_k_direction_for(self, site: str) -> Tuple[Optional[Dict[str, np.ndarray]], Dict[str, float]]:
        """The authors' code's term: the row's ``top_k`` largest entries (i included when among them)."""
        if self.lambda1 == 0 or site not in self.graph_sites:
            return None, {}
        i = self.graph_sites.index(site)
        row = self.graph[i]
        chosen = top_k_neighbours(row, self.top_k)
        weights = {"self_weight": float(row[i]) if i in chosen else 0.0, "weight_sum": float(row[chosen].sum())}
        others = np.zeros_like(row)
        for j in chosen:
            if j != i:
                others[j] = row[j]
        if not np.any(others > 0):
            return None, {}  # only i itself (or zero weights) among them: a constant term
        if self._neighbour_flat is not None:
            flat, norms = self._neighbour_flat, self._neighbour_norms
        else:  # before any local model: every site holds the initial model
            flat = self._initial_flat.expand(len(self.graph_sites), -1)
            norms = None
        return self._unflatten(neighbour_direction_from_flat(flat, others, norms=norms)), weights

    def _unflatten(self, direction: torch.Tensor) -> Dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in unflatten_params(direction, self._template, self._keys).items()}


def _uncertainty_of(update: ClientUpdate) -> float:
    if "uncertainty" not in update.meta:
        raise ValueError(
            f"site {update.site!r} sent no 'uncertainty' statistic; GraphFedSeg needs the graphfedseg objective"
        )
    value = float(update.meta["uncertainty"])
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"site {update.site!r} sent uncertainty {value}; need a finite value >= 0")
    return value
