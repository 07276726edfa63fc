"""PathFL's adaptive feature alignment (AFA) as a layer: re-normalise a feature map towards global moments.

    Z <- sigma_g * (Z - mu_Z) / sigma_Z + mu_g                                   (PathFL, eq. 12)

``mu_g`` and ``sigma_g`` are the federation's bottleneck moments, set by the server each round
(``fedseg.strategies.pathfl``) and carried in the model's ``state_dict`` as buffers, so a checkpoint holds
what inference needs. ``mu_Z`` and ``sigma_Z`` are each sample's own scalar statistics over all channels
and positions (the paper's statistics are scalars). Per sample rather than per batch, so that the output of
one image never depends on the other images of its batch: a sliding-window prediction does not change
with ``sw_batch_size``, and DP-SGD's per-sample gradients stay per-sample.
"""

from __future__ import annotations

import torch
from torch import nn


class FeatureAlignment(nn.Module):
    """Identity until the server activates it.

    Buffers (all scalar tensors):
        target_mean, target_std: the global moments ``mu_g``, ``sigma_g``.
        active: 1 once the server has sent global moments (round >= 1), else 0 (identity).
        at_inference: 1 to keep aligning in eval mode (the server's ``afa_at_inference`` choice), else the
            layer is the identity in eval mode.

    Input and output ``(B, C, *spatial)``.
    """

    def __init__(self, eps: float = 1e-5):
        super().__init__()
        self.eps = float(eps)
        self.register_buffer("target_mean", torch.tensor(0.0))
        self.register_buffer("target_std", torch.tensor(1.0))
        self.register_buffer("active", torch.tensor(0.0))
        self.register_buffer("at_inference", torch.tensor(0.0))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if float(self.active) < 0.5 or (not self.training and float(self.at_inference) < 0.5):
            return z
        dims = list(range(1, z.dim()))
        mean = z.mean(dim=dims, keepdim=True)
        std = torch.sqrt(z.var(dim=dims, unbiased=False, keepdim=True) + self.eps)
        return (z - mean) / std * self.target_std + self.target_mean

    def set_target(self, mean: float, std: float, at_inference: bool) -> None:
        """Activate with global moments (used by tests and by code holding a live module)."""
        self.target_mean.fill_(float(mean))
        self.target_std.fill_(float(std))
        self.active.fill_(1.0)
        self.at_inference.fill_(1.0 if at_inference else 0.0)
