"""GraphFedSeg server maths: the uncertainty-aware collaboration graph and the dual-layer aggregation.

Notation (paper Sec. 2.2-2.3): K clients, ``p`` (K,) sample shares, ``cos`` (K, K) pairwise cosine
similarity of the clients' flattened parameters, ``U`` (K,) client uncertainties, ``W`` (K, K) the
collaboration graph (row i = how much client i takes from each client j; every row is a convex
combination).

Graph row i, Eq. (2):
    min_w  sum_j (w_j - p_j)^2 - alpha * sum_j w_j cos_ij + gamma * sum_j w_j U_j
    s.t.   w >= 0, sum_j w_j = 1.
Expanding the square, the objective is ``||w - c||^2 + const`` with
``c = p + (alpha / 2) cos_i - (gamma / 2) U``, so the minimiser is the Euclidean projection of ``c``
onto the probability simplex (Algorithm 1 writes the same QP as ``x^T x + (-2p - a_i + gamma U)^T x``).

Diagonal: j runs over all K clients, i included (Eq. 2 sums j = 1..K, Eq. 8 sums theta_neigh over
j = 1..K, as in pFedGraph), so ``cos_ii = 1`` enters row i and a client always keeps a share of its own
model. Both solvers use the same ``cos`` matrix, diagonal included.

Numbers live in float64 numpy arrays on the graph side (cvxpy's native type); model parameters stay
torch tensors.
"""

from __future__ import annotations

import functools
from typing import List, Mapping, Optional, Sequence, Tuple, Union

import cvxpy as cp
import numpy as np
import torch

from .base import Params

ArrayLike = Union[np.ndarray, Sequence[float], torch.Tensor]

#: state-dict suffixes that are statistics, not trainable parameters (BatchNorm buffers)
_BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


# ----------------------------------------------------------------------------------------------------
# flattening and similarity
# ----------------------------------------------------------------------------------------------------


def similarity_keys(params: Mapping[str, torch.Tensor]) -> List[str]:
    """Keys of the trainable floating-point entries of a state dict, in state-dict order.

    The server only sees state dicts, so "trainable" is approximated by dropping non-float entries and
    BatchNorm running statistics (``running_mean``, ``running_var``, ``num_batches_tracked``).
    """
    return [k for k, v in params.items() if torch.is_floating_point(v) and not k.endswith(_BUFFER_SUFFIXES)]


def flatten_params(params: Mapping[str, torch.Tensor], keys: Sequence[str], dtype=torch.float32) -> torch.Tensor:
    """Concatenate ``params[k]`` for ``k`` in ``keys`` into one ``(D,)`` vector, D = sum of numels."""
    return torch.cat([params[k].detach().reshape(-1).to(dtype) for k in keys])


def unflatten_params(vector: torch.Tensor, like: Mapping[str, torch.Tensor], keys: Sequence[str]) -> Params:
    """Inverse of ``flatten_params``: split a ``(D,)`` vector into ``{k: tensor shaped like like[k]}``."""
    out: Params = {}
    offset = 0
    for k in keys:
        n = like[k].numel()
        out[k] = vector[offset : offset + n].reshape(like[k].shape).clone()
        offset += n
    if offset != vector.numel():
        raise ValueError(f"vector has {vector.numel()} entries, the keys cover {offset}")
    return out


