"""A user's bundle network as a component NVFlare can build from a job's configuration.

A job carries the server's initial model as ``{"path": class, "args": {...}}`` (NVFlare's ``PTModel``); a network of a
user's bundle is not ours to describe that way, but the bundle is: :class:`BundleNetwork` takes the bundle folder and the
job's overrides and returns the bundle's own ``network_def`` (``fedseg.bundle.build_bundle_network``), so the persisted
global model's ``state_dict`` is exactly the bundle network's and loads in the user's own ``inference.json``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from torch import nn

from fedseg.config import BASE_TRAIN_CONFIG


class BundleNetwork:
    """``BundleNetwork(bundle=..., ...)`` is the bundle's network itself (an ``nn.Module`` of the bundle's class).

    Args:
        bundle: the bundle folder (absolute, as the job records it).
        bundle_overrides: ``{config id: value}`` applied at every participant.
        feature_layer, head_layer: module paths the feature-level methods and FedRep read (``feature_taps``).
        feature_alignment: attach PathFL's alignment layer.
        seed: the initial weights' seed (every participant builds the same network).
    """

    def __new__(cls, bundle: str, bundle_overrides: Optional[Dict[str, Any]] = None, feature_layer: Optional[str] = None,
                head_layer: Optional[str] = None, feature_alignment: bool = False, seed: int = 0) -> nn.Module:
        from fedseg.bundle import build_bundle_network

        return build_bundle_network({"bundle": bundle, "bundle_overrides": bundle_overrides, "feature_layer": feature_layer,
                                     "head_layer": head_layer, "feature_alignment": feature_alignment, "seed": seed})


def bundle_network_component(train_config: Dict[str, Any]) -> Dict[str, Any]:
    """The job's ``{"path", "args"}`` description of the initial model of a user's bundle (``train_config``)."""
    return {"path": f"{__name__}.BundleNetwork",
            "args": {"bundle": train_config["bundle"], "bundle_overrides": train_config.get("bundle_overrides"),
                     "feature_layer": train_config.get("feature_layer"), "head_layer": train_config.get("head_layer"),
                     "feature_alignment": bool(train_config.get("feature_alignment")), "seed": int(train_config.get("seed", BASE_TRAIN_CONFIG["seed"]))}}
