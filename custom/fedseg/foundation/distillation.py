"""FedEFM's distillation loss at one silo: the local student learns from its overseas experts.

A silo ``i``'s teachers are the copies of its own model that its neighbours trained on their data
(``theta_ij``, frozen here). Each teacher ``t`` is weighted by how cheaply its dense features transport
to the student's (EMD), and contributes a softened-logit KL term plus its EMD:

    L = (1 - a) CE(p_s, y) + sum_t w_t [ a T^2 KL(softmax(z_t / T) || softmax(z_s / T)) + mu EMD_t ]
    w = softmax(-EMD.detach() / tau)

``EMD_t`` is the batch mean of the per-sample EMDs between the student's and teacher ``t``'s tokens of
the same images. The "w/o EMD" ablation uses uniform ``w`` and drops the ``mu`` term (and computes no
EMD at all).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .emd import batch_emd


def teacher_weights(emds: torch.Tensor, tau: float, use_emd: bool = True) -> torch.Tensor:
    """Per-teacher weights ``softmax(-EMD / tau)`` (no gradient flows through them).

    Args:
        emds: ``(T,)`` EMD of each teacher; with ``use_emd=False`` only its length, dtype and device count.
        tau: temperature (> 0); smaller favours the closest teacher more sharply.
        use_emd: ``False`` gives the uniform ``1 / T``.
    Returns:
        ``(T,)`` summing to 1, detached.
    """
    if emds.dim() != 1 or emds.numel() == 0:
        raise ValueError(f"need a non-empty (T,) vector of EMDs, got shape {tuple(emds.shape)}")
    if not use_emd:
        return torch.full_like(emds, 1.0 / emds.numel()).detach()
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    return torch.softmax(-emds.detach() / tau, dim=0)


def soft_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``KL(softmax(z_t / T) || softmax(z_s / T))`` summed over classes, averaged over the batch.

    Args:
        teacher_logits, student_logits: ``(B, C)``.
    Returns:
        scalar.
    """
    log_p_t = F.log_softmax(teacher_logits / temperature, dim=1)
    log_p_s = F.log_softmax(student_logits / temperature, dim=1)
    return (log_p_t.exp() * (log_p_t - log_p_s)).sum(1).mean()


def distillation_loss(
    student_logits: torch.Tensor,
    student_tokens: Optional[torch.Tensor],
    labels: torch.Tensor,
    teacher_logits: Sequence[torch.Tensor],
    teacher_tokens: Optional[Sequence[torch.Tensor]],
    alpha: float = 0.5,
    temperature: float = 4.0,
    tau: float = 0.1,
    mu: float = 0.1,
    use_emd: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Optional[torch.Tensor]]]:
    """FedEFM's loss at a silo (module docstring). Teachers are frozen: their tensors are detached here.

    Args:
        student_logits: ``(B, C)``.
        student_tokens: ``(B, N, D)`` dense tokens; may be ``None`` when ``use_emd`` is ``False``.
        labels: ``(B,)`` class indices.
        teacher_logits: ``T`` tensors ``(B, C)``, one per overseas expert (``T >= 1``).
        teacher_tokens: ``T`` tensors ``(B, K, D)``; may be ``None`` when ``use_emd`` is ``False``.
        alpha: weight ``a`` of the distillation against the cross-entropy, in ``[0, 1]``.
        temperature: softening temperature ``T`` of the logits (> 0).
        tau: temperature of the teacher weights (> 0).
        mu: weight of the EMD term.
        use_emd: ``False`` is the "w/o EMD" ablation (uniform weights, no EMD term, no EMD computed).
    Returns:
        ``(loss, info)``: scalar loss; ``info`` holds detached ``"emd"`` ``(T,)`` (``None`` without EMD),
        ``"weights"`` ``(T,)``, ``"kl"`` ``(T,)`` and ``"ce"`` (scalar).
    """
    num_teachers = len(teacher_logits)
    if num_teachers == 0:
        raise ValueError("distillation needs at least one teacher; train with plain cross-entropy instead")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    ce = F.cross_entropy(student_logits, labels)
    kl = torch.stack([soft_kl(z_t.detach(), student_logits, temperature) for z_t in teacher_logits])
    if use_emd:
        if student_tokens is None or teacher_tokens is None or len(teacher_tokens) != num_teachers:
            raise ValueError("use_emd needs the student's tokens and one token tensor per teacher")
        # EMD_t keeps its gradient to the student (the mu term); the weights see it detached
        emd = torch.stack([batch_emd(student_tokens, f_t.detach()).mean() for f_t in teacher_tokens])
        weights = teacher_weights(emd, tau)
        per_teacher = alpha * temperature**2 * kl + mu * emd
    else:
        emd = None
        weights = teacher_weights(kl.detach(), tau, use_emd=False)
        per_teacher = alpha * temperature**2 * kl
    loss = (1.0 - alpha) * ce + (weights * per_teacher).sum()
    info = {
        "emd": None if emd is None else emd.detach(),
        "weights": weights,
        "kl": kl.detach(),
        "ce": ce.detach(),
    }
    return loss, info