def pairwise_cosine(vectors: Union[torch.Tensor, np.ndarray], chunk: int = 1 << 15) -> np.ndarray:
    """Cosine similarity between all pairs of rows.

    Args:
        vectors: ``(K, D)`` flattened client parameters (or updates).
        chunk: columns per block. Products are float32 (fast GEMM), block sums accumulate in float64,
            which keeps the relative error near 1e-6 at D ~ 2e6 and never holds a float64 copy of
            the ``(K, D)`` matrix.

    Returns:
        ``(K, K)`` float64 numpy array, symmetric, values in [-1, 1], diagonal exactly 1. A zero row
        (e.g. a client that did not move) has cosine 0 with every other row.
    """
    x = torch.as_tensor(vectors)
    if x.ndim != 2:
        raise ValueError(f"vectors must be (K, D), got shape {tuple(x.shape)}")
    work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    gram = torch.zeros(x.shape[0], x.shape[0], dtype=torch.float64)
    for start in range(0, x.shape[1], chunk):
        block = x[:, start : start + chunk].to(work_dtype)
        gram += (block @ block.T).to(torch.float64)
    norms = gram.diagonal().clamp_min(0).sqrt()
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    cos = gram / safe[:, None] / safe[None, :]
    cos = cos.clamp(-1.0, 1.0)
    cos.fill_diagonal_(1.0)  # cos(theta_i, theta_i) = 1 by definition, also for a zero vector
    return cos.numpy()


# ----------------------------------------------------------------------------------------------------
# graph rows
# ----------------------------------------------------------------------------------------------------


def project_to_simplex(v: ArrayLike) -> np.ndarray:
    """Euclidean projection of each row onto the probability simplex {w >= 0, sum w = 1}.

    Sort-based closed form (Held et al. 1974; Wang & Carreira-Perpinan 2013): with ``u`` sorted in
    decreasing order and ``rho`` the largest k with ``u_k - (sum_{l<=k} u_l - 1) / k > 0``,
    ``w = max(v - tau, 0)`` where ``tau = (sum_{l<=rho} u_l - 1) / rho``.

    Args:
        v: ``(K,)`` or ``(R, K)``.

    Returns:
        float64 array with the shape of ``v``.
    """
    v = np.asarray(v, dtype=np.float64)
    rows = np.atleast_2d(v)
    k = rows.shape[-1]
    u = -np.sort(-rows, axis=-1)
    css = np.cumsum(u, axis=-1) - 1.0
    ks = np.arange(1, k + 1, dtype=np.float64)
    positive = u - css / ks > 0  # a prefix of True; the first entry is always True
    rho = k - np.argmax(positive[:, ::-1], axis=-1)  # 1-based index of the last True
    tau = css[np.arange(rows.shape[0]), rho - 1] / rho
    w = np.maximum(rows - tau[:, None], 0.0)
    return w.reshape(v.shape)


def graph_rows_closed_form(p: ArrayLike, cos: ArrayLike, U: ArrayLike, alpha: float, gamma: float) -> np.ndarray:
    """All rows of Eq. (2) by the closed form.

    Args:
        p: ``(K,)`` sample shares.
        cos: ``(K, K)`` cosine similarities, diagonal (= 1) included.
        U: ``(K,)`` client uncertainties.
        alpha, gamma: similarity reward and uncertainty penalty.

    Returns:
        ``W`` ``(K, K)``, row i = projection onto the simplex of ``p + (alpha/2) cos[i] - (gamma/2) U``.
    """
    p, cos, U = _check_graph_inputs(p, cos, U)
    return project_to_simplex(p[None, :] + 0.5 * alpha * cos - 0.5 * gamma * U[None, :])


#: OSQP: moderate ADMM tolerance, then polishing (an exact KKT solve on the detected active set); rho=1
#: suits this problem's scale (P = 2I) and cuts ADMM iterations ~10x versus the default 0.1.
_OSQP_OPTIONS = dict(eps_abs=1e-7, eps_rel=1e-7, rho=1.0, polish=True, warm_start=True, max_iter=200_000)
#: Clarabel (interior point) fallback at tight tolerances: ~1e-7 from the exact row in the worst case seen.
_CLARABEL_OPTIONS = dict(tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-10)


def _osqp_polished(problem: cp.Problem) -> bool:
    """Whether OSQP's polishing step succeeded (its ADMM answer alone is only accurate to ~eps)."""
    info = getattr(getattr(problem.solver_stats, "extra_stats", None), "info", None)
    return getattr(info, "status_polish", 0) == 1


