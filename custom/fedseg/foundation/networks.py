"""FedEFM's backbones: a 2D ViT classifier exposing its dense patch tokens, and the hand-over of its
encoder to a MONAI ``UNETR`` for the downstream segmentation.

Token layout: an image of ``H x W`` with patch ``p`` gives ``N = (H / p) * (W / p)`` patch tokens in
row-major patch order (token ``r * (W / p) + c`` is patch row ``r``, column ``c``). The class token is
prepended inside the ViT and read by the head; ``forward_features`` returns the patch tokens only,
after the final LayerNorm (the same normalised features the head sees and the UNETR's deepest skip
uses), because the EMD compares spatial nodes and the class token is not one.

Input standardisation: the classifier maps its ``[0, 1]`` input to ``(x - input_mean) / input_std``
(fixed, the same for every image and silo, so a scanner's brightness stays a cue) before the patch
embedding. Without it the tiny ViT trained from scratch stays at chance on the built-in X-ray silos (the
constant offset of the raw input swamps the patch embedding); with it the same run learns
(benchmarks/fedefm/vit_from_scratch.py). The UNETR hand-over folds the standardisation into the patch-embedding
convolution, so the UNETR takes the ``[0, 1]`` images of the segmentation pipeline unchanged.

UNETR constraints (MONAI 1.6.1, checked in its source): its ViT always has 12 blocks, patch 16,
learnable position embeddings and no class token or head; its skips tap blocks 3, 6 and 9. A
foundation ViT therefore transfers whole only with patch 16, 12 layers and the same image size.
"""

from __future__ import annotations

import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from monai.networks.nets import UNETR, ViT
from torch import nn

#: the UNETR's ViT depth and patch size, fixed by MONAI
UNETR_DEPTH = 12
UNETR_PATCH = 16
#: the UNETR's patch-embedding convolution (kernel = stride = patch, no padding)
PATCH_CONV = "vit.patch_embedding.patch_embeddings"

#: the classifier's fixed input standardisation ``(x - mean) / std`` of ``[0, 1]`` images
INPUT_MEAN = 0.5
INPUT_STD = 0.25

#: ``tiny``: CPU tests and quick runs (4 blocks: only blocks 0-3 of a UNETR can be initialised from it);
#: ``small``: the smallest CPU profile whose every block transfers to a UNETR (12 thin blocks);
#: ``paper``: ViT-B/16 at 224 (the paper's backbone)
PROFILES: Dict[str, Dict[str, int]] = {
    "tiny": dict(img_size=96, patch_size=16, hidden_size=96, mlp_dim=384, num_layers=4, num_heads=3),
    "small": dict(img_size=96, patch_size=16, hidden_size=96, mlp_dim=384, num_layers=12, num_heads=3),
    "paper": dict(img_size=224, patch_size=16, hidden_size=768, mlp_dim=3072, num_layers=12, num_heads=12),
}


def image_size_pair(size: Union[int, Sequence[int]]) -> Tuple[int, int]:
    """A 2D image size as ``(H, W)`` ints: ``96 -> (96, 96)``, ``(96, 128) -> (96, 128)``; ValueError for other lengths."""
    pair = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(pair) != 2:
        raise ValueError(f"a 2D image size needs two sides, got {size}")
    return pair  # type: ignore[return-value]


