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


# ------------------------------------------------------------------------------------------ any network
# A user's network has no named blocks: each layer with parameters or buffers of its own is a stratum (its entries
# are that layer's), its output read by a forward hook. Finer than FeatureUNet's blocks, the same rule for any net.
def layer_strata(model: nn.Module) -> List[str]:
    """Module paths of ``model``'s layers that own parameters or buffers, in ``named_modules()`` order (PathFL's
    alignment layer, whose moments the server sets, excluded)."""
    from fedseg.networks.feature_taps import ALIGNMENT_MODULE

    return [name for name, m in model.named_modules()
            if name and not name.startswith(ALIGNMENT_MODULE)
            and (any(True for _ in m.parameters(recurse=False)) or any(True for _ in m.buffers(recurse=False)))]


def network_strata(model: nn.Module) -> List[str]:
    """The strata of ``model`` in order: FeatureUNet's blocks (:func:`stratum_names`), else :func:`layer_strata`."""
    from fedseg.networks.feature_taps import has_native_features

    return stratum_names(model.depth) if has_native_features(model) else layer_strata(model)


def entry_stratum(model: nn.Module):
    """``state_dict name -> stratum`` of ``model`` (None: the alignment moments, which the server sets)."""
    from fedseg.networks.feature_taps import ALIGNMENT_MODULE, has_native_features

    if has_native_features(model):
        depth = model.depth
        return lambda name: stratum_of(name, depth)
    layers = set(layer_strata(model))

    def of(name: str) -> Optional[str]:
        if name.startswith(ALIGNMENT_MODULE + "."):
            return None
        owner = name.rsplit(".", 1)[0] if "." in name else ""
        if owner not in layers:
            raise ValueError(f"{name!r} is not an entry of a layer of {type(model).__name__}")
        return owner

    return of


def network_stratum_outputs(model: nn.Module, inputs: torch.Tensor) -> Dict[str, torch.Tensor]:
    """``{stratum: output}`` of any network on ``inputs`` ``(B, C_in, *spatial)`` (:func:`stratum_outputs` for
    FeatureUNet; forward hooks on every layer of :func:`layer_strata` otherwise, its last output when called twice)."""
    from fedseg.networks.feature_taps import has_native_features

    if has_native_features(model):
        return stratum_outputs(model, inputs)
    outputs: Dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())
    handles = []
    for name in layer_strata(model):
        def grab(module, args, out, name=name):
            outputs[name] = out[-1] if isinstance(out, (list, tuple)) else out
        handles.append(modules[name].register_forward_hook(grab))
    try:
        model(inputs)
    finally:
        for h in handles:
            h.remove()
    return outputs
