"""Server-side audit of everything the sites send: the evidence behind "only parameters and declared
statistics leave a site".

Every incoming task result is summarised into ``<run dir>/privacy_audit.jsonl`` before the workflow
sees it: parameter names with shapes and dtypes (never values), metric names and values, and the meta
keys with the type and size of each value. A data-protection officer can read this file; the tests
assert on it.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict

import numpy as np
from nvflare.apis.dxo import DataKind, from_shareable
from nvflare.apis.filter import Filter
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable

from fedseg.fl.homomorphic import is_wire_ciphertext

AUDIT_NAME = "privacy_audit.jsonl"


def describe_value(value: Any) -> Dict[str, Any]:
    """Type and size of a value, plus the value itself only when it is a plain scalar."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return {"type": type(value).__name__, "value": value}
    if isinstance(value, dict):
        return {"type": "dict", "items": {str(k): describe_value(v) for k, v in value.items()}}
    if is_wire_ciphertext(value):  # an encrypted entry (homomorphic aggregation): how many ciphertexts, how large
        return {"type": "ckks", "ciphertexts": len(value), "bytes": sum(len(c) for c in value)}
    if isinstance(value, (list, tuple)):
        return {"type": "list", "length": len(value)}
    shape = getattr(value, "shape", None)
    if shape is not None:
        return {"type": type(value).__name__, "shape": list(shape), "dtype": str(getattr(value, "dtype", ""))}
    return {"type": type(value).__name__}


class ResultAuditFilter(Filter):
    """Task-result filter for the server: records, never modifies."""

    def __init__(self, file_name: str = AUDIT_NAME):
        super().__init__()
        self.file_name = file_name
        self._lock = threading.Lock()

    def process(self, shareable: Shareable, fl_ctx: FLContext) -> Shareable:
        try:
            dxo = from_shareable(shareable)
        except Exception as e:  # not a DXO (e.g. an error reply): record that, pass it on
            record = {"kind": "non-dxo", "error": str(e)[:200]}
        else:
            record = {"kind": dxo.data_kind}
            data = dxo.data or {}
            if dxo.data_kind in (DataKind.WEIGHTS, DataKind.WEIGHT_DIFF):
                record["params"] = {k: describe_value(v) for k, v in data.items()}
            else:
                record["data"] = {k: describe_value(v) for k, v in data.items()}
            record["meta"] = {k: describe_value(v) for k, v in (dxo.meta or {}).items()}
        peer = fl_ctx.get_peer_context()
        record["site"] = peer.get_identity_name() if peer else None
        record["task"] = shareable.get_header(ReservedKey.TASK_NAME) or fl_ctx.get_prop(ReservedKey.TASK_NAME)
        engine = fl_ctx.get_engine()
        run_dir = engine.get_workspace().get_run_dir(fl_ctx.get_job_id())
        with self._lock, open(os.path.join(run_dir, self.file_name), "a") as f:
            f.write(json.dumps(record, default=lambda o: o.item() if isinstance(o, np.generic) else str(o)) + "\n")
        return shareable