class GraphQP:
    """Eq. (2) for one row as a parametrised cvxpy problem, compiled once for a given K.

    The parameters are ``p``, ``alpha * cos_i`` and ``gamma * U`` (a product of two parameters is not
    DPP, so the scalar factors are folded in), which keeps the objective literally the paper's. After
    the first solve cvxpy only re-substitutes parameters. The solver is OSQP with solution polishing:
    polishing solves the KKT system on the detected active set, so the answer matches the closed form
    to ~1e-14; if OSQP is not optimal or polishing fails, the row is re-solved with Clarabel at tight
    tolerances (~1e-7 worst case seen).

    The returned row is clipped at 0 and renormalised to sum 1: solvers satisfy the constraints only
    to their tolerance (entries like -1e-13), and downstream aggregation expects an exact convex
    combination. The change is at the tolerance level.

    Args:
        num_clients: K.
    """

    def __init__(self, num_clients: int):
        if num_clients < 1:
            raise ValueError(f"need at least one client, got {num_clients}")
        k = int(num_clients)
        self.num_clients = k
        self.w = cp.Variable(k, name="w")
        self.p = cp.Parameter(k, name="p")
        self.alpha_cos = cp.Parameter(k, name="alpha_cos")
        self.gamma_u = cp.Parameter(k, name="gamma_U")
        objective = cp.sum_squares(self.w - self.p) - self.alpha_cos @ self.w + self.gamma_u @ self.w
        self.problem = cp.Problem(cp.Minimize(objective), [self.w >= 0, cp.sum(self.w) == 1])
        if not self.problem.is_dpp():  # pragma: no cover - guards against edits that break caching
            raise RuntimeError("graph QP is not DPP; cvxpy would recompile it on every solve")

    def solve_row(self, p: ArrayLike, cos_row: ArrayLike, U: ArrayLike, alpha: float, gamma: float) -> np.ndarray:
        """Row i of W from ``p`` (K,), ``cos_row`` = cos[i] (K,), ``U`` (K,); returns ``(K,)``."""
        self.p.value = np.asarray(p, dtype=np.float64)
        self.alpha_cos.value = float(alpha) * np.asarray(cos_row, dtype=np.float64)
        self.gamma_u.value = float(gamma) * np.asarray(U, dtype=np.float64)
        self.problem.solve(solver=cp.OSQP, **_OSQP_OPTIONS)
        if self.problem.status != cp.OPTIMAL or not _osqp_polished(self.problem):
            self.problem.solve(solver=cp.CLARABEL, **_CLARABEL_OPTIONS)
        if self.problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or self.w.value is None:
            raise RuntimeError(f"graph QP failed: status {self.problem.status}")
        w = np.maximum(np.asarray(self.w.value, dtype=np.float64), 0.0)
        return w / w.sum()

    def solve_all(self, p: ArrayLike, cos: ArrayLike, U: ArrayLike, alpha: float, gamma: float) -> np.ndarray:
        """All K rows: ``p`` (K,), ``cos`` (K, K), ``U`` (K,) -> ``W`` (K, K)."""
        p, cos, U = _check_graph_inputs(p, cos, U)
        if p.shape[0] != self.num_clients:
            raise ValueError(f"this QP was compiled for K={self.num_clients}, got K={p.shape[0]}")
        return np.stack([self.solve_row(p, cos[i], U, alpha, gamma) for i in range(self.num_clients)])


@functools.lru_cache(maxsize=16)
def graph_qp(num_clients: int) -> GraphQP:
    """The compiled ``GraphQP`` for K clients (one per K per process)."""
    return GraphQP(num_clients)


def collaboration_graph(
    p: ArrayLike, cos: ArrayLike, U: ArrayLike, alpha: float, gamma: float, solver: str = "cvxpy"
) -> np.ndarray:
    """``W`` ``(K, K)`` of Eq. (2) for ``p`` (K,), ``cos`` (K, K), ``U`` (K,).

    ``solver="cvxpy"`` solves the K QPs (compiled once per K); ``"closed_form"`` projects onto the
    simplex. Both give the same W (to ~1e-10).
    """
    if solver == "cvxpy":
        p_arr, cos_arr, u_arr = _check_graph_inputs(p, cos, U)
        return graph_qp(p_arr.shape[0]).solve_all(p_arr, cos_arr, u_arr, alpha, gamma)
    if solver == "closed_form":
        return graph_rows_closed_form(p, cos, U, alpha, gamma)
    raise ValueError(f"solver must be 'cvxpy' or 'closed_form', got {solver!r}")