class ViTClassifier(nn.Module):
    """2D MONAI ``ViT`` with a linear classification head on the class token.

    Args:
        in_channels: image channels.
        num_classes: classes of the (global) label space.
        img_size: ``int`` or ``(H, W)``, each divisible by ``patch_size``.
        patch_size: patch side (16 for a UNETR hand-over).
        hidden_size, mlp_dim, num_layers, num_heads: transformer width, MLP width, depth, heads.
        dropout_rate: dropout inside the transformer.
        qkv_bias: bias on the attention's qkv projection (MONAI's default: none).
        init_seed: if given, the initial weights depend only on this seed (the global RNG is left
            untouched), so the server and every silo build the same round-0 model.
        input_mean, input_std: the fixed standardisation ``(x - input_mean) / input_std`` applied to the
            input before the patch embedding (see the module docstring).

    The head is a plain ``Linear``: MONAI's default ends it with ``tanh``, which would bound the logits
    to ``[-1, 1]`` and flatten the softened distributions the distillation compares.
    Input ``(B, in_channels, H, W)``; logits ``(B, num_classes)``; tokens ``(B, N, hidden_size)``.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 2,
        img_size: Union[int, Sequence[int]] = 96,
        patch_size: int = 16,
        hidden_size: int = 96,
        mlp_dim: int = 384,
        num_layers: int = 4,
        num_heads: int = 3,
        dropout_rate: float = 0.0,
        qkv_bias: bool = False,
        init_seed: Optional[int] = None,
        input_mean: float = INPUT_MEAN,
        input_std: float = INPUT_STD,
    ):
        super().__init__()
        if not input_std > 0:
            raise ValueError(f"input_std must be positive, got {input_std}")
        # constructor arguments stored under their own names: NVFlare's job export reads them back
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.img_size = image_size_pair(img_size)
        self.patch_size = patch_size
        self.hidden_size = hidden_size
        self.mlp_dim = mlp_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.dropout_rate = dropout_rate
        self.qkv_bias = qkv_bias
        self.init_seed = init_seed
        self.input_mean = float(input_mean)
        self.input_std = float(input_std)
        if any(s % patch_size for s in self.img_size):
            raise ValueError(f"image size {self.img_size} is not a multiple of the patch size {patch_size}")
        self.grid = (self.img_size[0] // patch_size, self.img_size[1] // patch_size)
        self.num_tokens = self.grid[0] * self.grid[1]
        if init_seed is None:
            self._build()
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(init_seed))
                self._build()

    def _build(self) -> None:
        self.vit = ViT(
            in_channels=self.in_channels,
            img_size=self.img_size,
            patch_size=self.patch_size,
            hidden_size=self.hidden_size,
            mlp_dim=self.mlp_dim,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            proj_type="conv",
            pos_embed_type="learnable",
            classification=True,
            num_classes=self.num_classes,
            dropout_rate=self.dropout_rate,
            spatial_dims=2,
            post_activation=None,  # anything but "Tanh" gives a bare Linear head
            qkv_bias=self.qkv_bias,
        )

    def forward_features(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(B, C, H, W) -> (logits (B, num_classes), tokens (B, N, hidden_size))``.

        The ViT's own forward on the standardised input, unrolled so the normalised patch tokens can be
        returned; the logits are exactly ``self.vit((x - input_mean) / input_std)[0]``.
        """
        vit = self.vit
        h = vit.patch_embedding((x - self.input_mean) / self.input_std)
        h = torch.cat([vit.cls_token.expand(h.shape[0], -1, -1), h], dim=1)
        for block in vit.blocks:
            h = block(h)
        h = vit.norm(h)
        return vit.classification_head(h[:, 0]), h[:, 1:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W) -> (B, num_classes)`` logits."""
        return self.forward_features(x)[0]


def build_vit(
    profile: str,
    in_channels: int,
    num_classes: int,
    img_size: Optional[Union[int, Sequence[int]]] = None,
    **overrides,
) -> ViTClassifier:
    """A :class:`ViTClassifier` from a named profile (:data:`PROFILES`); ``img_size=None`` keeps the
    profile's, ``overrides`` replace any other constructor argument (e.g. ``init_seed``)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown ViT profile {profile!r}; choose from {sorted(PROFILES)}")
    config = {**PROFILES[profile], **overrides}
    if img_size is not None:
        config["img_size"] = img_size
    return ViTClassifier(in_channels=in_channels, num_classes=num_classes, **config)


