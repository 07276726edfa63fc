"""Where each round's global model is validated for best-round selection (``fedseg.fl.round_validation``).

Pure unit tests of the schedule: the job's options and the strategy's capabilities in, one answer per point of the
job out (after a round's aggregation, before a round's train task, after the last round). The end-to-end runs with
both ``round_validation`` modes are in ``test_local_protocol.py``.
"""

from __future__ import annotations

import pytest
import torch

from fedseg.fl.protocol import pack_models
from fedseg.fl.round_validation import (ROUND_VALIDATION, Validation, ValidationSchedule, is_validated,
                                       sends_global_model)
from fedseg.strategies.base import SitePayload

GLOBAL = {"w": torch.ones(2, 2), "b": torch.zeros(2)}
SITES = ("site-1", "site-2", "site-3")


def schedule(mode: str = "train_task", final_evaluation: bool = True) -> ValidationSchedule:
    """A selecting job's schedule (a strategy with a complete global model)."""
    return ValidationSchedule.for_job({"eval_best_val_round": True, "round_validation": mode}, has_global_model=True,
                                      evaluates_global=True, final_evaluation=final_evaluation)


def broadcast(params=GLOBAL) -> dict:
    return {s: SitePayload(params=params) for s in SITES}


def rounds(*validated: int, upto: int = 3) -> list:
    """Report rounds 0..upto-1, those in ``validated`` with their scores."""
    return [{"round": r, "metrics": {}, **({"global_val": {"site-1": 0.5}} if r in validated else {})}
            for r in range(upto)]


def never_called():
    raise AssertionError("the global model was asked for where no validation is due")


# ----------------------------------------------------------------------------------------- the job's options
@pytest.mark.parametrize("asked, has_global, evaluates, selects", [
    (True, True, True, True),
    (False, True, True, False),  # the job does not ask for it
    (True, False, True, False),  # no global model during training (FedEFM's DFL)
    (True, True, False, False),  # a global model that is incomplete without a site's own layers (FedBN, FedRep)
])
def test_selection_applies_only_to_a_complete_global_model(asked, has_global, evaluates, selects):
    s = ValidationSchedule.for_job({"eval_best_val_round": asked}, has_global, evaluates, final_evaluation=True)
    assert s.selects is selects
    if not selects:  # then nothing anywhere: no task, nothing riding on one
        assert s.after_aggregation() is Validation.NONE
        assert s.before_train([], 1, broadcast(), never_called) is Validation.NONE
        assert s.after_last_round([], 3) is Validation.NONE
        assert not s.awaits([], 0)


def test_the_default_validates_with_the_next_task():
    s = ValidationSchedule.for_job({"eval_best_val_round": True}, True, True, final_evaluation=False)
    assert s.with_next_task and not s.final_evaluation
    assert ROUND_VALIDATION == ("train_task", "task")
    assert not schedule("task").with_next_task


def test_an_unknown_mode_is_refused_only_where_selection_applies():
    with pytest.raises(ValueError, match="round_validation"):
        schedule("every_round")
    # the option is never read without the selection: no error, as before it was read
    off = ValidationSchedule.for_job({"round_validation": "every_round"}, True, True, True)
    assert not off.selects
    no_global = ValidationSchedule.for_job({"eval_best_val_round": True, "round_validation": "x"}, False, True, True)
    assert not no_global.selects


# ----------------------------------------------------------------------------------------- the report's state
def test_a_round_is_validated_when_its_own_entry_holds_scores():
    assert is_validated(rounds(0, 2), 0) and is_validated(rounds(0, 2), 2)
    assert not is_validated(rounds(0, 2), 1)  # its entry has no global_val
    assert not is_validated(rounds(0, 2), 5)  # no entry at all
    assert not is_validated([], 0)


def test_a_round_awaits_its_validation_only_where_a_later_task_carries_it():
    assert schedule().awaits(rounds(0), 1)
    assert not schedule().awaits(rounds(0, 1), 1)  # already validated (e.g. before a restart)
    assert not schedule("task").awaits(rounds(), 1)  # validated by its own task right after it


# ----------------------------------------------------------------------------------------- the three points
def test_after_aggregation_only_the_own_task_mode_validates():
    assert schedule("task").after_aggregation() is Validation.OWN_TASK
    assert schedule("train_task").after_aggregation() is Validation.NONE


def test_round_zero_validates_nothing_before_it_trains():
    assert schedule().before_train([], 0, broadcast(), never_called) is Validation.NONE


def test_the_previous_round_rides_on_a_train_task_that_broadcasts_the_global_model():
    assert schedule().before_train(rounds(upto=1), 1, broadcast(), lambda: GLOBAL) is Validation.WITH_TRAIN_TASK


