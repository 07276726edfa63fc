"""The shared-run machinery itself (tests/sim_utils.py), with the simulator replaced by a recorder: each run once,
in the declared order, in the background; it waits while a test holds the simulator slot; a failure reaches
every reader; a read that was not declared is an error. The recorder has a slot of its own (the session's
shared runs may be running meanwhile, holding sim_utils.SIMULATOR_LOCK)."""

from __future__ import annotations

import threading
import time

import pytest

import sim_utils
from sim_utils import RunSpec, SharedRuns


@pytest.fixture()
def recorder(tmp_path):
    """A ``SharedRuns`` whose runs are a recorder (instead of export + simulator) that holds the simulator slot
    briefly; the session's own shared runs (which may be running in the background meanwhile) are untouched."""
    calls, active, slot = [], [], threading.RLock()

    def fake_execute(name, spec, root):
        with slot:  # as run_simulator takes sim_utils.SIMULATOR_LOCK
            active.append(name)
            assert len(active) == 1, f"two runs at once: {active}"
            calls.append((name, threading.current_thread().name))
            time.sleep(0.05)
            active.remove(name)
        if spec.method == "broken":
            raise RuntimeError(f"{name} failed")
        return f"result of {name}"

    specs = {n: RunSpec("broken" if n == "bad" else "fedavg") for n in ("a", "b", "c", "bad", "unused")}
    return SharedRuns(lambda name: tmp_path / name, specs, run=fake_execute), calls, slot


def test_declared_runs_run_once_in_order_in_the_background(recorder):
    runs, calls, _ = recorder
    runs.prefetch(["b", "a", "c"])
    assert runs("a") == "result of a" and runs("a") == "result of a"
    assert runs("c") == "result of c" and runs("b") == "result of b"
    runs.close()
    assert [c[0] for c in calls] == ["b", "a", "c"]  # each once, in the declared order
    assert {c[1] for c in calls} == {"shared-simulator-runs"}  # by the background worker, not the readers


def test_a_failed_run_fails_every_reader_without_running_again(recorder):
    runs, calls, _ = recorder
    runs.prefetch(["bad"])
    for _ in range(2):
        with pytest.raises(RuntimeError, match="bad failed"):
            runs("bad")
    runs.close()
    assert [c[0] for c in calls] == ["bad"]


def test_undeclared_or_unknown_runs_are_refused(recorder):
    runs, calls, _ = recorder
    runs.prefetch(["a"])
    with pytest.raises(KeyError, match=r"mark the test @pytest.mark.shared_runs\('unused'\)"):
        runs("unused")
    with pytest.raises(KeyError, match="no shared simulator run 'nope'"):
        runs("nope")
    runs.close()
    assert [c[0] for c in calls] == ["a"]


def test_background_runs_wait_while_a_test_holds_the_simulator_slot(recorder):
    runs, calls, slot = recorder
    with slot:  # as sim_utils.exclusive() while fedseg bench or a POC started by a test runs
        runs.prefetch(["a"])
        time.sleep(0.3)
        assert calls == []  # the worker is waiting for the slot
    assert runs("a") == "result of a"
    runs.close()
    assert [c[0] for c in calls] == ["a"]
