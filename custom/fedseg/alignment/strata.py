"""The strata (layer groups) of ``FeatureUNet`` that PathFL's SSA aggregates separately, and their outputs.

For a U-Net with ``L = len(channels)`` levels (``depth = L - 1``) the strata are, input to output:
``enc0 .. enc{depth-1}`` (encoder blocks), ``bottleneck``, ``dec{depth-1} .. dec0`` (each decoder block with
the up step that feeds it: the transposed convolution, or in the ``three_conv_nearest`` variant the 3x3
reduction, nearest upsampling and 1x1 projection) and ``head`` (the 1x1 classifier). Every parameter and buffer
belongs to exactly one stratum, except the ``FeatureAlignment`` moments (``bottleneck_alignment.*``), which
the server sets rather than averages (stratum ``None``).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch import nn


def stratum_names(depth: int) -> List[str]:
    """Stratum names in forward order for a U-Net of ``depth`` down-sampling steps."""
    return [f"enc{i}" for i in range(depth)] + ["bottleneck"] + [f"dec{i}" for i in range(depth - 1, -1, -1)] + ["head"]


def stratum_of(name: str, depth: int) -> Optional[str]:
    """The stratum of the ``state_dict`` entry ``name`` (``None`` for the alignment moments).

    Raises:
        ValueError: a name that is not part of ``FeatureUNet``.
    """
    parts = name.split(".")
    if parts[0] == "encoders":
        return f"enc{int(parts[1])}"
    if parts[0] == "bottleneck":
        return "bottleneck"
    if parts[0] in ("ups", "decoders"):
        # ups[k] / decoders[k] run deepest first: block k produces dec{depth-1-k}
        return f"dec{depth - 1 - int(parts[1])}"
    if parts[0] == "head":
        return "head"
    if parts[0] == "bottleneck_alignment":
        return None
    raise ValueError(f"{name!r} is not a FeatureUNet parameter; SSA needs the bundle's FeatureUNet")


def stratum_outputs(model: nn.Module, inputs: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``{stratum: output}`` of ``model`` (a ``FeatureUNet``) on ``inputs`` ``(B, C_in, H, W)``: each block's
    output map, and the logits for ``head``."""
    logits, feats = model.forward_features(inputs)
    outputs = {name: feats[name] for name in stratum_names(model.depth) if name != "head"}
    outputs["head"] = logits
    return outputs