def test_a_validated_previous_round_or_the_own_task_mode_needs_nothing_before_training():
    assert schedule().before_train(rounds(0, 1), 2, broadcast(), never_called) is Validation.NONE
    assert schedule("task").before_train(rounds(), 2, broadcast(), never_called) is Validation.NONE


def test_a_site_receiving_a_model_of_its_own_sends_the_previous_round_to_its_own_task():
    payloads = broadcast()
    payloads["site-2"] = SitePayload(params={k: v.clone() for k, v in GLOBAL.items()})  # equal values, its own model
    assert schedule().before_train(rounds(upto=1), 1, payloads, lambda: GLOBAL) is Validation.OWN_TASK


@pytest.mark.parametrize("main", [
    {"w": GLOBAL["w"]},  # an entry left out (a method with site-local layers sending only the shared ones)
    {**GLOBAL, "extra": torch.ones(1)},  # an entry the global model does not have
    {"w": GLOBAL["w"], "b": torch.zeros(2)},  # one entry replaced
])
def test_only_the_global_model_itself_is_the_global_model(main):
    payloads = {**broadcast(), "site-3": SitePayload(params=main)}
    assert not sends_global_model(payloads, GLOBAL)
    assert schedule().before_train(rounds(upto=1), 1, payloads, lambda: GLOBAL) is Validation.OWN_TASK


def test_the_main_model_counts_not_the_dict_or_the_models_packed_beside_it():
    # GraphFedSeg: a site's own (shallow) dict of the global tensors; SCAFFOLD: the control variate packed beside it
    shallow = {s: SitePayload(params=dict(GLOBAL)) for s in SITES}
    packed = broadcast(pack_models({"control": {k: torch.zeros_like(v) for k, v in GLOBAL.items()}}, main=GLOBAL))
    for payloads in (shallow, packed):
        assert sends_global_model(payloads, GLOBAL)
        assert schedule().before_train(rounds(upto=1), 1, payloads, lambda: GLOBAL) is Validation.WITH_TRAIN_TASK


def test_the_last_round_rides_on_the_final_evaluation_or_has_its_own_task_without_one():
    assert schedule(final_evaluation=True).after_last_round(rounds(0, 1), 3) is Validation.WITH_FINAL_EVALUATION
    assert schedule(final_evaluation=False).after_last_round(rounds(0, 1), 3) is Validation.OWN_TASK
    assert schedule().after_last_round(rounds(0, 1, 2), 3) is Validation.NONE  # validated already
    assert schedule("task").after_last_round(rounds(0, 1, 2), 3) is Validation.NONE


# ----------------------------------------------------------------------------------------- whole jobs
def walk(s: ValidationSchedule, num_rounds: int, first: int = 0, done=None, personalised_from: int = 99) -> list:
    """The schedule's answers over a job, recording each validation in the report as the controller does."""
    report = list(done or [])
    seen = []
    for r in range(first, num_rounds):
        payloads = broadcast()
        if r >= personalised_from:
            payloads["site-1"] = SitePayload(params=dict(GLOBAL, w=GLOBAL["w"].clone()))
        before = s.before_train(report, r, payloads, lambda: GLOBAL)
        if before is not Validation.NONE:
            report[-1]["global_val"] = {}
            seen.append((r - 1, before))
        entry = {"round": r, "metrics": {}}
        if s.after_aggregation() is Validation.OWN_TASK:
            entry["global_val"] = {}
            seen.append((r, Validation.OWN_TASK))
        report.append(entry)
    last = s.after_last_round(report, num_rounds)
    if last is not Validation.NONE:
        seen.append((num_rounds - 1, last))
    return seen


def test_every_round_is_validated_once():
    assert walk(schedule(), 3) == [(0, Validation.WITH_TRAIN_TASK), (1, Validation.WITH_TRAIN_TASK),
                                   (2, Validation.WITH_FINAL_EVALUATION)]
    assert walk(schedule("task"), 3) == [(r, Validation.OWN_TASK) for r in range(3)]
    assert walk(schedule(final_evaluation=False), 2) == [(0, Validation.WITH_TRAIN_TASK), (1, Validation.OWN_TASK)]
    assert walk(schedule(), 3, personalised_from=2) == [(0, Validation.WITH_TRAIN_TASK), (1, Validation.OWN_TASK),
                                                        (2, Validation.WITH_FINAL_EVALUATION)]


def test_after_a_restart_the_checkpoints_last_round_is_validated_with_the_first_round_run():
    # the checkpoint ended after round 1, whose model was still to be validated with round 2's train task
    assert walk(schedule(), 3, first=2, done=rounds(0, upto=2)) == [(1, Validation.WITH_TRAIN_TASK),
                                                                  (2, Validation.WITH_FINAL_EVALUATION)]
    # a checkpoint past the last round: only the last round's model is left, for the final evaluation
    assert walk(schedule(), 3, first=3, done=rounds(0, 1, upto=3)) == [(2, Validation.WITH_FINAL_EVALUATION)]
