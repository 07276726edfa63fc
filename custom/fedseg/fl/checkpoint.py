"""``round_checkpoint.pt``: what the server needs to continue a job after it was killed.

After every completed round the controller (``fedseg.fl.controller``) replaces the checkpoint with:

    format            CHECKPOINT_FORMAT
    config            the job's effective configuration (report.json ``config``); a checkpoint is used
                      only by a job with the same one
    completed_round   index of the last round whose aggregate is in the checkpoint (0-based)
    global            the global model after that round ({name: CPU tensor})
    strategy          ``ServerStrategy.state_dict()`` (FedEvi's beta, GraphFedSeg's graph, ...)
    report            report.json so far: ``rounds`` (each completed round once) and ``resumed_at``
    model_selection   (only with ``eval_best_val_round``) the best validation round so far and its global model

Why our own file and not NVFlare's snapshot: NVFlare 2.9's ``ServerEngine.persist_components`` is a no-op
(component snapshot persistence was removed) and nothing calls ``JobRunner.restore_running_job``, so a
restarted server never resumes a job by itself; ``docs/reliability.md`` has the details. A restarted
server is given the same job again (re-submit / ``nvflare job clone``) with the same ``checkpoint_dir``.

The file is written to a temporary name in the same folder, flushed to disk and renamed over the old one
(``os.replace`` is atomic on POSIX), so a crash while writing leaves the previous checkpoint intact. It
holds tensors, numbers, strings, lists and dicts only and is read with ``torch.load(weights_only=True)``:
loading a checkpoint never runs code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from fedseg.fl.report import jsonable

CHECKPOINT_NAME = "round_checkpoint.pt"
CHECKPOINT_FORMAT = 1


class CheckpointMismatchError(ValueError):
    """A checkpoint exists in the folder but was written by a job with another configuration."""


def checkpoint_path(directory: os.PathLike) -> Path:
    return Path(directory) / CHECKPOINT_NAME


#: configuration keys that do not change what a round computes: a restarted job may change them
OPERATIONAL_KEYS = ("task_timeout",)


def comparable_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """The configuration as JSON would hold it (tuples -> lists, ...), without :data:`OPERATIONAL_KEYS`,
    so that a stored and a fresh one compare equal when the job computes the same rounds."""
    kept = {k: v for k, v in config.items() if k not in OPERATIONAL_KEYS}
    return json.loads(json.dumps(jsonable(kept), sort_keys=True, default=str))


def save_checkpoint(
    directory: os.PathLike,
    *,
    config: Dict[str, Any],
    completed_round: int,
    global_params: Dict[str, torch.Tensor],
    strategy_state: Dict[str, Any],
    rounds: List[Dict[str, Any]],
    resumed_at: List[int],
    model_selection: Optional[Dict[str, Any]] = None,
) -> Path:
    """Atomically replace ``directory/round_checkpoint.pt``; returns its path.

    Args:
        config: the job's effective configuration.
        completed_round: the round this checkpoint ends with (its aggregate is ``global_params``).
        global_params: {name: tensor} global model after ``completed_round``.
        strategy_state: ``ServerStrategy.state_dict()`` after ``completed_round``.
        rounds: report.json's round entries 0..completed_round.
        resumed_at: rounds at which this job resumed so far.
        model_selection: the best validation round so far (``fedseg.fl.model_selection``), when the job selects one.
    """
    if [r.get("round") for r in rounds] != list(range(completed_round + 1)):
        raise ValueError(
            f"checkpoint after round {completed_round} needs report rounds 0..{completed_round} once each, "
            f"got {[r.get('round') for r in rounds]}"
        )
    state = {
        "format": CHECKPOINT_FORMAT,
        "config": comparable_config(config),
        "completed_round": int(completed_round),
        # entries that are not tensors: ciphertexts in their stored form (homomorphic aggregation)
        "global": {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in global_params.items()},
        "strategy": strategy_state,
        "report": {"rounds": jsonable(rounds), "resumed_at": [int(r) for r in resumed_at]},
    }
    if model_selection is not None:
        state["model_selection"] = model_selection
    path = checkpoint_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_checkpoint(directory: os.PathLike, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The checkpoint in ``directory`` for a job with ``config``, or None when there is none.

    Raises:
        CheckpointMismatchError: the checkpoint belongs to a job with another configuration (the message
            names the differing keys); resuming it would mix two runs, starting over would silently
            overwrite it, so the operator decides (remove it, or point ``checkpoint_dir`` elsewhere).
        ValueError: the file is not a fedseg round checkpoint.
    """
    path = checkpoint_path(directory)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated or foreign file: say which, never guess
        raise ValueError(f"{path} is not a readable fedseg round checkpoint: {e}") from e
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a fedseg round checkpoint of format {CHECKPOINT_FORMAT}")
    wanted = comparable_config(config)
    if state["config"] != wanted:
        differing = sorted(k for k in set(wanted) | set(state["config"]) if wanted.get(k) != state["config"].get(k))
        raise CheckpointMismatchError(
            f"{path} was written by a job with another configuration (differs in {differing}); "
            "remove it or set another checkpoint_dir to start this job from round 0"
        )
    return state
