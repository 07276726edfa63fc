"""Wire precision of model weights (train_config ``payload_dtype``): an option that halves what a round moves.

Sites and the server keep and train their models in float32. With ``payload_dtype`` "float16" or "bfloat16"
every floating-point weight is cast just before it is sent (site -> server and server -> sites) and cast
back to float32 as soon as it is received, so rounding happens only on the wire, once per direction.
Integer buffers (e.g. BatchNorm's ``num_batches_tracked``) and the declared statistics in ``meta`` are
never cast. float16 keeps 10 mantissa bits but overflows above 65504 (such an update then arrives as Inf and
the server rejects it by name); bfloat16 keeps float32's range with 7 mantissa bits.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np
import torch

from fedseg.config import BASE_TRAIN_CONFIG

#: train_config ``payload_dtype`` values
PAYLOAD_DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: dtypes that only ever appear on the wire (cast back to float32 on receipt)
_WIRE_ONLY = (torch.float16, torch.bfloat16)


def payload_dtype(train_config: Mapping[str, Any]) -> torch.dtype:
    """The wire dtype ``train_config["payload_dtype"]`` names (default float32 = weights sent as trained).

    Raises:
        ValueError: an unknown name.
    """
    name = train_config.get("payload_dtype") or BASE_TRAIN_CONFIG["payload_dtype"]
    if name not in PAYLOAD_DTYPES:
        raise ValueError(f"train_config['payload_dtype'] must be one of {sorted(PAYLOAD_DTYPES)}, got {name!r}")
    return PAYLOAD_DTYPES[name]


def to_wire(params: Mapping[str, Any], dtype: torch.dtype) -> Dict[str, Any]:
    """``params`` with every float32/float64 tensor (or NumPy array) cast to ``dtype``; others unchanged.

    Args:
        params: ``{name: tensor or array}`` (a flat state dict, possibly packed with extra models).
        dtype: the wire dtype; float32 returns the same tensors (a new dict, no tensor copied).
    """
    if dtype == torch.float32:
        return dict(params)
    out: Dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
            value = torch.from_numpy(value)
        if isinstance(value, torch.Tensor) and value.dtype in (torch.float32, torch.float64):
            value = value.detach().to(dtype)
        out[key] = value
    return out


def from_wire(params: Mapping[str, Any]) -> Dict[str, Any]:
    """``params`` with every float16/bfloat16 tensor cast back to float32 (the dtype models train in)."""
    return {
        key: value.float() if isinstance(value, torch.Tensor) and value.dtype in _WIRE_ONLY else value
        for key, value in params.items()
    }
