"""A 2D/3D U-Net whose intermediate feature maps are addressable by name.

Several methods need more than logits: FVAC aligns foreground/background means of a decoder map,
PathFL and FedEFM work on encoder features, GraphFedSeg's MC-dropout option needs dropout layers.
``forward`` stays a plain ``x -> logits`` map (TorchScript-exportable, usable by MONAI inferers);
``forward_features`` returns the same logits plus a dict of named maps.

Two layouts (``variant``, :data:`UNET_VARIANTS`), with the same module and feature names so every method
works with either:

* ``"two_conv_transpose"`` (default): blocks of two conv-norm-act units; each up step is a stride-2 transposed
  convolution ``c_{i+1} -> c_i``; decoder block ``2 c_i -> c_i``.
* ``"three_conv_nearest"``: the U-Net of the FedEvi authors' code (about 3.2 M parameters at widths 16..256
  in 2D). Encoder and bottleneck blocks are conv-norm, then conv-norm-act twice; up step ``k`` (into level
  ``i``) is [3x3 conv-norm-act ``2 c_{i+1} -> c_{i+1}``, except on the deepest step], nearest x2 upsampling,
  1x1 conv-norm-act ``c_{i+1} -> c_i``; decoder block one 3x3 conv-norm-act ``2 c_i -> 2 c_i`` on
  ``[skip, up]``; Kaiming-normal (fan-out) conv weights.

Feature names (``L = len(channels)``, ``c_i = channels[i]``, level 0 is full resolution; 3D adds a leading D
axis scaled like H and W):
    ``enc0 .. enc{L-2}``  encoder block outputs, shape (B, c_i, H/2^i, W/2^i)
    ``bottleneck``        deepest map, shape (B, c_{L-1}, H/2^(L-1), W/2^(L-1))
    ``dec{L-2} .. dec0``  decoder block outputs at the resolution of ``enc{i}``: (B, c_i, H/2^i, W/2^i);
                          ``"three_conv_nearest"``: (B, 2 c_i, H/2^i, W/2^i)
    ``decoder_last``      alias of ``dec0``: the last decoder map before the 1x1 head, (B, c_0, H, W);
                          ``"three_conv_nearest"``: (B, 2 c_0, H, W)

With ``feature_alignment=True`` the bottleneck output passes through a ``FeatureAlignment`` layer
(``bottleneck_alignment``, PathFL's AFA; identity until the server activates it); ``bottleneck`` is then
the aligned map, the one the decoder sees.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from monai.networks.blocks import Convolution
from torch import nn

from .feature_alignment import FeatureAlignment


#: ``FeatureUNet(variant=...)`` choices, see the module notes; the first is the default
UNET_VARIANTS = ("two_conv_transpose", "three_conv_nearest")
#: ``FeatureUNet(init=...)`` choices: PyTorch's default initialisation, or Kaiming-normal (fan-out, ReLU) weights of
#: every convolution (not the transposed ones), biases and norms as PyTorch makes them. ``None`` = the variant's own
#: (``two_conv_transpose``: pytorch; ``three_conv_nearest``: kaiming_fan_out, as the reference code)
INIT_SCHEMES = ("pytorch", "kaiming_fan_out")
VARIANT_INIT = {"two_conv_transpose": "pytorch", "three_conv_nearest": "kaiming_fan_out"}

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


class _TripleConv(nn.Sequential):
    """conv-norm, then conv-norm-act twice ("three_conv_nearest"); optional dropout after the first."""

    def __init__(self, spatial_dims: int, cin: int, cout: int, norm: str, act: str, dropout: float):
        super().__init__(
            Convolution(spatial_dims, cin, cout, kernel_size=3, norm=norm, act=None, dropout=dropout),
            Convolution(spatial_dims, cout, cout, kernel_size=3, norm=norm, act=act),
            Convolution(spatial_dims, cout, cout, kernel_size=3, norm=norm, act=act),
        )


class _NearestUp(nn.Sequential):
    """Up step of "three_conv_nearest": ``(B, cin, *S) -> (B, cout, *2S)``.

    ``reduce`` (3x3 conv-norm-act ``cin -> cin // 2``, only when ``reduce``: the input is a previous decoder
    block's ``2 c`` map), ``upsample`` (nearest x2), ``project`` (1x1 conv-norm-act to ``cout``).
    """

    def __init__(self, spatial_dims: int, cin: int, cout: int, norm: str, act: str, reduce: bool):
        layers: "OrderedDict[str, nn.Module]" = OrderedDict()
        if reduce:
            layers["reduce"] = Convolution(spatial_dims, cin, cin // 2, kernel_size=3, norm=norm, act=act)
            cin //= 2
        layers["upsample"] = nn.Upsample(scale_factor=2, mode="nearest")
        layers["project"] = Convolution(spatial_dims, cin, cout, kernel_size=1, norm=norm, act=act)
        super().__init__(layers)


class FeatureUNet(nn.Module):
    """U-Net with skip connections and named intermediate features.

    Args:
        spatial_dims: 2 for images, 3 for volumes.
        in_channels: input channels (3 for RGB fundus/endoscopy).
        out_channels: number of classes (2 = background/foreground, softmax head).
        channels: feature widths per level, e.g. (16, 32, 64, 128, 256) — in 2D with 3 input channels about
            1.9 M parameters for "two_conv_transpose", 3.18 M for "three_conv_nearest".
        norm: MONAI norm name ("instance", "batch", ...), ``[name, {args}]``, or "instance_affine"
            (instance norm with learnable scale and shift).
        act: MONAI activation name.
        dropout: dropout rate inside the bottleneck and decoder blocks (0 disables; MC-dropout needs > 0).
        init_seed: if given, the initial weights depend only on this seed (the global RNG is left
            untouched), so the server's persistor and every site build the same round-0 model.
        feature_alignment: add PathFL's bottleneck ``FeatureAlignment`` layer (its moments are buffers in
            the ``state_dict``).
        variant: the layout, one of :data:`UNET_VARIANTS` (module notes). Decoder maps and ``decoder_last``
            have ``2 * channels[i]`` channels in "three_conv_nearest".
        init: the initial weights, one of :data:`INIT_SCHEMES`; None = the variant's own (:data:`VARIANT_INIT`).

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
        variant: str = UNET_VARIANTS[0],
        init: Optional[str] = None,
    ):
        super().__init__()
        if variant not in UNET_VARIANTS:
            raise ValueError(f"variant must be one of {UNET_VARIANTS}, got {variant!r}")
        if init is not None and init not in INIT_SCHEMES:
            raise ValueError(f"init must be one of {INIT_SCHEMES} or None (the variant's own), got {init!r}")
        # constructor arguments stored under their own names: NVFlare's job export reads them back
        self.variant = variant
        self.init = init
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.norm = norm
        norm = resolve_norm(norm)
        self.act = act
        self.dropout = dropout
        self.init_seed = init_seed
        self.feature_alignment = bool(feature_alignment)
        if init_seed is None:
            self._build_and_initialise(spatial_dims, in_channels, out_channels, channels, norm, act, dropout)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(init_seed))
                self._build_and_initialise(spatial_dims, in_channels, out_channels, channels, norm, act, dropout)

    def _build_and_initialise(self, *args) -> None:
        self._build(*args)
        if (self.init or VARIANT_INIT[self.variant]) == "kaiming_fan_out":
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.Conv3d)):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _build(self, spatial_dims, in_channels, out_channels, channels, norm, act, dropout) -> None:
        if len(channels) < 2:
            raise ValueError(f"channels needs at least two levels, got {channels}")
        self.spatial_dims = spatial_dims
        self.channels = [int(c) for c in channels]
        self.depth = len(self.channels) - 1
        pool = nn.MaxPool2d if spatial_dims == 2 else nn.MaxPool3d
        head = nn.Conv2d if spatial_dims == 2 else nn.Conv3d
        if self.variant == "three_conv_nearest":
            self._build_three_conv_nearest(spatial_dims, in_channels, out_channels, norm, act, dropout, pool(2), head)
            return
        up = nn.ConvTranspose2d if spatial_dims == 2 else nn.ConvTranspose3d

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

    def _build_three_conv_nearest(self, spatial_dims, in_channels, out_channels, norm, act, dropout, pool, head) -> None:
        c = self.channels
        encoders: List[nn.Module] = []
        cin = in_channels
        for width in c[:-1]:
            encoders.append(_TripleConv(spatial_dims, cin, width, norm, act, 0.0))
            cin = width
        self.encoders = nn.ModuleList(encoders)
        self.pool = pool
        self.bottleneck = _TripleConv(spatial_dims, c[-2], c[-1], norm, act, dropout)

        ups: List[nn.Module] = []
        decoders: List[nn.Module] = []
        for i in range(self.depth - 1, -1, -1):  # deepest decoder first
            deepest = i == self.depth - 1  # fed by the bottleneck (c_{i+1}); the others by a 2 c_{i+1} decoder map
            cin = c[i + 1] if deepest else 2 * c[i + 1]
            ups.append(_NearestUp(spatial_dims, cin, c[i], norm, act, reduce=not deepest))
            decoders.append(Convolution(spatial_dims, 2 * c[i], 2 * c[i], kernel_size=3, norm=norm, act=act, dropout=dropout))
        self.ups = nn.ModuleList(ups)
        self.decoders = nn.ModuleList(decoders)
        self.head = head(2 * c[0], out_channels, kernel_size=1)
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
