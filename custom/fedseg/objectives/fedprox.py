"""FedProx (Li et al., MLSys 2020): the segmentation loss plus a proximal term to the received global model.

``L = L_seg + (mu / 2) ||w - w_global||^2`` over the trainable parameters, with NVFlare's
``PTFedProxLoss`` computing the term. ``w_global`` is a frozen copy of the weights the site received this
round. The term reads no data (``parameter_loss``): under DP its exact gradient is added after
privatisation. ``mu = 0`` is FedAvg: the term is still computed (it is exactly 0 and adds exactly 0 to every
gradient), so the ablation row ``prox0=fedprox:mu=0`` runs the same code path as ``fedprox``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from nvflare.app_opt.pt.fedproxloss import PTFedProxLoss
from torch import nn

from .base import BatchOutput, ClientObjective, RoundContext
from .site_records import frozen_copy


class FedProxObjective(ClientObjective):
    """Args:
        mu: weight of the proximal term (NVFlare's ``PTFedProxLoss`` default 0.01; the FedProx paper tunes
            it over {0.001, 0.01, 0.1, 1}).
        seg_loss: the bundle's segmentation loss (set by the engine when None).
    """

    name = "fedprox"

    def __init__(self, mu: float = 0.01, seg_loss: Optional[nn.Module] = None):
        super().__init__(seg_loss=seg_loss)
        if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu >= 0):
            raise ValueError(f"FedProx mu must be a finite number >= 0, got {mu!r}")
        self.mu = float(mu)
        self.prox = PTFedProxLoss(mu=self.mu)
        self._model: Optional[nn.Module] = None
        self._anchor: Optional[nn.Module] = None

    def anchor(self, model: nn.Module, reference: nn.Module) -> None:
        """Penalise ``model``'s distance to ``reference`` (copied and frozen) from now on."""
        self._model, self._anchor = model, frozen_copy(reference)

    def release(self) -> None:
        """Drop the model references (after the round)."""
        self._model = self._anchor = None

    def begin_round(self, ctx: RoundContext, model: nn.Module) -> None:
        self.anchor(model, model)  # the weights just received

    def data_loss(self, out: BatchOutput) -> torch.Tensor:
        return super().loss(out)

    def parameter_loss(self, model: Optional[nn.Module]) -> Optional[torch.Tensor]:
        """``(mu / 2) sum_p ||w_p - w_global_p||^2`` of the bound model (scalar tensor)."""
        if self._anchor is None:
            raise RuntimeError("FedProxObjective needs the global model: call begin_round(ctx, model) first")
        return self.prox(self._model, self._anchor)

    def loss(self, out: BatchOutput) -> torch.Tensor:
        return self.data_loss(out) + self.parameter_loss(None)

    def end_round(self, ctx, model, engine):
        self.release()
        return {}
