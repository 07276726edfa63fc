"""Evidential segmentation losses (FedEvi Sec. 2.4: Dice on the Dirichlet mean + annealed KL).

Shapes: logits / alpha / one-hot labels are ``(B, C, *spatial)``; index labels are ``(B, 1, *spatial)``.
Dice sums run over the batch and all pixels of a class at once (one Dice per class per batch, as in
the FedEvi reference code), background included, then average over the C classes.

Two Dice forms:
    "dice"        the reference code's loss on rho = alpha / S:
                  1 - mean_c (2 sum(rho_c y_c) + eps) / (sum(rho_c^2) + sum(y_c) + eps)
    "bayes_risk"  the paper's wording ("Bayes risk of Dice"): the rho-terms are replaced by their
                  expectations under Dir(alpha) (ratio of expectations, as in region-based evidential
                  losses; the expectation of the ratio has no closed form):
                  E[rho_c] = alpha_c / S and E[rho_c^2] = alpha_c (alpha_c + 1) / (S (S + 1)).
                  Since E[rho_c^2] = rho_c^2 + Var(rho_c), low-evidence pixels are penalised even when
                  their mean is right; with strong evidence (S -> inf) both forms agree.
"""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from fedseg.uncertainty.evidential import (
    LOGIT_CLAMP,
    dirichlet_alpha,
    dirichlet_strength,
    expected_probability,
    kl_dirichlet_to_uniform,
    remove_true_class_evidence,
)

DICE_FORMS = ("dice", "bayes_risk")


def one_hot_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``(B, 1, *spatial)`` integer-valued masks (any dtype, e.g. 0/1 floats) -> ``(B, C, *spatial)`` float one-hot."""
    if labels.ndim < 2 or labels.shape[1] != 1:
        raise ValueError(f"labels must be (B, 1, *spatial), got {tuple(labels.shape)}")
    index = labels.round().long()
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_classes):
        low, high = int(index.min()), int(index.max())
        raise ValueError(f"label values must lie in [0, {num_classes - 1}], got [{low}, {high}]")
    onehot = torch.zeros((labels.shape[0], num_classes) + tuple(labels.shape[2:]), device=labels.device)
    return onehot.scatter_(1, index, 1.0)


def expected_squared_probability(alpha: torch.Tensor) -> torch.Tensor:
    """``E[rho_c^2] = alpha_c (alpha_c + 1) / (S (S + 1))`` under ``Dir(alpha)``, shape ``(B, C, *spatial)``.

    Derivation: Var(rho_c) = alpha_c (S - alpha_c) / (S^2 (S + 1)) and E[rho_c] = alpha_c / S, so
    E[rho_c^2] = Var + E^2 = alpha_c [(S - alpha_c) + alpha_c (S + 1)] / (S^2 (S + 1))
               = alpha_c (alpha_c + 1) / (S (S + 1)).
    Evaluated as ``rho_c * (alpha_c + 1) / (S + 1)``: ``alpha_c (alpha_c + 1)`` overflows float32 once
    alpha reaches exp(80).
    """
    strength = dirichlet_strength(alpha)
    return (alpha / strength) * ((alpha + 1.0) / (strength + 1.0))


def _dice_from_terms(
    overlap: torch.Tensor, squared: torch.Tensor, onehot: torch.Tensor, eps: float
) -> torch.Tensor:
    """``1 - mean_c (2 sum(overlap_c) + eps) / (sum(squared_c) + sum(y_c) + eps)``; sums over all but dim 1."""
    dims = [0] + list(range(2, onehot.ndim))
    numerator = 2.0 * overlap.sum(dim=dims) + eps
    denominator = squared.sum(dim=dims) + onehot.sum(dim=dims) + eps
    return 1.0 - (numerator / denominator).mean()


def evidential_dice_loss(alpha: torch.Tensor, onehot: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Soft Dice on the expected probability ``rho = alpha / S`` (reference-code form), scalar.

    Args:
        alpha: ``(B, C, *spatial)`` Dirichlet concentrations.
        onehot: ``(B, C, *spatial)`` one-hot labels.
        eps: smoothing added to numerator and denominator; a class absent from both prediction and
            labels scores Dice 1.
    """
    rho = expected_probability(alpha)
    return _dice_from_terms(rho * onehot, rho * rho, onehot, eps)


