"""Which entries of a network's state dict a method keeps at each site (FedBN, FedRep).

Both the server (to know what a site sends) and the site (to know what it keeps) call these on the same
network, so they agree by construction. Keys are ``state_dict`` names: parameters *and* buffers.

* :func:`normalisation_state_keys` — every normalisation layer's entries: batch norm ``weight``, ``bias``,
  ``running_mean``, ``running_var``, ``num_batches_tracked``; instance norm ``weight`` / ``bias`` only when
  it is affine (and its running statistics only with ``track_running_stats``); group / layer norm
  ``weight`` / ``bias``. MONAI's default instance norm (``norm="instance"``, not affine, no running
  statistics) has no entries at all.
* :func:`head_state_keys` — FeatureUNet's output layers: ``"conv1x1"`` = the 1x1 classifier ``head``
  (``head.weight``, ``head.bias``); ``"last_block"`` = the full-resolution decoder block
  (``decoders.<last>``: two conv-norm-act units, one in the ``three_conv_nearest`` variant) and ``head``.
"""

from __future__ import annotations

from typing import List

from torch import nn
from torch.nn.modules.batchnorm import _NormBase

#: FedRep head choices (``head_state_keys``)
HEADS = ("conv1x1", "last_block")


def module_state_keys(model: nn.Module, module_names: List[str]) -> List[str]:
    """State-dict keys of the named submodules (``"head"``, ``"decoders.3"``), in ``state_dict`` order."""
    prefixes = tuple(f"{name}." for name in module_names)
    return [k for k in model.state_dict() if k.startswith(prefixes)]


def normalisation_state_keys(model: nn.Module) -> List[str]:
    """State-dict keys of every normalisation layer (batch / instance / group / layer norm), see the module notes."""
    names = [name for name, m in model.named_modules() if name and isinstance(m, (_NormBase, nn.GroupNorm, nn.LayerNorm))]
    return module_state_keys(model, names)


def head_state_keys(model: nn.Module, head: str = "conv1x1") -> List[str]:
    """FedRep's local head of a FeatureUNet (``head``: one of :data:`HEADS`, see the module notes); of any other
    network, the layer that produces its logits (``fedseg.networks.feature_taps.head_layer_name``).

    Raises:
        ValueError: an unknown ``head``, or a network without FeatureUNet's ``head`` / ``decoders``.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    if not isinstance(getattr(model, "head", None), nn.Module) or not isinstance(getattr(model, "decoders", None), nn.ModuleList):
        # a user's network: the layer that produces the logits, found or named with head_layer (feature_taps)
        if head != "conv1x1":
            raise ValueError(f"FedRep head={head!r} names FeatureUNet's blocks; on {type(model).__name__} the head is the "
                             "layer that produces the logits (head='conv1x1', or name it with head_layer)")
        from fedseg.networks.feature_taps import head_layer_name

        return module_state_keys(model, [head_layer_name(model)])
    modules = ["head"] if head == "conv1x1" else [f"decoders.{len(model.decoders) - 1}", "head"]
    return module_state_keys(model, modules)
