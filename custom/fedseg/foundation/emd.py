"""Earth mover's distance between two sets of dense token features (FedEFM, after DeepEMD).

Each image gives a set of nodes (the ViT's patch tokens). The EMD between the student's set ``u`` and
a teacher's set ``v`` is the cost of the cheapest transport plan that moves the mass ``a`` on ``u``'s
nodes onto the mass ``b`` on ``v``'s nodes, paying ``1 - cos(u_i, v_k)`` per unit moved from ``i`` to
``k``. The plan solves a linear programme exactly (POT's network simplex, ``ot.emd2``).

Differentiability: the optimal value ``EMD(M) = min_G <G, M>`` is, where the optimal plan ``G*`` is
unique, differentiable in the cost with ``dEMD/dM = G*`` (the envelope theorem: ``G*`` is piecewise
constant in ``M``, so it contributes no term of its own). POT's torch backend attaches exactly that
gradient to the value ``ot.emd2`` returns, and autograd carries it on through the cosine cost to
``u`` and ``v``. This is the same derivative the paper obtains through the KKT conditions of the LP.
The marginals are constants (computed without gradient), as the design fixes.
"""

from __future__ import annotations

from typing import Optional, Tuple

import ot
import torch
import torch.nn.functional as F

#: floor added to every node weight (DeepEMD's value) so that no node is left without mass
MARGINAL_FLOOR = 1e-3


def emd_marginals(u: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepEMD node weights: how much a node agrees with the other set's mean feature.

    ``a_i = ReLU(<u_i, mean_k v_k>) + 1e-3`` and ``b_k = ReLU(<v_k, mean_i u_i>) + 1e-3``, each
    normalised to sum 1. Computed without gradient (they are constants of the transport problem).

    Args:
        u: ``(N, D)`` nodes of the first set.
        v: ``(K, D)`` nodes of the second set.
    Returns:
        ``(a (N,), b (K,))``, positive, each summing to 1, detached.
    """
    with torch.no_grad():
        a = torch.relu(u @ v.mean(0)) + MARGINAL_FLOOR
        b = torch.relu(v @ u.mean(0)) + MARGINAL_FLOOR
        return a / a.sum(), b / b.sum()


def cosine_cost(u: torch.Tensor, v: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Unit transport cost ``M_ik = 1 - cos(u_i, v_k)``, in ``[0, 2]`` up to rounding.

    Args:
        u: ``(N, D)``.
        v: ``(K, D)``.
        eps: norm floor (a zero vector has cosine 0 with everything, so cost 1).
    Returns:
        ``(N, K)``, differentiable in ``u`` and ``v``.
    """
    return 1.0 - F.normalize(u, dim=-1, eps=eps) @ F.normalize(v, dim=-1, eps=eps).transpose(-1, -2)


def emd_distance(
    u: torch.Tensor,
    v: torch.Tensor,
    marginals: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    num_iter_max: int = 1_000_000,
) -> torch.Tensor:
    """Exact EMD between two node sets, differentiable in both through the cost.

    Args:
        u: ``(N, D)`` student nodes.
        v: ``(K, D)`` teacher nodes (pass ``v.detach()`` for a frozen teacher); ``N != K`` is allowed.
        marginals: ``(a (N,), b (K,))`` to use instead of :func:`emd_marginals` (each summing to 1).
        num_iter_max: network-simplex iteration cap (POT warns if it is reached; the plan is then
            feasible but possibly not optimal). The default is 10x POT's, ample for 14 x 14 tokens.
    Returns:
        scalar tensor ``sum_ik G*_ik M_ik >= 0`` of ``u``'s dtype and device.
    """
    if u.dim() != 2 or v.dim() != 2 or u.shape[1] != v.shape[1]:
        raise ValueError(f"need (N, D) and (K, D) node sets, got {tuple(u.shape)} and {tuple(v.shape)}")
    a, b = emd_marginals(u, v) if marginals is None else marginals
    cost = cosine_cost(u, v)
    # POT casts the value to a's type; a and b carry no gradient, so autograd only sees dEMD/dM = G*
    a = a.detach().to(cost.dtype)
    b = b.detach().to(cost.dtype)
    return ot.emd2(a, b, cost, numItermax=num_iter_max)


def batch_emd(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Per-sample EMD between the student's and a teacher's token sets.

    The LP has no batched solver, so the samples are solved one after another (for the tiny profile's
    36 tokens a solve takes well under a millisecond; ViT-B/16's 196 tokens a few milliseconds).

    Args:
        student: ``(B, N, D)``.
        teacher: ``(B, K, D)``; gradients flow into it unless it is detached.
    Returns:
        ``(B,)``.
    """
    if student.dim() != 3 or teacher.dim() != 3 or student.shape[0] != teacher.shape[0] or student.shape[2] != teacher.shape[2]:
        raise ValueError(f"need (B, N, D) and (B, K, D) token sets, got {tuple(student.shape)} and {tuple(teacher.shape)}")
    return torch.stack([emd_distance(s, t) for s, t in zip(student, teacher)])