# ------------------------------------------------------------------------------ UNETR hand-over
_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def unetr_key_map(vit_state_dict: Mapping[str, torch.Tensor]) -> Tuple[Dict[str, str], List[str]]:
    """Which foundation tensor goes to which UNETR tensor.

    Source keys are a :class:`ViTClassifier`'s (``vit.<k>``) or a bare MONAI ``ViT``'s (``<k>``). Rules:

    ============================================  ===========================================
    foundation key                                UNETR key
    ============================================  ===========================================
    ``[vit.]patch_embedding.position_embeddings``  ``vit.patch_embedding.position_embeddings``
    ``[vit.]patch_embedding.patch_embeddings.*``   ``vit.patch_embedding.patch_embeddings.*``
    ``[vit.]blocks.{i}.*`` (every tensor)          ``vit.blocks.{i}.*``
    ``[vit.]norm.{weight,bias}``                   ``vit.norm.{weight,bias}``
    ``[vit.]cls_token``                            dropped (UNETR's ViT has no class token)
    ``[vit.]classification_head.*``                dropped (nor a head)
    ============================================  ===========================================

    Returns:
        ``(mapping source -> target, dropped source keys)``.
    Raises:
        ValueError: a key that fits no rule (not a ViT state dict).
    """
    mapping: Dict[str, str] = {}
    dropped: List[str] = []
    for key in vit_state_dict:
        k = key[len("vit."):] if key.startswith("vit.") else key
        if k == "cls_token" or k.startswith("classification_head."):
            dropped.append(key)
        elif k.startswith("patch_embedding.") or _BLOCK.match(k) or k in ("norm.weight", "norm.bias"):
            mapping[key] = "vit." + k
        else:
            raise ValueError(f"{key!r} is not a MONAI ViT tensor; pass a ViTClassifier's or ViT's state_dict")
    return mapping, dropped


def foundation_shape(state: Mapping[str, torch.Tensor]) -> Dict[str, object]:
    """The architecture of a ViT read off its ``state_dict`` (keys with or without the ``vit.`` prefix).

    Returns:
        ``{"in_channels", "hidden_size", "patch": (ph, pw), "mlp_dim", "depth", "qkv_bias", "tokens"}``, ``tokens``
        being the position embedding's length: the number of patch tokens (the class token has none).

    Raises:
        ValueError: the state has no 2D convolutional patch embedding.
    """
    strip = {(k[4:] if k.startswith("vit.") else k): v for k, v in state.items()}
    conv = strip.get("patch_embedding.patch_embeddings.weight")
    if conv is None or conv.dim() != 4:
        raise ValueError("the foundation needs a 2D 'conv' patch embedding (patch_embedding.patch_embeddings.weight)")
    depths = {int(m.group(1)) for m in map(_BLOCK.match, strip) if m}
    return dict(
        in_channels=int(conv.shape[1]),
        hidden_size=int(conv.shape[0]),
        patch=tuple(int(s) for s in conv.shape[2:]),
        mlp_dim=int(strip["blocks.0.mlp.linear1.weight"].shape[0]),
        depth=max(depths) + 1 if depths else 0,
        qkv_bias="blocks.0.attn.qkv.bias" in strip,
        tokens=int(strip["patch_embedding.position_embeddings"].shape[1]),
    )


