"""Server-side checks on what a site sends back: a bad update is rejected with a reason, never averaged."""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Mapping

import numpy as np
import torch

from fedseg.strategies.base import Params

#: longest list a declared statistic may be (a per-class vector, not a per-image list)
MAX_STATISTIC_LENGTH = 16


class InvalidUpdateError(ValueError):
    """A site's result cannot be used this round."""


def to_tensor_params(params: Mapping[str, Any]) -> Params:
    """NumPy arrays or tensors -> CPU tensors."""
    return {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))) for k, v in params.items()}


def validate_params(site: str, params: Mapping[str, Any], reference: Mapping[str, torch.Tensor]) -> Params:
    """Check keys, shapes and finiteness of ``params`` against the model the server sent.

    Raises:
        InvalidUpdateError: naming the site and the first offending entries.
    """
    if not params:
        raise InvalidUpdateError(f"{site}: empty model update")
    tensors = to_tensor_params(params)
    missing = sorted(set(reference) - set(tensors))
    extra = sorted(set(tensors) - set(reference))
    if missing or extra:
        raise InvalidUpdateError(f"{site}: parameter names differ from the global model: missing={missing[:5]} unexpected={extra[:5]}")
    for key, ref in reference.items():
        value = tensors[key]
        if tuple(value.shape) != tuple(ref.shape):
            raise InvalidUpdateError(f"{site}: '{key}' has shape {tuple(value.shape)}, expected {tuple(ref.shape)}")
        if torch.is_floating_point(value) and not bool(torch.isfinite(value).all()):
            raise InvalidUpdateError(f"{site}: '{key}' contains NaN or Inf")
        tensors[key] = value.to(ref.dtype)
    return tensors


def validate_partial_params(site: str, params: Mapping[str, Any], reference: Mapping[str, torch.Tensor]) -> Params:
    """Like :func:`validate_params` for a result that covers only some of the model's entries (SCAFFOLD's
    control delta: the trainable parameters): every entry must be a known name of the model, of its shape,
    and finite.

    Raises:
        InvalidUpdateError: naming the site and the first offending entries.
    """
    if not params:
        raise InvalidUpdateError(f"{site}: empty model update")
    extra = sorted(set(params) - set(reference))
    if extra:
        raise InvalidUpdateError(f"{site}: names that are not entries of the global model: {extra[:5]}")
    return validate_params(site, params, {k: reference[k] for k in params})


def validate_arrays(site: str, meta: Mapping[str, Any], declared: Mapping[str, tuple]) -> Dict[str, torch.Tensor]:
    """Keep only declared arrays; each must have exactly its declared shape and finite float values.

    Raises:
        InvalidUpdateError: a declared array of another shape, dtype or with NaN/Inf.
    """
    out: Dict[str, torch.Tensor] = {}
    for key, shape in declared.items():
        if key not in meta:
            continue
        try:
            value = torch.as_tensor(np.asarray(meta[key]))
        except (TypeError, ValueError) as e:
            raise InvalidUpdateError(f"{site}: '{key}' is not an array") from e
        if tuple(value.shape) != tuple(shape):
            raise InvalidUpdateError(f"{site}: '{key}' has shape {tuple(value.shape)}, declared {tuple(shape)}")
        if not torch.is_floating_point(value) or not bool(torch.isfinite(value).all()):
            raise InvalidUpdateError(f"{site}: '{key}' must be finite floats")
        out[key] = value.float()
    return out


def validate_statistics(site: str, meta: Mapping[str, Any], allowed: Iterable[str]) -> Dict[str, Any]:
    """Keep only declared statistics; each must be a finite scalar or a short list of finite scalars."""
    allowed = set(allowed)
    out: Dict[str, Any] = {}
    for key in allowed:
        if key not in meta:
            continue
        value = meta[key]
        values = value if isinstance(value, (list, tuple)) else [value]
        if len(values) > MAX_STATISTIC_LENGTH:
            raise InvalidUpdateError(f"{site}: statistic '{key}' has {len(values)} entries (max {MAX_STATISTIC_LENGTH})")
        try:
            floats = [float(v) for v in values]
        except (TypeError, ValueError) as e:
            raise InvalidUpdateError(f"{site}: statistic '{key}' is not numeric: {value!r}") from e
        if not all(math.isfinite(v) for v in floats):
            raise InvalidUpdateError(f"{site}: statistic '{key}' is not finite: {value!r}")
        out[key] = floats if isinstance(value, (list, tuple)) else floats[0]
    return out
