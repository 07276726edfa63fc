"""Feature maps, head and feature alignment of any network: what the feature-level methods need from a user's bundle.

The suite's own ``FeatureUNet`` names its maps (``forward_features``). A network from a user's MONAI bundle does not, so
the methods read it through forward hooks, by role:

* ``"bottleneck"`` -- the deepest feature map: the output of a named module (PathFL's AFA moments, MOON's
  representation, SSA's strata at the server). Defaults for MONAI's UNet, BasicUNet, SegResNet, FlexibleUNet, UNETR
  and SwinUNETR (:func:`default_bottleneck`); any other network names it with ``feature_layer``.
* ``"decoder_last"`` -- the last feature map before the logits: the *input* of the head (FVAC's FVDA).
* the head -- the module that produces the logits (FedRep's local layer): found from the structure (the last
  convolution or linear layer), or named with ``head_layer``.

``feature_layer`` (a module path from ``named_modules()``) replaces both roles' layer. The choice travels on the network
instance as plain attributes (``FEATURE_LAYER_ATTR``, ``HEAD_LAYER_ATTR``): they survive ``copy.deepcopy`` (frozen
global copies) and never enter the ``state_dict``, so the checkpoint stays loadable by the user's own bundle.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from fedseg.networks.feature_alignment import FeatureAlignment

__all__ = [
    "FEATURE_ROLES", "FEATURE_LAYER_ATTR", "HEAD_LAYER_ATTR", "ALIGNMENT_MODULE", "FeatureLayerError", "default_bottleneck",
    "feature_module_name", "network_features", "find_head_layer", "head_layer_name", "attach_feature_alignment", "tag_network",
    "has_native_features", "feature_module", "HEAD_TYPES",
]

#: the feature maps a method may ask for (the names FeatureUNet's ``forward_features`` also uses)
FEATURE_ROLES = ("bottleneck", "decoder_last")
#: instance attribute: the module path the job named with ``feature_layer`` (None: the network's default)
FEATURE_LAYER_ATTR = "fedseg_feature_layer"
#: instance attribute: the module path the job named with ``head_layer`` (None: found by a forward pass)
HEAD_LAYER_ATTR = "fedseg_head_layer"
#: the child module PathFL's AFA adds (the same ``state_dict`` prefix as FeatureUNet's, which the server writes)
ALIGNMENT_MODULE = "bottleneck_alignment"


class FeatureLayerError(ValueError):
    """A feature-level method on a network whose layer cannot be found; the message names ``feature_layer``."""


def has_native_features(model: nn.Module) -> bool:
    """The network names its own maps (``FeatureUNet.forward_features``)."""
    return callable(getattr(type(model), "forward_features", None))


def tag_network(model: nn.Module, feature_layer: Optional[str] = None, head_layer: Optional[str] = None) -> nn.Module:
    """Record the job's ``feature_layer`` / ``head_layer`` on ``model`` (checked to exist); returns ``model``.

    Raises:
        FeatureLayerError: a named layer is not a module of ``model``.
    """
    names = dict(model.named_modules())
    for option, value in (("feature_layer", feature_layer), ("head_layer", head_layer)):
        if value is not None and value not in names:
            raise FeatureLayerError(f"{option}={value!r} is not a module of {type(model).__name__} "
                                    f"(some of its modules: {[n for n in names if n][:8]})")
    object.__setattr__(model, FEATURE_LAYER_ATTR, feature_layer)
    object.__setattr__(model, HEAD_LAYER_ATTR, head_layer)
    return model


def _unet_bottleneck(model: nn.Module) -> str:
    """MONAI UNet: ``model = Sequential(down, SkipConnection(Sequential(down, SkipConnection(...), up)), up)``; the
    bottleneck is the innermost ``SkipConnection``'s submodule, the one that is not itself a down/skip/up sequence."""
    from monai.networks.layers.simplelayers import SkipConnection

    path, module = "model.1", model.model[1]
    while isinstance(module, SkipConnection):
        inner = module.submodule
        if isinstance(inner, nn.Sequential) and len(inner) == 3 and isinstance(inner[1], SkipConnection):
            path, module = f"{path}.submodule.1", inner[1]
        else:
            return f"{path}.submodule"
    return path


def default_bottleneck(model: nn.Module) -> Optional[str]:
    """The deepest feature map's module path for MONAI's segmentation networks; None for any other network."""
    name = type(model).__name__
    if name == "UNet" and hasattr(model, "model"):
        return _unet_bottleneck(model)
    if name in ("BasicUNet", "BasicUnet", "Basicunet"):
        return "down_4"
    if name == "SegResNet":
        return f"down_layers.{len(model.down_layers) - 1}"
    if name == "FlexibleUNet":
        return "encoder"  # a list of maps, shallow to deep: the last is read
    if name == "UNETR":
        return "encoder4"
    if name == "SwinUNETR":
        return "encoder10"
    return None


