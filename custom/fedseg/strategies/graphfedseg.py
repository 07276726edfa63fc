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
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from fedseg.uncertainty.client_uncertainty import check_estimator

from .aggregation import sample_weights
from .base import ClientUpdate, Exchange, Params, ServerStrategy, SitePayload, clone_params
from .collaboration_graph import (
    collaboration_graph,
    dual_layer_aggregate,
    effective_weight,
    flatten_params,
    graph_rows_closed_form,
    neighbour_direction_from_flat,
    pairwise_cosine,
    row_norms,
    similarity_keys,
    unflatten_params,
)

logger = logging.getLogger(__name__)

#: the paper's alpha = K * 0.08 (Sec. 2.2.1)
ALPHA_PER_CLIENT = 0.08
#: cvxpy and the closed form must agree to this (spec); a larger gap is logged
SOLVER_TOLERANCE = 1e-6
META_KEY = "graphfedseg"


class GraphFedSegStrategy(ServerStrategy):
    """Uncertainty-aware collaboration graph and dual-layer aggregation.

    Args:
        alpha: similarity reward in Eq. (2); None -> 0.08 * K (K = number of clients at ``start``).
        gamma: uncertainty penalty in Eq. (2) (paper: 0.4).
        lam: fusion coefficient of Eq. (6) (paper: 0.2).
        lambda1: client regulariser weight of Eq. (5) (spec: 0.01; 0 disables it).
        similarity: "update" (theta - theta_0, default) or "weights" (raw theta) for cos_ij.
        solver: "cvxpy" (default; cross-checked against the closed form every round) or "closed_form".
        uncertainty: client estimator, "evidential" (paper) or "mc_dropout" (Sec. 3.7 comparison).
        mc_samples: T for "mc_dropout" (paper: 5 or 10).
        uncertainty_pass: "after_training" (paper) or "last_epoch", sent to the sites
            (``fedseg.objectives.graphfedseg``).
    """

    name = "graphfedseg"
    objective = "graphfedseg"

    def __init__(
        self,
        alpha: Optional[float] = None,
        gamma: float = 0.4,
        lam: float = 0.2,
        lambda1: float = 0.01,
        similarity: str = "update",
        solver: str = "cvxpy",
        uncertainty: str = "evidential",
        mc_samples: int = 5,
        uncertainty_pass: str = "after_training",
    ):
        super().__init__()
        if alpha is not None and not (math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"alpha must be None or a finite number >= 0, got {alpha}")
        if not (math.isfinite(gamma) and gamma >= 0):
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        if not (math.isfinite(lambda1) and lambda1 >= 0):
            raise ValueError(f"lambda1 must be >= 0, got {lambda1}")
        if similarity not in ("update", "weights"):
            raise ValueError(f"similarity must be 'update' or 'weights', got {similarity!r}")
        if solver not in ("cvxpy", "closed_form"):
            raise ValueError(f"solver must be 'cvxpy' or 'closed_form', got {solver!r}")
        check_estimator(uncertainty, mc_samples, uncertainty_pass)
        # stored under the constructor's names: recipe export keeps only self.<argname> attributes
        self.alpha = None if alpha is None else float(alpha)
        self.gamma = float(gamma)
        self.lam = float(lam)
        self.lambda1 = float(lambda1)
        self.similarity = similarity
        self.solver = solver
        self.uncertainty = uncertainty
        self.mc_samples = int(mc_samples)
        self.uncertainty_pass = uncertainty_pass
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
        return {
            "strategy": self.name,
            "alpha": self.alpha_used,
            "alpha_rule": "0.08*K" if self.alpha is None else "fixed",
            "gamma": self.gamma,
            "lam": self.lam,
            "lambda1": self.lambda1,
            "similarity": self.similarity,
            "solver": self.solver,
            "uncertainty": self.uncertainty,
            "mc_samples": self.mc_samples,
            "uncertainty_pass": self.uncertainty_pass,
        }

    def start(self, clients: List[str], initial_params: Params) -> None:
        super().start(sorted(clients), initial_params)
        k = len(self.clients)
        if k == 0:
            raise ValueError("GraphFedSeg needs at least one client")
        self.alpha_used = ALPHA_PER_CLIENT * k if self.alpha is None else self.alpha
        self._keys = similarity_keys(self._global)
        self._initial_flat = flatten_params(self._global, self._keys)
        self._template = {key: self._global[key] for key in self._keys}
        self.graph = np.full((k, k), 1.0 / k)  # the paper's initial graph (Fig. 6a)
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
        """
        direction = self._direction_for(site)
        meta = {
            "lambda1": self.lambda1,
            "uncertainty": self.uncertainty,
            "mc_samples": self.mc_samples,
            "uncertainty_pass": self.uncertainty_pass,
            "direction": direction,
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
        cos = pairwise_cosine(raw - self._initial_flat if self.similarity == "update" else raw)
        W, gap = self._solve_graph(p, cos, U)
        theta_global, neigh, _, _ = dual_layer_aggregate(models, p, W, self.lam)

        self._global = theta_global
        self._personal.update(zip(sites, neigh))
        self.graph, self.graph_sites = W, sites
        # only the regulariser needs them; the norms are shared by every site's direction
        self._neighbour_flat = raw if self.lambda1 > 0 else None
        self._neighbour_norms = row_norms(raw) if self.lambda1 > 0 else None
        weights = effective_weight(p, W, self.lam)
        return {
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

    def _direction_for(self, site: str) -> Optional[Dict[str, np.ndarray]]:
        if self.lambda1 == 0 or self._neighbour_flat is None or site not in self.graph_sites:
            return None
        i = self.graph_sites.index(site)
        row = self.graph[i]
        if not np.any(np.delete(row, i) > 0):
            return None  # no weight on other clients: the regulariser would be identically 0
        # j != i: the paper's "other clients"
        direction = neighbour_direction_from_flat(self._neighbour_flat, row, exclude=i, norms=self._neighbour_norms)
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
