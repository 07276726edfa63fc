"""Best-validation-round model selection (``train_config["eval_best_val_round"]``).

With the option on, after every round the server sends the aggregated global model to every site with an
``evaluate`` task on the site's *validation* split (task meta ``split: "validation"``); each site answers
with its validation metric only (``val_dice``, or ``val_accuracy`` for classification). The round's score is
the plain mean over the sites that answered (every site counts once, as in the per-site mean Dice the reports
quote). :class:`BestValidationRound` keeps the global model of the best round so far (a strictly higher score
replaces it: of equal rounds the earlier is kept); after the last round the controller evaluates that model on
the test splits as ``final.global_best_val``, beside ``final.global`` (the last round's model), records the
round in ``final.best_val_round`` and writes the model to ``best_val_model.pt`` in the run directory.

Selection reads validation splits only. The FedEvi reference code instead tests every round whose mean
validation loss improved and keeps the best *test* Dice among them, which lets the test split choose the model;
we do not reproduce that (docs/methods.md).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional

import torch

#: the task meta key that asks a site to evaluate on a split other than test
SPLIT_META_KEY = "split"
VALIDATION_SPLIT = "validation"
#: the model name of the best round's global model in the final evaluation
BEST_VAL_MODEL = "global_best_val"
#: the model name of each site's last locally trained model in the final evaluation (train_config eval_local_models)
LOCAL_MODEL = "local"
#: the best round's global model in the run directory (``{"model", "train_config"}``, as ``fedseg infer`` reads it)
BEST_VAL_CHECKPOINT = "best_val_model.pt"


class BestValidationRound:
    """The best round's global model by mean validation metric over the sites.

    ``offer(round_, scores, params)`` with ``scores`` ``{site: validation metric}`` (higher is better) and
    ``params`` the round's global model ``{name: tensor}``; ``best_round`` / ``best_score`` / ``params`` the
    best so far. ``state_dict`` / ``load_state_dict`` carry it across a server restart (CPU tensors only).
    """

    def __init__(self) -> None:
        self.best_round: Optional[int] = None
        self.best_score: Optional[float] = None
        self.params: Optional[Dict[str, torch.Tensor]] = None

    @staticmethod
    def score(scores: Mapping[str, float]) -> Optional[float]:
        """Mean of the finite values of ``scores``; None when no site answered with one."""
        values = [float(v) for v in scores.values() if v is not None and math.isfinite(float(v))]
        return sum(values) / len(values) if values else None

    def offer(self, round_: int, scores: Mapping[str, float], params: Mapping[str, torch.Tensor]) -> bool:
        """Keep ``params`` when the round's mean score beats the best so far; returns whether it did."""
        score = self.score(scores)
        if score is None or (self.best_score is not None and score <= self.best_score):
            return False
        self.best_round, self.best_score = int(round_), score
        self.params = {k: torch.as_tensor(v).detach().cpu().clone() for k, v in params.items()}
        return True

    def state_dict(self) -> Dict[str, Any]:
        return {"best_round": self.best_round, "best_score": self.best_score, "params": self.params}

    def load_state_dict(self, state: Optional[Mapping[str, Any]]) -> None:
        state = state or {}
        self.best_round = state.get("best_round")
        self.best_score = state.get("best_score")
        self.params = state.get("params")