def feature_module_name(model: nn.Module, role: str = "bottleneck") -> str:
    """The module path of ``role`` on ``model``: the job's ``feature_layer``, else the network's default (the
    bottleneck's table, the head for ``decoder_last``, whose *input* is the map).

    Raises:
        FeatureLayerError: no default for this network and no ``feature_layer``, or an unknown role.
    """
    if role not in FEATURE_ROLES:
        raise FeatureLayerError(f"unknown feature role {role!r}; expected one of {FEATURE_ROLES}")
    named = getattr(model, FEATURE_LAYER_ATTR, None)
    if named:
        return named
    if role == "decoder_last":
        return head_layer_name(model)
    default = default_bottleneck(model)
    if default is None:
        raise FeatureLayerError(f"{type(model).__name__} has no default feature layer: name one with feature_layer=<module path>")
    return default


def _deepest(out):
    """A module's output as one map: the last (deepest) of a list or tuple of maps (FlexibleUNet's encoder)."""
    return out[-1] if isinstance(out, (list, tuple)) else out


def network_features(model: nn.Module, inputs: torch.Tensor, roles: Sequence[str] = FEATURE_ROLES,
                     forward=None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """``(logits, {role: map})`` of one forward pass. FeatureUNet: its own ``forward_features``; any other network:
    forward hooks on each role's module (``decoder_last``: the head's input), removed after the pass. ``forward``:
    how to run the pass (default ``model(inputs)``; e.g. an inferer)."""
    if has_native_features(model):
        return model.forward_features(inputs)
    captured: Dict[str, torch.Tensor] = {}
    handles = []
    modules = dict(model.named_modules())
    try:
        for role in roles:
            name = feature_module_name(model, role)
            if role == "decoder_last" and not getattr(model, FEATURE_LAYER_ATTR, None):
                def grab_input(module, args, role=role):
                    captured[role] = args[0]
                handles.append(modules[name].register_forward_pre_hook(grab_input))
            else:
                def grab_output(module, args, out, role=role):
                    captured[role] = _deepest(out)
                handles.append(modules[name].register_forward_hook(grab_output))
        logits = forward(inputs) if forward is not None else model(inputs)
    finally:
        for h in handles:
            h.remove()
    return logits, captured


#: the layer types a head can be: the module that maps the last features to the logits
HEAD_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear)


def find_head_layer(model: nn.Module) -> str:
    """The module that produces the logits, from the network's structure alone (the server and every site find the
    same one without data): the last convolution or linear layer in ``named_modules()`` order, which is the output
    layer of MONAI's UNet, BasicUNet, SegResNet, FlexibleUNet, UNETR and SwinUNETR (and FeatureUNet's ``head``).

    Raises:
        FeatureLayerError: the network has no such layer (name it with ``head_layer``).
    """
    found = [name for name, module in model.named_modules() if name and name != ALIGNMENT_MODULE and isinstance(module, HEAD_TYPES)]
    if not found:
        raise FeatureLayerError(f"{type(model).__name__} has no convolution or linear layer to take as its head: "
                                "name it with head_layer=<module path>")
    return found[-1]


def head_layer_name(model: nn.Module) -> str:
    """The job's ``head_layer``, else :func:`find_head_layer`."""
    return getattr(model, HEAD_LAYER_ATTR, None) or find_head_layer(model)


def _align_output(module: nn.Module, args, out):
    """Forward hook: the layer's output re-normalised by the network's alignment layer (FlexibleUNet: its deepest map)."""
    alignment = module.__dict__["fedseg_alignment"]
    if isinstance(out, (list, tuple)):
        return type(out)(list(out[:-1]) + [alignment(out[-1])])
    return alignment(out)


def attach_feature_alignment(model: nn.Module) -> nn.Module:
    """PathFL's AFA on any network: a :class:`FeatureAlignment` child ``bottleneck_alignment`` (its buffers in the
    ``state_dict`` under the prefix the server writes), applied to the bottleneck's output by a forward hook. The
    bottleneck module holds the alignment in its instance dict, not as a child, so a deep copy's hook uses the copy's
    alignment and the bottleneck's own ``state_dict`` entries do not change. Returns ``model``."""
    if has_native_features(model):
        return model
    alignment = FeatureAlignment()
    model.add_module(ALIGNMENT_MODULE, alignment)
    layer = dict(model.named_modules())[feature_module_name(model, "bottleneck")]
    layer.__dict__["fedseg_alignment"] = alignment
    layer.register_forward_hook(_align_output)
    return model


def feature_module(model: nn.Module, role: str = "bottleneck") -> nn.Module:
    """The module whose output is ``role``'s map (FeatureUNet: its attribute of that name)."""
    if has_native_features(model):
        return getattr(model, role)
    return dict(model.named_modules())[feature_module_name(model, role)]