def unetr_from_foundation(
    vit_state_dict: Mapping[str, torch.Tensor],
    out_channels: int,
    img_size: Union[int, Sequence[int]],
    num_heads: int,
    feature_size: int = 16,
    norm_name: str = "instance",
    dropout_rate: float = 0.0,
    partial_depth: bool = False,
    init_seed: Optional[int] = None,
    input_mean: float = INPUT_MEAN,
    input_std: float = INPUT_STD,
) -> Tuple[UNETR, List[str]]:
    """A 2D MONAI ``UNETR`` whose ViT encoder starts from the foundation's weights.

    Every encoder tensor is copied as it is except the patch-embedding convolution, which takes the
    classifier's input standardisation in (:func:`fold_input_standardisation`): the UNETR reads ``[0, 1]``
    images and its patch tokens equal the classifier's on the same images.

    Channels, width, MLP width and qkv bias are read off the tensors; ``num_heads`` cannot be (the
    attention's shapes do not depend on it) and must match the foundation's. The decoder is freshly
    initialised. See :func:`unetr_key_map` for the key mapping.

    Args:
        vit_state_dict: a :class:`ViTClassifier`'s (or bare MONAI ``ViT``'s) ``state_dict``.
        out_channels: segmentation classes.
        img_size: the UNETR's input size; with patch 16 it must give the foundation's token count.
        num_heads: the foundation's attention heads.
        feature_size, norm_name, dropout_rate: UNETR decoder settings.
        partial_depth: allow a foundation shallower than 12 blocks: its blocks initialise the UNETR's
            first ones and the rest stay random (the ``tiny`` profile). Off by default, because the
            UNETR's skips at blocks 6 and 9 and its final output would then start untrained.
        init_seed: seed for the UNETR's fresh weights (global RNG untouched).
        input_mean, input_std: the foundation classifier's input standardisation (:class:`ViTClassifier`).
    Returns:
        ``(unetr, loaded)``: the model and the UNETR keys that were copied from the foundation.
    Raises:
        ValueError: patch not 16, an input side not a multiple of 16, deeper than 12 blocks (or shallower without ``partial_depth``), or any
            mapped tensor whose shape differs (e.g. position embeddings of another image size).
    """
    arch = foundation_shape(vit_state_dict)
    if arch["patch"] != (UNETR_PATCH, UNETR_PATCH):
        raise ValueError(f"UNETR uses {UNETR_PATCH}x{UNETR_PATCH} patches; the foundation's are {arch['patch']}")
    depth = int(arch["depth"])  # type: ignore[arg-type]
    if depth > UNETR_DEPTH or (depth < UNETR_DEPTH and not partial_depth):
        raise ValueError(
            f"UNETR's ViT has {UNETR_DEPTH} blocks; the foundation has {depth}"
            + ("" if depth > UNETR_DEPTH else " (pass partial_depth=True to load them into the first blocks)")
        )
    size = image_size_pair(img_size)
    if any(s % UNETR_PATCH for s in size):
        raise ValueError(f"UNETR input sides must be multiples of {UNETR_PATCH}, got {size}")

    def build() -> UNETR:
        return UNETR(
            in_channels=arch["in_channels"],
            out_channels=out_channels,
            img_size=size,
            feature_size=feature_size,
            hidden_size=arch["hidden_size"],
            mlp_dim=arch["mlp_dim"],
            num_heads=num_heads,
            proj_type="conv",
            norm_name=norm_name,
            dropout_rate=dropout_rate,
            spatial_dims=2,
            qkv_bias=arch["qkv_bias"],
        )

    if init_seed is None:
        unetr = build()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(init_seed))
            unetr = build()

    mapping, _ = unetr_key_map(vit_state_dict)
    target = unetr.state_dict()
    problems = []
    for src, dst in mapping.items():
        if dst not in target:
            problems.append(f"{src} -> {dst}: no such UNETR tensor")
        elif tuple(vit_state_dict[src].shape) != tuple(target[dst].shape):
            problems.append(f"{src} {tuple(vit_state_dict[src].shape)} -> {dst} {tuple(target[dst].shape)}")
            if dst.endswith("position_embeddings"):
                grid = tuple(s // UNETR_PATCH for s in size)
                problems[-1] += (
                    f": the foundation has {arch['tokens']} patch tokens, a {size[0]}x{size[1]} UNETR input has "
                    f"{grid[0] * grid[1]}; build the UNETR at the foundation's image size"
                )
    if problems:
        raise ValueError("foundation weights do not fit the UNETR:\n  " + "\n  ".join(problems))
    loaded = {dst: vit_state_dict[src] for src, dst in mapping.items()}
    weight, bias = PATCH_CONV + ".weight", PATCH_CONV + ".bias"
    loaded[weight], loaded[bias] = fold_input_standardisation(loaded[weight], loaded[bias], input_mean, input_std)
    unetr.load_state_dict(loaded, strict=False)
    return unetr, sorted(loaded)


def fold_input_standardisation(
    weight: torch.Tensor, bias: torch.Tensor, mean: float, std: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Conv weights ``(W', b')`` with ``conv(x; W', b') == conv((x - mean) / std; W, b)``.

    Exact for a convolution without padding (every output sees only input pixels):
    ``W' = W / std``, ``b'_o = b_o - (mean / std) * sum(W_o)``. ``weight``: ``(out, in, kh, kw)``; ``bias``: ``(out,)``.
    """
    if not std > 0:
        raise ValueError(f"std must be positive, got {std}")
    return weight / std, bias - (mean / std) * weight.sum(dim=tuple(range(1, weight.dim())))
