"""Stratified similarity aggregation (SSA, PathFL section 3.5), server side.

For stratum ``l`` and sites ``m, j`` (``M`` sites):

    C[m, j] = max(0, cos(phi_m(g_m), phi_j(g_j)))          phi_m: stratum l's output of site m's model,
                                                           g_m: site m's Gaussian noise batch
    s[m, j] = C[m, j] / sum_{j' != m} C[m, j']   (j != m)  row-normalised over the other sites
    w^l     = 1/(2M) sum_m [ w_m^l + sum_{j != m} s[m, j] w_j^l ]

The paper's eq. 13 is garbled; this form (``shared/methods/pathfl.md``) keeps every stratum a convex
combination. Written as ``w^l = sum_j a_j w_j^l`` with the mixing matrix ``P = (I + S) / 2`` (each row sums
to 1) and ``a = column means of P``. A row whose similarities are all 0 falls back to uniform over the other
sites. With two sites ``s`` is 1 off the diagonal whatever the similarity, so SSA is plain uniform
averaging.
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence

import torch

from fedseg.strategies.base import Params


def similarity_matrix(outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(M, M)`` cosine similarity of the flattened outputs, clipped at 0 (float64).

    Args:
        outputs: one tensor per site, all of the same number of elements.
    """
    flat = torch.stack([o.detach().reshape(-1).double() for o in outputs])
    norms = flat.norm(dim=1).clamp_min(1e-12)
    cos = (flat @ flat.T) / (norms[:, None] * norms[None, :])
    return cos.clamp(min=0.0, max=1.0)


def ssa_mixing_matrix(similarity: torch.Tensor) -> torch.Tensor:
    """``P = (I + S) / 2`` from a ``(M, M)`` similarity matrix; row ``m`` holds the weight each model gets in
    site ``m``'s term. Rows sum to 1; the aggregation weights are ``P.mean(0)``."""
    m = similarity.shape[0]
    if similarity.shape != (m, m):
        raise ValueError(f"similarity must be square, got {tuple(similarity.shape)}")
    if m == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    off = similarity.double() * (1 - torch.eye(m, dtype=torch.float64))
    rows = off.sum(1, keepdim=True)
    uniform = (1 - torch.eye(m, dtype=torch.float64)) / (m - 1)
    s = torch.where(rows > 0, off / rows.clamp_min(1e-300), uniform)
    return (torch.eye(m, dtype=torch.float64) + s) / 2


def stratified_average(models: Sequence[Params], weights_by_stratum: Mapping[str, Sequence[float]], stratum_of) -> Params:
    """Average each entry of the models with its stratum's weights.

    Args:
        models: one ``state_dict`` per site, same order as the weights.
        weights_by_stratum: ``{stratum: [a_1 .. a_M]}``.
        stratum_of: ``name -> stratum`` (``None``: copy the first model's entry, e.g. server-set buffers).
    Returns:
        the aggregated ``state_dict`` (integer entries keep the first model's value).
    """
    out: Dict[str, torch.Tensor] = {}
    for name, first in models[0].items():
        stratum = stratum_of(name)
        if stratum is None or not torch.is_floating_point(first):
            out[name] = first.detach().clone()
            continue
        w = torch.as_tensor(list(weights_by_stratum[stratum]), dtype=torch.float64)
        stacked = torch.stack([m[name].detach().double() for m in models])
        out[name] = torch.tensordot(w, stacked, dims=1).to(first.dtype)
    return out
