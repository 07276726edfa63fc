"""Test-only fault injection: a site turns its own result hostile or broken just before sending it.

Switched on by the environment variable ``FEDSEG_FAULT_INJECTION`` in the site's process (the simulator's
site processes inherit it); unset, nothing here runs. The value is a comma-separated list of
``SITE:FAULT[=VALUE][@ROUND]`` entries, e.g.::

    FEDSEG_FAULT_INJECTION="site-2:scale=100@0,site-2:sign_flip@1,site-3:stale@0,site-3:zero@1,site-4:bad_stat@2"

Faults (applied to ``train`` results only; ``@ROUND`` limits one to that 0-based round, else every round):
    scale=F    send ``w_sent + F (w_trained - w_sent)`` (a scaled update; F defaults to 100)
    sign_flip  send ``-w_trained`` (a sign-flipped model)
    flip_update  send ``w_sent - (w_trained - w_sent)`` (the update pointing back)
    zero       send all floating-point weights as 0
    stale      say the result belongs to the previous round (skipped in round 0)
    bad_stat   send a negative sample count (``n_samples = -n``)

Every parameter of a packed result (``fedseg.fl.protocol.pack_models``) is treated alike, against the entry
of the same name the server sent. Its purpose is ``tests/test_simulator_faults.py``: showing that the
server's screening (``fedseg.fl.screening``) rejects each such result with its reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import torch

from fedseg.fl.protocol import TRAIN_TASK

logger = logging.getLogger(__name__)

FAULT_ENV = "FEDSEG_FAULT_INJECTION"
FAULTS = ("scale", "sign_flip", "flip_update", "zero", "stale", "bad_stat")


@dataclass(frozen=True)
class Fault:
    site: str
    kind: str
    value: float = 100.0
    round: Optional[int] = None


def parse_faults(spec: str) -> List[Fault]:
    """``"site-2:scale=100@0,site-3:zero"`` -> faults; a malformed entry is an error naming it."""
    faults = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        site, sep, rest = entry.partition(":")
        if not sep or not site or not rest:
            raise ValueError(f"{FAULT_ENV}: entry {entry!r} is not SITE:FAULT[=VALUE][@ROUND]")
        rest, _, round_ = rest.partition("@")
        kind, _, value = rest.partition("=")
        if kind not in FAULTS:
            raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r} in {entry!r}; known: {FAULTS}")
        try:
            faults.append(Fault(site, kind, float(value) if value else 100.0, int(round_) if round_ else None))
        except ValueError as e:
            raise ValueError(f"{FAULT_ENV}: bad number in {entry!r}") from e
    return faults


def faults_for(site: str, environ: Mapping[str, str] = os.environ) -> List[Fault]:
    """This site's faults from the environment (none when the variable is unset)."""
    return [f for f in parse_faults(environ.get(FAULT_ENV, "")) if f.site == site]


def apply_faults(
    faults: List[Fault], task: str, round_: int, out: Dict[str, Any], sent: Mapping[str, Any]
) -> Dict[str, Any]:
    """The result ``out`` (``{"params", "metrics", "meta"}``) with this round's faults applied.
    ``sent``: the parameters the site received with the task."""
    out = dict(out)  # the caller's result stays as it was
    if task != TRAIN_TASK:
        return out
    for fault in faults:
        if fault.round is not None and fault.round != round_:
            continue
        logger.warning("FAULT INJECTION (test only): %s sends a %s result in round %d", fault.site, fault.kind, round_)
        if fault.kind in ("scale", "sign_flip", "flip_update", "zero"):
            factor = {"scale": fault.value, "sign_flip": -1.0, "flip_update": -1.0, "zero": 0.0}[fault.kind]
            # sign_flip measures from 0 (the whole model negated), the others from what was sent
            base = {} if fault.kind == "sign_flip" else sent
            out["params"] = {k: _distort(v, base.get(k), factor, fault.kind == "zero") for k, v in out["params"].items()}
        elif fault.kind == "stale":
            if round_ == 0:  # nothing is older than round 0 (and NVFlare refuses a negative round)
                logger.warning("stale fault skipped in round 0")
                continue
            out["meta"] = {**out["meta"], "round": round_ - 1}
        elif fault.kind == "bad_stat":
            out["meta"] = {**out["meta"], "n_samples": -abs(int(out["meta"].get("n_samples", 1)) or 1)}
    return out


def _distort(value: Any, sent: Any, factor: float, zero: bool) -> Any:
    value = torch.as_tensor(value)
    if not torch.is_floating_point(value):
        return value
    if zero:
        return torch.zeros_like(value)
    base = torch.as_tensor(sent).to(value.dtype) if sent is not None else torch.zeros_like(value)
    return base + factor * (value - base)
