"""The network of a volume job (``bundles/volume_seg``): the suite's U-Net or MONAI's UNETR, by ``volume_network``.

``"unet"`` is :class:`fedseg.networks.FeatureUNet` (every method; features for the methods that need them).
``"unetr"`` is MONAI's ``UNETR`` as Hatamizadeh et al. (2022) train it on 96^3 CT patches: a ViT-B/16 encoder
(hidden 768, 12 blocks, 12 heads, MLP 3072) over the patch, feature size 16, instance norm; its input size is the
patch (``crop_size``), each side a multiple of 16. It has no ``forward_features``, so methods whose objective needs
the U-Net's features (FedEvi, PathFL's alignment) refuse it when they ask for them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn

from .unet import FeatureUNet

__all__ = ["VOLUME_NETWORKS", "build_volume_network"]

#: the choices of train_config["volume_network"]
VOLUME_NETWORKS = ("unet", "unetr")
#: UNETR's ViT patch side (voxels): the patch must be a multiple of it
UNETR_PATCH = 16


def build_volume_network(kind: str, spatial_dims: int, in_channels: int, out_channels: int, channels: Sequence[int],
                         img_size: Sequence[int], norm: Any = "instance", dropout: float = 0.0,
                         init_seed: Optional[int] = None, feature_alignment: bool = False) -> nn.Module:
    """``(B, in_channels, *img_size) -> (B, out_channels, *img_size)`` logits. ``channels``, ``norm`` and
    ``feature_alignment`` shape the U-Net; UNETR's encoder is fixed (module docstring) and its weights drawn from
    ``init_seed``."""
    if kind == "unet":
        return FeatureUNet(spatial_dims=spatial_dims, in_channels=in_channels, out_channels=out_channels,
                           channels=channels, norm=norm, dropout=dropout, init_seed=init_seed,
                           feature_alignment=feature_alignment)
    if kind != "unetr":
        raise ValueError(f"train_config['volume_network'] must be one of {VOLUME_NETWORKS}, got {kind!r}")
    size = [int(s) for s in img_size]
    if len(size) != spatial_dims or any(s % UNETR_PATCH for s in size):
        raise ValueError(f"UNETR needs a {spatial_dims}-D patch whose sides are multiples of {UNETR_PATCH}, got {size}")
    if feature_alignment:
        raise ValueError("feature_alignment (PathFL) needs the U-Net (volume_network 'unet')")
    from monai.networks.nets import UNETR

    with torch.random.fork_rng(devices=[]):
        if init_seed is not None:
            torch.manual_seed(int(init_seed))
        return UNETR(in_channels=in_channels, out_channels=out_channels, img_size=size, feature_size=16,
                     hidden_size=768, mlp_dim=3072, num_heads=12, proj_type="conv", norm_name="instance",
                     dropout_rate=float(dropout), spatial_dims=spatial_dims)
