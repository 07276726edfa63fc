"""The downstream UNETR of the ``unetr_seg`` bundle, optionally initialised from a foundation checkpoint.

:class:`FoundationUNETR` (or its factory name ``build_unetr``) is the bundle's ``network_def``: with ``foundation_ckpt`` empty it builds a plain 2D
MONAI ``UNETR`` of the given width (training from scratch, or the network a fine-tuned checkpoint is
loaded into for evaluation and inference); with a path it reads the foundation ViT's weights from it
(``FL_global_model.pt`` of a FedEFM / FedAvg classification job, a ``{"model": state_dict}`` file or a
bare ``ViTClassifier`` state_dict) and copies them into the UNETR's encoder through
:func:`fedseg.foundation.networks.unetr_from_foundation`.

The bundle's architecture variables (``hidden_size``, ``mlp_dim``, ``num_heads``, ``in_channels``)
describe the network in both cases, so a checkpoint fine-tuned from a foundation loads into the plain
network the inference config builds. A foundation whose tensors disagree with them is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Optional, Sequence, Union

import torch
from monai.networks.nets import UNETR

from fedseg.foundation.networks import UNETR_PATCH, foundation_shape, image_size_pair, unetr_from_foundation

logger = logging.getLogger(__name__)

__all__ = ["FoundationUNETR", "build_unetr", "load_foundation_state"]


def load_foundation_state(path: Union[str, os.PathLike]) -> dict:
    """The ViT weights in ``path``: the ``"model"`` entry of an NVFlare / fedseg checkpoint or the file's
    own state_dict (loaded with ``weights_only``: a checkpoint from elsewhere is untrusted input)."""
    from fedseg.inference import load_state_dict

    return load_state_dict(path)


class FoundationUNETR(UNETR):
    """A 2D ``UNETR`` ``(B, in_channels, H, W) -> (B, out_channels, H, W)`` (``H, W = img_size``, multiples
    of 16), its ViT encoder loaded from ``foundation_ckpt`` when one is given.

    A class rather than a factory function: NVFlare writes a job's initial model into the server config as a class
    path plus the constructor arguments it finds as attributes (stored below under their own names). The server
    builds it from that config, so the foundation checkpoint is read once, at the server, into the initial global
    model.

    Args:
        in_channels, out_channels, img_size: input channels, segmentation classes, input size.
        hidden_size, mlp_dim, num_heads, qkv_bias: the ViT encoder (12 blocks, patch 16; fixed by MONAI).
        feature_size, norm_name, dropout_rate: decoder settings.
        foundation_ckpt: path of the foundation checkpoint; ``None`` or ``""`` = random encoder.
        partial_depth: accept a foundation with fewer than 12 blocks (the ``tiny`` profile): its blocks
            fill the first UNETR blocks, the rest stay random.
        init_seed: seed of the fresh weights (global RNG untouched).
    Raises:
        FileNotFoundError: ``foundation_ckpt`` does not exist.
        ValueError: the foundation's channels, width or MLP width differ from the arguments, or
            :func:`~fedseg.foundation.networks.unetr_from_foundation` refuses it (patch, depth, size).
    """

    def __init__(
        self,
        in_channels: int = 1,
        out_channels: int = 2,
        img_size: Union[int, Sequence[int]] = 96,
        hidden_size: int = 96,
        mlp_dim: int = 384,
        num_heads: int = 3,
        feature_size: int = 16,
        norm_name: str = "instance",
        dropout_rate: float = 0.0,
        qkv_bias: bool = False,
        foundation_ckpt: Optional[Union[str, os.PathLike]] = None,
        partial_depth: bool = False,
        init_seed: Optional[int] = None,
    ):
        size = image_size_pair(img_size)
        if any(s % UNETR_PATCH for s in size):
            raise ValueError(f"UNETR input sides must be multiples of {UNETR_PATCH}, got {size}")
        unetr_args = dict(in_channels=in_channels, out_channels=out_channels, img_size=size, feature_size=feature_size,
                          hidden_size=hidden_size, mlp_dim=mlp_dim, num_heads=num_heads, proj_type="conv",
                          norm_name=norm_name, dropout_rate=dropout_rate, spatial_dims=2, qkv_bias=qkv_bias)
        if not foundation_ckpt:
            with _seeded(init_seed):
                super().__init__(**unetr_args)
        else:
            loaded = _foundation_unetr(foundation_ckpt, unetr_args, partial_depth, init_seed)
            # the module structure only: built on the meta device (no memory, no initialisation, no draw from the
            # global RNG), then given storage and every tensor of ``loaded`` (UNETR has no buffer outside its state dict)
            with torch.device("meta"):
                super().__init__(**unetr_args)
            self.to_empty(device="cpu")
            self.load_state_dict(loaded.state_dict())
        # the constructor arguments, under their own names, for NVFlare's job serialisation
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.img_size = list(size)
        self.mlp_dim, self.num_heads, self.feature_size = int(mlp_dim), int(num_heads), int(feature_size)
        self.norm_name, self.dropout_rate, self.qkv_bias = norm_name, float(dropout_rate), bool(qkv_bias)
        self.foundation_ckpt = str(foundation_ckpt) if foundation_ckpt else None
        self.partial_depth, self.init_seed = bool(partial_depth), init_seed


#: the bundle's ``network_def`` as a factory: the same arguments, the same network
build_unetr = FoundationUNETR


@contextlib.contextmanager
def _seeded(init_seed: Optional[int]):
    """Draw the weights built inside from ``init_seed`` with the global RNG left untouched (None: from the global RNG)."""
    if init_seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(init_seed))
        yield


def _foundation_unetr(foundation_ckpt: Union[str, os.PathLike], unetr_args: dict, partial_depth: bool,
                      init_seed: Optional[int]) -> UNETR:
    """The UNETR of ``unetr_args`` with its encoder from the foundation in ``foundation_ckpt`` (checked against them)."""
    state = load_foundation_state(foundation_ckpt)
    arch = foundation_shape(state)
    wanted = {k: unetr_args[k] for k in ("in_channels", "hidden_size", "mlp_dim", "qkv_bias")}
    differ = {k: (arch[k], v) for k, v in wanted.items() if arch[k] != v}
    if differ:
        raise ValueError(
            f"foundation {foundation_ckpt} does not fit the configured UNETR: "
            + ", ".join(f"{k} {a} in the checkpoint vs {b} configured" for k, (a, b) in differ.items())
            + "; set these bundle variables to the foundation's"
        )
    unetr, loaded = unetr_from_foundation(
        state, out_channels=unetr_args["out_channels"], img_size=unetr_args["img_size"],
        num_heads=unetr_args["num_heads"], feature_size=unetr_args["feature_size"], norm_name=unetr_args["norm_name"],
        dropout_rate=unetr_args["dropout_rate"], partial_depth=partial_depth, init_seed=init_seed,
    )
    logger.info("UNETR encoder: %d tensors loaded from %s (depth %s)", len(loaded), foundation_ckpt, arch["depth"])
    return unetr
