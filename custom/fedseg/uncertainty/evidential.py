"""Evidential (subjective-logic) view of a softmax segmentation head.

Logits ``z`` of shape ``(B, C, *spatial)`` are read as evidence e = exp(z) of a Dirichlet with
concentration alpha = e + 1 (Sensoy et al. 2018). Logits are clamped at 80 before ``exp`` so that
float32 does not overflow (exp(88.7) is the float32 limit). Compute from float32 (or float64) logits:
in float16, exp(80) is already infinite.

Besides the Dirichlet basics, the module decomposes pixel-wise uncertainty into total / aleatoric /
epistemic parts (FedEvi) and gives the KL regulariser of evidential training.
"""

from __future__ import annotations

import math

import torch

LOGIT_CLAMP = 80.0


def dirichlet_alpha(logits: torch.Tensor, clamp: float = LOGIT_CLAMP) -> torch.Tensor:
    """``alpha = exp(min(z, clamp)) + 1``, same shape as ``logits`` ``(B, C, *spatial)``."""
    return torch.exp(torch.clamp(logits, max=clamp)) + 1.0


def dirichlet_strength(alpha: torch.Tensor) -> torch.Tensor:
    """``S = sum_c alpha_c``, shape ``(B, 1, *spatial)``."""
    return alpha.sum(dim=1, keepdim=True)


def expected_probability(alpha: torch.Tensor) -> torch.Tensor:
    """``rho = alpha / S``, the Dirichlet mean, shape ``(B, C, *spatial)``."""
    return alpha / dirichlet_strength(alpha)


def vacuity(alpha: torch.Tensor) -> torch.Tensor:
    """Pixel-wise evidential uncertainty ``u = C / S`` in (0, 1], shape ``(B, 1, *spatial)``."""
    return alpha.shape[1] / dirichlet_strength(alpha)


# --- Uncertainty decomposition (Depeweg et al. 2017; FedEvi Eqs. 3-5) -----------------------------
#
# Per pixel, the label y ~ Cat(rho) with rho ~ Dir(alpha):
#   total      H[E rho]          = -sum_c rho_c log rho_c                          (entropy of the mean)
#   aleatoric  E_rho[H[Cat(rho)]] = sum_c rho_c (psi(S + 1) - psi(alpha_c + 1))    (expected entropy)
#   epistemic  I[y, rho]          = total - aleatoric                              (mutual information)
# The aleatoric closed form uses E[rho_c log rho_c] = rho_c (psi(alpha_c + 1) - psi(S + 1)).
# The paper's printed Eq. 4 is the negative of the mutual information (it is <= 0 as printed); the
# reference code computes total - aleatoric, as done here.


def total_uncertainty(alpha: torch.Tensor) -> torch.Tensor:
    """Entropy of the expected probability ``H[rho]``, shape ``(B, 1, *spatial)``, in [0, log C].

    ``xlogy`` makes ``0 * log 0 = 0``, so a class whose probability underflows adds nothing instead
    of NaN.
    """
    rho = expected_probability(alpha)
    return -torch.special.xlogy(rho, rho).sum(dim=1, keepdim=True)


def aleatoric_uncertainty(alpha: torch.Tensor) -> torch.Tensor:
    """Expected entropy ``sum_c rho_c (psi(S+1) - psi(alpha_c+1))``, shape ``(B, 1, *spatial)``, >= 0.

    Non-negative because digamma is increasing and ``S > alpha_c``.
    """
    strength = dirichlet_strength(alpha)
    rho = alpha / strength
    return (rho * (torch.digamma(strength + 1.0) - torch.digamma(alpha + 1.0))).sum(dim=1, keepdim=True)


def epistemic_uncertainty(alpha: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """Mutual information ``I[y, rho] = H[rho] - E[H[Cat(rho)]]``, shape ``(B, 1, *spatial)``, >= 0.

    Mathematically non-negative (entropy is concave); for very confident pixels the difference of two
    nearly equal numbers can round to a tiny negative value, which is clamped to 0 (``clamp=False`` keeps the
    difference as computed, as the FedEvi reference code does).
    """
    difference = total_uncertainty(alpha) - aleatoric_uncertainty(alpha)
    return difference.clamp_min(0.0) if clamp else difference


# --- Evidential regulariser (Sensoy et al. 2018; FedEvi Eq. 10) -------------------------------------


def kl_dirichlet_to_uniform(alpha: torch.Tensor) -> torch.Tensor:
    """``KL(Dir(alpha) || Dir(1))`` per pixel, shape ``(B, 1, *spatial)``.

    Closed form with ``S = sum_c alpha_c`` and ``log B(1) = -log Gamma(C)``:
        lgamma(S) - lgamma(C) - sum_c lgamma(alpha_c) + sum_c (alpha_c - 1)(psi(alpha_c) - psi(S)).
    """
    num_classes = alpha.shape[1]
    strength = dirichlet_strength(alpha)
    log_norm = torch.lgamma(strength) - math.lgamma(num_classes) - torch.lgamma(alpha).sum(dim=1, keepdim=True)
    cross = ((alpha - 1.0) * (torch.digamma(alpha) - torch.digamma(strength))).sum(dim=1, keepdim=True)
    return log_norm + cross


def remove_true_class_evidence(alpha: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """``alpha~ = y + (1 - y) * alpha``: the true class's concentration reset to 1, others kept.

    Args:
        alpha: ``(B, C, *spatial)`` Dirichlet concentrations.
        onehot: ``(B, C, *spatial)`` one-hot labels (0/1).

    The KL of ``Dir(alpha~)`` to the uniform Dirichlet then penalises only evidence for wrong classes.
    """
    return onehot + (1.0 - onehot) * alpha