def bayes_risk_dice_loss(alpha: torch.Tensor, onehot: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Dice with ``rho_c`` and ``rho_c^2`` replaced by their Dirichlet expectations, scalar.

    ``E[rho_c y_c] = y_c alpha_c / S`` (y is fixed) and ``E[rho_c^2]`` from
    :func:`expected_squared_probability`. Shapes as in :func:`evidential_dice_loss`.
    """
    rho = expected_probability(alpha)
    return _dice_from_terms(rho * onehot, expected_squared_probability(alpha), onehot, eps)


def kl_annealing_weight(round_: int, lam: float = 0.01, anneal_rounds: int = 10) -> float:
    """``lam * min(1, round_ / anneal_rounds)`` with ``round_`` counted from 1 (round 1 -> lam / 10).

    The ramp keeps the regulariser from flattening all evidence before the network has learnt any.
    """
    if round_ < 0:
        raise ValueError(f"round_ is counted from 1, got {round_}")
    if anneal_rounds <= 0:
        return float(lam)
    return float(lam) * min(1.0, round_ / float(anneal_rounds))


class EvidentialSegLoss(nn.Module):
    """``L = L_dice(alpha, y) + kl_annealing_weight(round) * mean_pixels KL(Dir(alpha~) || Dir(1))``.

    Args:
        dice_form: "dice" (reference code) or "bayes_risk" (expected-moment form).
        kl_weight: lambda (paper: 0.01).
        anneal_rounds: rounds over which the KL weight ramps up to lambda (paper: 10).
        eps: Dice smoothing.
        clamp: logit clamp before ``exp`` (see ``fedseg.uncertainty.evidential``).

    ``forward(logits (B, C, *spatial), labels (B, 1, *spatial) integer-valued, round_ >= 1)`` -> scalar.
    Logits are cast to float32 so that ``exp`` of a clamped logit stays finite under autocast.
    """

    def __init__(
        self,
        dice_form: str = "dice",
        kl_weight: float = 0.01,
        anneal_rounds: int = 10,
        eps: float = 1e-5,
        clamp: float = LOGIT_CLAMP,
    ):
        super().__init__()
        if dice_form not in DICE_FORMS:
            raise ValueError(f"dice_form must be one of {DICE_FORMS}, got {dice_form!r}")
        self.dice_form = dice_form
        self.kl_weight = float(kl_weight)
        self.anneal_rounds = int(anneal_rounds)
        self.eps = float(eps)
        self.clamp = float(clamp)

    def terms(self, logits: torch.Tensor, labels: torch.Tensor, round_: int) -> Dict[str, torch.Tensor]:
        """The loss parts: ``dice``, ``kl`` (pixel mean), ``kl_weight`` and their ``total``."""
        alpha = dirichlet_alpha(logits.float(), clamp=self.clamp)
        onehot = one_hot_labels(labels, alpha.shape[1]).to(alpha)
        dice_fn = evidential_dice_loss if self.dice_form == "dice" else bayes_risk_dice_loss
        dice = dice_fn(alpha, onehot, eps=self.eps)
        kl = kl_dirichlet_to_uniform(remove_true_class_evidence(alpha, onehot)).mean()
        weight = kl_annealing_weight(round_, lam=self.kl_weight, anneal_rounds=self.anneal_rounds)
        return {"dice": dice, "kl": kl, "kl_weight": torch.tensor(weight), "total": dice + weight * kl}

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, round_: int) -> torch.Tensor:
        return self.terms(logits, labels, round_)["total"]
