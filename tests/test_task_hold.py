"""The server's long poll for task requests (fedseg.fl.task_hold) against a stand-in for NVFlare's server runner.

The runner answers as NVFlare's does: ``(TRY_AGAIN, "", None)`` while no task is standing for the site, then the
task. The hold must return NVFlare's own answers unchanged, only later: the task as soon as it exists, "try again"
when none came within the hold, at once when the run is stopping or too many requests already wait.
"""

from __future__ import annotations

import threading

import pytest
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext

from fedseg.fl.task_hold import TRY_AGAIN, TaskRequestHold, hold_task_requests

TASK = ("train", "task-1", {"weights": 1})


class Runner:
    """Answers "try again" for the first ``empty`` requests, then the task; counts the requests it answered."""

    def __init__(self, empty: int):
        self.empty, self.calls = empty, 0
        self._lock = threading.Lock()

    def process_task_request(self, client, fl_ctx):
        with self._lock:
            self.calls += 1
            return (TRY_AGAIN, "", None) if self.calls <= self.empty else TASK


def test_a_request_gets_the_task_once_it_is_scheduled():
    runner = Runner(empty=4)
    hold = TaskRequestHold(runner, hold_s=30.0, poll_s=0.001)
    assert runner.process_task_request("site-1", None) == TASK
    assert runner.calls == 5  # asked again until the task was there, not answered "try again"
    assert hold.held == 0


def test_a_request_with_no_task_within_the_hold_gets_try_again():
    runner = Runner(empty=10**9)
    TaskRequestHold(runner, hold_s=0.02, poll_s=0.001)
    assert runner.process_task_request("site-1", None)[0] == TRY_AGAIN
    assert runner.calls > 1


def test_no_wait_while_the_run_stops_and_nvflare_answers_pass_unchanged():
    runner = Runner(empty=10**9)
    TaskRequestHold(runner, hold_s=30.0, stop=lambda: True)
    assert runner.process_task_request("site-1", None)[0] == TRY_AGAIN
    assert runner.calls == 1
    done = Runner(empty=0)
    TaskRequestHold(done, hold_s=30.0)
    assert done.process_task_request("site-1", None) == TASK and done.calls == 1


def test_at_most_max_held_requests_wait():
    runner = Runner(empty=10**9)
    stop = threading.Event()
    hold = TaskRequestHold(runner, hold_s=30.0, poll_s=0.001, max_held=1, stop=stop.is_set)
    waiting = threading.Thread(target=runner.process_task_request, args=("site-1", None))
    waiting.start()
    while hold.held < 1:
        pass
    calls = runner.calls
    assert runner.process_task_request("site-2", None)[0] == TRY_AGAIN  # answered at once: one call
    stop.set()
    waiting.join(timeout=10)
    assert not waiting.is_alive() and hold.held == 0
    assert calls >= 1


def test_release_restores_the_runner_and_no_runner_means_no_hold():
    runner = Runner(empty=10**9)
    original = runner.process_task_request
    hold = TaskRequestHold(runner, hold_s=30.0)
    hold.release()
    assert runner.process_task_request == original
    ctx = FLContext()
    assert hold_task_requests(ctx, 0.5) is None  # no server runner in this context
    ctx.set_prop(FLContextKey.RUNNER, Runner(empty=0), private=True, sticky=False)
    assert hold_task_requests(ctx, 0.0) is None
    assert isinstance(hold_task_requests(ctx, 0.5), TaskRequestHold)
    with pytest.raises(ValueError):
        TaskRequestHold(Runner(empty=0), hold_s=0)