def _check_graph_inputs(p: ArrayLike, cos: ArrayLike, U: ArrayLike) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    cos = np.asarray(cos, dtype=np.float64)
    U = np.asarray(U, dtype=np.float64).reshape(-1)
    k = p.shape[0]
    if cos.shape != (k, k) or U.shape != (k,):
        raise ValueError(f"need p (K,), cos (K, K), U (K,); got {p.shape}, {cos.shape}, {U.shape}")
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(cos)) and np.all(np.isfinite(U))):
        raise ValueError("p, cos and U must be finite")
    return p, cos, U


# ----------------------------------------------------------------------------------------------------
# dual-layer aggregation
# ----------------------------------------------------------------------------------------------------


def effective_weight(p: ArrayLike, W: ArrayLike, lam: float) -> np.ndarray:
    """Weight of client j in theta_global: ``lam * p_j + (1 - lam) * mean_i W_ij``; ``(K,)`` from p (K,), W (K, K)."""
    p = np.asarray(p, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    return lam * p + (1.0 - lam) * W.mean(axis=0)


def dual_layer_aggregate(
    models: Sequence[Params], p: ArrayLike, W: ArrayLike, lam: float, chunk_elems: int = 1 << 22
) -> Tuple[Params, List[Params], Params, Params]:
    """Eqs. (6)-(9): data-based and graph-based aggregation, fused.

        theta_base     = sum_j p_j theta_j
        theta_neigh[i] = sum_j W_ij theta_j           (client i's personalised model)
        theta_graph    = mean_i theta_neigh[i]
        theta_global   = lam * theta_base + (1 - lam) * theta_graph

    All K + 3 outputs are linear in the models, so per key the K flattened tensors are stacked and
    multiplied once by a ``(K + 3, K)`` coefficient matrix (float64, in column blocks of at most
    ``chunk_elems`` stacked entries, 32 MiB by default, to bound memory). Non-floating entries
    (counters) are copied from the first model, as in ``weighted_average``.

    Args:
        models: K state dicts with identical keys and shapes.
        p: ``(K,)`` convex weights.
        W: ``(K, K)``, rows convex.
        lam: fusion coefficient in [0, 1].

    Returns:
        ``(theta_global, [theta_neigh_0, ..., theta_neigh_{K-1}], theta_base, theta_graph)``.
    """
    k = len(models)
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    W = np.asarray(W, dtype=np.float64)
    if k == 0 or p.shape != (k,) or W.shape != (k, k):
        raise ValueError(f"need K models, p (K,), W (K, K); got {k}, {p.shape}, {W.shape}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    _check_convex(p[None, :], "p")
    _check_convex(W, "W rows")
    graph_row = W.mean(axis=0)
    coeff = torch.from_numpy(np.vstack([W, p, graph_row, lam * p + (1.0 - lam) * graph_row]))  # (K+3, K)

    neigh: List[Params] = [{} for _ in range(k)]
    base: Params = {}
    graph: Params = {}
    global_: Params = {}
    largest = max([v.numel() for v in models[0].values() if torch.is_floating_point(v)], default=1)
    step = max(1, min(chunk_elems // k, largest))
    # two float64 work buffers reused for every block: fresh large allocations per block cost page faults
    block_buffer = torch.empty(k * step, dtype=torch.float64)
    out_buffer = torch.empty((k + 3) * step, dtype=torch.float64)
    for key, ref in models[0].items():
        if not torch.is_floating_point(ref):
            for target in neigh + [base, graph, global_]:
                target[key] = ref.clone()
            continue
        flats = [m[key].detach().reshape(-1) for m in models]
        n = ref.numel()
        result = torch.empty((k + 3, n), dtype=ref.dtype)
        for start in range(0, n, step):
            width = min(step, n - start)
            block = block_buffer[: k * width].view(k, width)
            for j, flat in enumerate(flats):
                block[j].copy_(flat[start : start + width])  # casts to float64 in the copy
            mixed = out_buffer[: (k + 3) * width].view(k + 3, width)
            torch.mm(coeff, block, out=mixed)
            result[:, start : start + width].copy_(mixed)
        for i in range(k):
            neigh[i][key] = result[i].view(ref.shape)
        base[key] = result[k].view(ref.shape)
        graph[key] = result[k + 1].view(ref.shape)
        global_[key] = result[k + 2].view(ref.shape)
    return global_, neigh, base, graph


def _check_convex(rows: np.ndarray, what: str, atol: float = 1e-6) -> None:
    if np.any(rows < -atol) or not np.allclose(rows.sum(axis=-1), 1.0, atol=atol):
        raise ValueError(f"{what} must be convex combinations (>= 0, sum 1)")


# ----------------------------------------------------------------------------------------------------
# client regulariser (Eq. 5)
# ----------------------------------------------------------------------------------------------------


def row_norms(vectors: torch.Tensor) -> torch.Tensor:
    """``(K,)`` float64 Euclidean norms of the rows of ``(K, D)`` ``vectors``, one row at a time (no
    float64 copy of the whole matrix)."""
    return torch.stack([torch.linalg.vector_norm(row.to(torch.float64)) for row in vectors])


def neighbour_direction_from_flat(
    vectors: torch.Tensor, W_row: ArrayLike, exclude: Optional[int] = None, norms: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``(D,)`` direction ``d_i = sum_j W_ij theta_j / ||theta_j||`` from stacked flattened models.

    The regulariser of Eq. (5) is then ``-(lambda1/2) <theta_i/||theta_i||, d_i>``, which equals
    ``-(lambda1/2) sum_j W_ij cos(theta_i, theta_j)`` without sending K models.

    j range: the paper's text under Eq. (5) says theta_j are the *other* clients' models of the
    previous round (the spec: "the K-1 neighbour models"), so GraphFedSeg passes ``exclude=i``; with
    ``exclude=None`` every j is summed (pFedGraph's code, where j = i is the client's own previous model).

    Args:
        vectors: ``(K, D)`` flattened neighbour models (:func:`flatten_params` over :func:`similarity_keys`).
        W_row: ``(K,)`` row i of the graph.
        exclude: index left out of the sum (client i itself).
        norms: ``(K,)`` ``row_norms(vectors)`` when already known (the server builds one direction per
            site from the same models, so it computes them once per round).

    Returns:
        ``(D,)`` in the dtype of ``vectors``. A zero model contributes nothing (its cosine is 0).
    """
    weights = torch.as_tensor(np.asarray(W_row, dtype=np.float64)).clone()
    if weights.shape != (vectors.shape[0],):
        raise ValueError(f"W_row must be ({vectors.shape[0]},), got {tuple(weights.shape)}")
    if exclude is not None:
        weights[exclude] = 0.0
    norms = row_norms(vectors) if norms is None else torch.as_tensor(norms, dtype=torch.float64)
    if norms.shape != weights.shape:
        raise ValueError(f"norms must be ({vectors.shape[0]},), got {tuple(norms.shape)}")
    scale = torch.where(norms > 0, weights / torch.where(norms > 0, norms, torch.ones_like(norms)), torch.zeros_like(norms))
    return (scale.to(vectors.dtype)[None, :] @ vectors).reshape(-1)


def similarity_regulariser(
    theta: Union[torch.Tensor, Sequence[torch.Tensor]],
    direction: Union[torch.Tensor, Sequence[torch.Tensor]],
    lambda1: float,
) -> torch.Tensor:
    """``-(lambda1 / 2) * <theta / ||theta||, direction>``, a differentiable scalar.

    Args:
        theta: the client's current parameters, either flattened ``(D,)`` or as a sequence of parameter
            tensors (requires grad during training). The sequence form is what training uses: it reads
            the parameters in place, so no ``(D,)`` copy is made (and back-propagated through) every step.
        direction: from :func:`neighbour_direction_from_flat` (constant), with the same structure as ``theta``:
            ``(D,)``, or one tensor per parameter with that parameter's number of entries.
        lambda1: regulariser weight; the minus sign maximises similarity, as in the paper's Eq. (5).
    """
    thetas = [theta] if isinstance(theta, torch.Tensor) else list(theta)
    directions = [direction] if isinstance(direction, torch.Tensor) else list(direction)
    if len(thetas) != len(directions) or not thetas:
        raise ValueError(f"theta has {len(thetas)} tensors, direction {len(directions)}")
    flat = [(t.reshape(-1), d.reshape(-1).to(t.dtype)) for t, d in zip(thetas, directions)]
    dot = torch.stack([torch.dot(t, d) for t, d in flat]).sum()
    squared_norm = torch.stack([torch.dot(t, t) for t, _ in flat]).sum()
    norm = squared_norm.sqrt().clamp_min(torch.finfo(squared_norm.dtype).tiny)
    return -0.5 * lambda1 * dot / norm


def top_k_regulariser(
    theta: Union[torch.Tensor, Sequence[torch.Tensor]],
    direction: Optional[Union[torch.Tensor, Sequence[torch.Tensor]]],
    self_weight: float,
    weight_sum: float,
    lambda1: float,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The GraphFedSeg authors' code's similarity term, a differentiable scalar:

        lambda1 * (1 - sum_{j in N_i} W_ij cos(theta, theta_j) / (sum_{j in N_i} W_ij + eps))

    with ``N_i`` the k largest entries of row i of W (:func:`top_k_neighbours`), i itself included when its own
    entry is among them (its cosine with itself is 1: ``self_weight`` = W_ii then, else 0), and the other
    neighbours' sum ``sum_{j in N_i, j != i} W_ij cos(theta, theta_j) = <theta / ||theta||, direction>`` with
    ``direction`` = :func:`neighbour_direction_from_flat` over ``N_i`` without i (None when there is none).
    ``weight_sum`` = ``sum_{j in N_i} W_ij``; ``theta`` and ``direction`` as in :func:`similarity_regulariser`.
    """
    if direction is None:  # only i itself among the neighbours: a constant
        return torch.tensor(lambda1 * (1.0 - float(self_weight) / (float(weight_sum) + eps)))
    # similarity_regulariser(theta, d, -2) = <theta / ||theta||, d>
    weighted = float(self_weight) + similarity_regulariser(theta, direction, -2.0)
    return lambda1 * (1.0 - weighted / (float(weight_sum) + eps))


# ----------------------------------------------------------------------------------------------------
# the authors' code's graph: prior, cosine snap, initial graph, neighbours
# ----------------------------------------------------------------------------------------------------

#: added to U before dividing (the authors' code: ``n / (U + 1e-6)``)
PRIOR_EPS = 1e-6
#: initial graphs: 1/K everywhere (the paper's Fig. 6a), or 1/(K-1) off the diagonal and 0 on it (the authors' code)
INITIAL_GRAPHS = ("uniform", "uniform_others")


def uncertainty_prior(n: ArrayLike, U: ArrayLike, eps: float = PRIOR_EPS) -> np.ndarray:
    """``p_j = (n_j / (U_j + eps)) / sum_l n_l / (U_l + eps)``, ``(K,)`` float64: the sample shares divided by the
    client uncertainties, renormalised (the authors' code's target of the graph QP in place of ``n / sum n``)."""
    n = np.asarray(n, dtype=np.float64).reshape(-1)
    U = np.asarray(U, dtype=np.float64).reshape(-1)
    if n.shape != U.shape or np.any(n < 0) or np.any(U < 0) or not (np.all(np.isfinite(n)) and np.all(np.isfinite(U))):
        raise ValueError(f"need n (K,) >= 0 and U (K,) >= 0, finite; got {n.tolist()}, {U.tolist()}")
    raw = n / (U + eps)
    if raw.sum() <= 0:
        raise ValueError("every site has n = 0: no prior")
    return raw / raw.sum()


def snap_cosine(cos: ArrayLike, threshold: Optional[float]) -> np.ndarray:
    """``cos`` with every entry above ``threshold`` set to 1 (the authors' code: 0.9); None leaves it unchanged."""
    out = np.array(cos, dtype=np.float64)
    if threshold is not None:
        out[out > float(threshold)] = 1.0
    return out


def initial_graph(num_clients: int, kind: str = "uniform") -> np.ndarray:
    """W before the first round, ``(K, K)``: ``"uniform"`` 1/K everywhere, ``"uniform_others"`` 1/(K-1) off the
    diagonal and 0 on it (a single client keeps itself)."""
    k = int(num_clients)
    if kind not in INITIAL_GRAPHS:
        raise ValueError(f"initial graph must be one of {INITIAL_GRAPHS}, got {kind!r}")
    if k < 1:
        raise ValueError(f"need at least one client, got {k}")
    if kind == "uniform" or k == 1:
        return np.full((k, k), 1.0 / k)
    W = np.full((k, k), 1.0 / (k - 1))
    np.fill_diagonal(W, 0.0)
    return W


def restrict_graph(W: ArrayLike, rows: Sequence[str], sites: Sequence[str], kind: str = "uniform") -> np.ndarray:
    """A graph over ``sites`` from ``W`` over ``rows``: entries between two sites of ``rows`` kept, the rest from
    :func:`initial_graph` (a site ``W`` has no row for), every row renormalised to sum 1 (an all-zero row: the
    initial graph's)."""
    W = np.asarray(W, dtype=np.float64)
    out = initial_graph(len(sites), kind)
    index = {s: i for i, s in enumerate(rows)}
    known = [a for a, s in enumerate(sites) if s in index]
    for a in known:
        for b in known:
            out[a, b] = W[index[sites[a]], index[sites[b]]]
    fallback = initial_graph(len(sites), kind)
    for a in range(len(sites)):
        total = out[a].sum()
        out[a] = out[a] / total if total > 0 else fallback[a]
    return out


def two_site_identity_holds(p: ArrayLike, alpha: float) -> bool:
    """Whether W = I for two sites whose cosines are ``[[1, -1], [-1, 1]]`` (each site's change against a convex
    combination of the two models: the changes are opposite), ``p`` (2,) the QP's target.

    Row 1 projects ``c = (p_1 + alpha / 2, p_2 - alpha / 2)`` onto the simplex; the projection is the vertex (1, 0)
    exactly when ``c_1 - c_2 >= 1``, i.e. ``p_1 - p_2 + alpha >= 1``; row 2 likewise. Both: ``|p_1 - p_2| <= alpha - 1``
    (gamma = 0; with gamma > 0 replace p by p - (gamma / 2) U)."""
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    if p.shape != (2,):
        raise ValueError(f"two sites: p must be (2,), got {p.shape}")
    return bool(abs(p[0] - p[1]) <= float(alpha) - 1.0)


def top_k_neighbours(row: ArrayLike, k: int) -> np.ndarray:
    """Indices of the ``min(k, K)`` largest entries of a graph row, largest first, ties in index order."""
    row = np.asarray(row, dtype=np.float64).reshape(-1)
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return np.argsort(-row, kind="stable")[: int(k)]


__all__ = [
    "GraphQP",
    "collaboration_graph",
    "dual_layer_aggregate",
    "effective_weight",
    "flatten_params",
    "graph_qp",
    "graph_rows_closed_form",
    "initial_graph",
    "restrict_graph",
    "snap_cosine",
    "top_k_neighbours",
    "two_site_identity_holds",
    "top_k_regulariser",
    "uncertainty_prior",
    "neighbour_direction_from_flat",
    "pairwise_cosine",
    "project_to_simplex",
    "row_norms",
    "similarity_keys",
    "similarity_regulariser",
    "unflatten_params",
]
