"""When each round's global model is validated for best-round selection (``train_config["eval_best_val_round"]``).

The controller validates round ``r``'s global model once, at one of these points (``Validation``):

* ``OWN_TASK`` right after round ``r``'s aggregation, when the job sends an evaluate task of its own after every round
  (``train_config["round_validation"] = "task"``);
* otherwise (``"train_task"``, the default) with the next task the sites receive: ``WITH_TRAIN_TASK``, round
  ``r + 1``'s train task, where every site receives exactly the global model and scores it before it trains;
  ``OWN_TASK`` at the start of round ``r + 1`` where some site receives a model of its own instead (a personalised
  one), which is not round ``r``'s global model; and for the last round ``WITH_FINAL_EVALUATION``, the final
  evaluation's task on the global model, or ``OWN_TASK`` after the rounds when the job makes no final evaluation.

A round whose report entry already holds ``global_val`` is not validated again: after a server restart the checkpoint's
rounds carry the scores they got, and the round the checkpoint ended with is validated with the first round run after
the restart. :class:`ValidationSchedule` answers where each round's validation goes; it reads the job's options, the
strategy's capabilities and the report's rounds, and sends nothing itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping

from fedseg.config import BASE_TRAIN_CONFIG
from fedseg.fl.protocol import unpack_models

#: how each round's global model is validated for best-round selection (train_config ``round_validation``): with the
#: task the sites receive next (the next round's train task; the final evaluation after the last round), or by an
#: evaluate task of its own after every round
ROUND_VALIDATION = ("train_task", "task")


class Validation(enum.Enum):
    """How a round's global model is validated, asked at one point of the job."""

    #: not here: selection is off or does not apply, the model is validated at another point, or already was
    NONE = "none"
    #: an evaluate task of its own on the sites' validation split, sent now
    OWN_TASK = "own_task"
    #: with the train task about to go out: each site scores the global model it receives before it trains
    WITH_TRAIN_TASK = "with_train_task"
    #: with the final evaluation of the global model: each site also scores it on its validation split
    WITH_FINAL_EVALUATION = "with_final_evaluation"


def sends_global_model(payloads: Mapping[str, Any], global_params: Mapping[str, Any]) -> bool:
    """Whether every site receives the global model itself as its main weights.

    ``payloads``: ``{site: SitePayload}``; ``global_params``: the strategy's global model ``{name: tensor}``.
    Compared by identity, entry by entry: a strategy hands every site the tensors of its global model unless it sends
    the site a model of its own (a personalised one, or the global model with entries replaced), and a personalised
    model equal to the global one by chance is still not what the global model would score.
    """
    for payload in payloads.values():
        main, _ = unpack_models(payload.params)
        if set(main) != set(global_params) or any(main[k] is not global_params[k] for k in global_params):
            return False
    return True


def is_validated(rounds: List[Dict[str, Any]], round_: int) -> bool:
    """Whether the report's ``rounds`` hold round ``round_``'s validation scores (``global_val``)."""
    return any(entry["round"] == round_ and "global_val" in entry for entry in rounds)


@dataclass(frozen=True)
class ValidationSchedule:
    """Where each round's global model is validated for best-round selection.

    Args:
        selects: best-round selection applies: the job asks for it and the strategy has a complete global model during
            training that the final evaluation evaluates (``has_global_model`` and ``evaluates_global``).
        with_next_task: each round's model is validated with the next task the sites receive
            (``round_validation="train_task"``) rather than by an evaluate task of its own after the round (``"task"``).
        final_evaluation: the job evaluates the final models on the sites' test splits after the last round.
    """

    selects: bool
    with_next_task: bool
    final_evaluation: bool

    @classmethod
    def for_job(cls, train_config: Mapping[str, Any], has_global_model: bool, evaluates_global: bool,
                final_evaluation: bool) -> "ValidationSchedule":
        """The schedule of a job with ``train_config`` and a strategy with these capabilities.

        Raises:
            ValueError: ``round_validation`` is not one of ``ROUND_VALIDATION`` where selection applies (where it does
                not, the option is never read).
        """
        selects = bool(train_config.get("eval_best_val_round")) and bool(has_global_model) and bool(evaluates_global)
        mode = train_config.get("round_validation", BASE_TRAIN_CONFIG["round_validation"])
        if selects and mode not in ROUND_VALIDATION:
            raise ValueError(f"train_config['round_validation'] must be one of {ROUND_VALIDATION}, got {mode!r}")
        return cls(selects=selects, with_next_task=mode == "train_task", final_evaluation=bool(final_evaluation))

    def awaits(self, rounds: List[Dict[str, Any]], round_: int) -> bool:
        """Whether round ``round_``'s global model is still to be validated by a later task (``rounds``: the
        report's)."""
        return self.selects and self.with_next_task and not is_validated(rounds, round_)

    def after_aggregation(self) -> Validation:
        """How a round's global model is validated right after its aggregation: ``OWN_TASK`` or ``NONE``."""
        return Validation.OWN_TASK if self.selects and not self.with_next_task else Validation.NONE

    def before_train(self, rounds: List[Dict[str, Any]], round_: int, payloads: Mapping[str, Any],
                     global_params: Callable[[], Mapping[str, Any]]) -> Validation:
        """How round ``round_ - 1``'s global model is validated at the start of round ``round_``, before its train task
        with ``payloads`` (``{site: SitePayload}``) goes out: ``WITH_TRAIN_TASK``, ``OWN_TASK`` (a site receives a
        model other than the global one) or ``NONE``. ``global_params`` (the strategy's) is called only where a
        validation is due.
        """
        if round_ <= 0 or not self.awaits(rounds, round_ - 1):
            return Validation.NONE
        return Validation.WITH_TRAIN_TASK if sends_global_model(payloads, global_params()) else Validation.OWN_TASK

    def after_last_round(self, rounds: List[Dict[str, Any]], num_rounds: int) -> Validation:
        """How the last round's global model is validated after the rounds: ``WITH_FINAL_EVALUATION``, ``OWN_TASK`` (no
        final evaluation) or ``NONE``."""
        if not self.awaits(rounds, num_rounds - 1):
            return Validation.NONE
        return Validation.WITH_FINAL_EVALUATION if self.final_evaluation else Validation.OWN_TASK
