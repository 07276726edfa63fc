"""A 2D/3D U-Net whose intermediate feature maps are addressable by name.

Several methods need more than logits: FVAC aligns foreground/background means of a decoder map,
PathFL and FedEFM work on encoder features, GraphFedSeg's MC-dropout option needs dropout layers.
``forward`` stays a plain ``x -> logits`` map (TorchScript-exportable, usable by MONAI inferers);
``forward_features`` returns the same logits plus a dict of named maps.

Feature names (``L = len(channels)``, level 0 is full resolution):
    ``enc0 .. enc{L-2}``  encoder block outputs, shape (B, channels[i], H/2^i, W/2^i)
    ``bottleneck``        deepest map, shape (B, channels[-1], H/2^(L-1), W/2^(L-1))
    ``dec{L-2} .. dec0``  decoder block outputs, ``dec{i}`` at the resolution of ``enc{i}``
    ``decoder_last``      alias of ``dec0``: the last decoder map before the 1x1 head, (B, channels[0], H, W)

With ``feature_alignment=True`` the bottleneck output passes through a ``FeatureAlignment`` layer
(``bottleneck_alignment``, PathFL's AFA; identity until the server activates it); ``bottleneck`` is then
the aligned map, the one the decoder sees.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from monai.networks.blocks import Convolution
from torch import nn

from .feature_alignment import FeatureAlignment


#: norm names besides MONAI's: an instance norm with learnable per-channel scale and shift (MONAI's
#: "instance" has none), e.g. for FedBN, whose local layers are the normalisation layers' entries
NORM_ALIASES = {"instance_affine": ("instance", {"affine": True})}


def resolve_norm(norm):
    """A MONAI norm spec from ``norm`` (a MONAI name, ``(name, args)`` or a name of :data:`NORM_ALIASES`)."""
    if isinstance(norm, str) and norm in NORM_ALIASES:
        return NORM_ALIASES[norm]
    return tuple(norm) if isinstance(norm, list) else norm


class _DoubleConv(nn.Sequential):
    """conv-norm-act twice; optional dropout after the first (used by MC-dropout uncertainty)."""

    def __init__(self, spatial_dims: int, cin: int, cout: int, norm: str, act: str, dropout: float):
        super().__init__(
            Convolution(spatial_dims, cin, cout, kernel_size=3, norm=norm, act=act, dropout=dropout),
            Convolution(spatial_dims, cout, cout, kernel_size=3, norm=norm, act=act),
        )


class FeatureUNet(nn.Module):
    """U-Net with skip connections and named intermediate features.

    Args:
        spatial_dims: 2 for images, 3 for volumes.
        in_channels: input channels (3 for RGB fundus/endoscopy).
        out_channels: number of classes (2 = background/foreground, softmax head).
        channels: feature widths per level, e.g. (16, 32, 64, 128, 256) — about 1.9 M parameters in 2D.
        norm: MONAI norm name ("instance", "batch", ...), ``[name, {args}]``, or "instance_affine"
            (instance norm with learnable scale and shift).
        act: MONAI activation name.
        dropout: dropout rate inside the bottleneck and decoder blocks (0 disables; MC-dropout needs > 0).
        init_seed: if given, the initial weights depend only on this seed (the global RNG is left
            untouched), so the server's persistor and every site build the same round-0 model.
        feature_alignment: add PathFL's bottleneck ``FeatureAlignment`` layer (its moments are buffers in
            the ``state_dict``).

    Input ``(B, in_channels, H, W)`` with H, W divisible by ``2 ** (len(channels) - 1)``;
    output logits ``(B, out_channels, H, W)``.
    """

    def __init__(
        self,
        spatial_dims: int = 2,
        in_channels: int = 3,
        out_channels: int = 2,
        channels: Sequence[int] = (16, 32, 64, 128, 256),
        norm: str = "instance",
        act: str = "relu",
        dropout: float = 0.0,
        init_seed: Optional[int] = None,
        feature_alignment: bool = False,
    ):
        super().__init__()
        # constructor arguments stored under their own names: NVFlare's job export reads them back
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.norm = norm
        norm = resolve_norm(norm)
        self.act = act
        self.dropout = dropout
        self.init_seed = init_seed
        self.feature_alignment = bool(feature_alignment)
        if init_seed is None:
            self._build(spatial_dims, in_channels, out_channels, channels, norm, act, dropout)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(init_seed))
                self._build(spatial_dims, in_channels, out_channels, channels, norm, act, dropout)

    def _build(self, spatial_dims, in_channels, out_channels, channels, norm, act, dropout) -> None:
        if len(channels) < 2:
            raise ValueError(f"channels needs at least two levels, got {channels}")
        self.spatial_dims = spatial_dims
        self.channels = [int(c) for c in channels]
        self.depth = len(self.channels) - 1
        pool = nn.MaxPool2d if spatial_dims == 2 else nn.MaxPool3d
        up = nn.ConvTranspose2d if spatial_dims == 2 else nn.ConvTranspose3d
        head = nn.Conv2d if spatial_dims == 2 else nn.Conv3d

        encoders: List[nn.Module] = []
        cin = in_channels
        for c in self.channels[:-1]:
            encoders.append(_DoubleConv(spatial_dims, cin, c, norm, act, 0.0))
            cin = c
        self.encoders = nn.ModuleList(encoders)
        self.pool = pool(2)
        self.bottleneck = _DoubleConv(spatial_dims, self.channels[-2], self.channels[-1], norm, act, dropout)

        ups: List[nn.Module] = []
        decoders: List[nn.Module] = []
        for i in range(self.depth - 1, -1, -1):  # deepest decoder first
            ups.append(up(self.channels[i + 1], self.channels[i], kernel_size=2, stride=2))
            decoders.append(_DoubleConv(spatial_dims, 2 * self.channels[i], self.channels[i], norm, act, dropout))
        self.ups = nn.ModuleList(ups)
        self.decoders = nn.ModuleList(decoders)
        self.head = head(self.channels[0], out_channels, kernel_size=1)
        # parameter-free, so the initial weights are the same with or without it
        self.bottleneck_alignment = FeatureAlignment() if self.feature_alignment else nn.Identity()

    @property
    def feature_names(self) -> List[str]:
        names = [f"enc{i}" for i in range(self.depth)] + ["bottleneck"]
        names += [f"dec{i}" for i in range(self.depth - 1, -1, -1)] + ["decoder_last"]
        return names

    def _run(self, x: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        feats: Dict[str, torch.Tensor] = {}
        skips: List[torch.Tensor] = []
        level = 0
        for enc in self.encoders:
            x = enc(x)
            feats["enc" + str(level)] = x
            skips.append(x)
            x = self.pool(x)
            level += 1
        x = self.bottleneck_alignment(self.bottleneck(x))
        feats["bottleneck"] = x
        level = self.depth - 1
        for up, dec in zip(self.ups, self.decoders):
            x = up(x)
            x = dec(torch.cat([skips[level], x], dim=1))
            feats["dec" + str(level)] = x
            level -= 1
        feats["decoder_last"] = x
        return self.head(x), feats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W) -> (B, C_out, H, W)`` logits."""
        return self._run(x)[0]

    @torch.jit.unused
    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """Logits plus the named feature maps described in the module docstring."""
        return self._run(x)
