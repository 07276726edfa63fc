"""The shared-run machinery itself (tests/sim_utils.py), with the simulator replaced by a recorder: each run once,
in the declared order, in the background, at most as many at once as there are simulator slots; it waits while a
test holds every slot; a failure reaches every reader; a read that was not declared is an error. The recorder has
slots of its own (the session's shared runs may be running meanwhile, holding sim_utils.SIMULATOR_SLOTS)."""

from __future__ import annotations

import threading
import time

import pytest

from sim_utils import RunSpec, SharedRuns, SimulatorSlots


@pytest.fixture()
def recorder(tmp_path):
    """``make(workers)`` -> a ``SharedRuns`` whose runs are a recorder (instead of export + simulator) holding one of
    two slots for a moment, as run_simulator does; the session's own shared runs are untouched."""
    calls, active, most = [], [], [0]
    slots = SimulatorSlots(2)
    guard = threading.Lock()

    def fake_prepare(name, spec, root):
        if spec.method == "unpreparable":
            raise ValueError(f"{name} cannot be exported")
        prepared_in = threading.current_thread().name

        def run():
            with slots.one():
                with guard:
                    active.append(name)
                    most[0] = max(most[0], len(active))
                    calls.append((name, threading.current_thread().name, prepared_in))
                time.sleep(0.2)
                with guard:
                    active.remove(name)
            if spec.method == "broken":
                raise RuntimeError(f"{name} failed")
            return f"result of {name}"

        return run

    methods = {"bad": "broken", "unprepared": "unpreparable"}
    specs = {n: RunSpec(methods.get(n, "fedavg")) for n in ("a", "b", "c", "bad", "unprepared", "unused")}

    def make(workers=1):
        return SharedRuns(lambda name: tmp_path / name, specs, prepare_run=fake_prepare, workers=workers)

    return make, calls, slots, most


def test_declared_runs_run_once_in_order_in_the_background(recorder):
    make, calls, _, most = recorder
    runs = make(workers=1)
    runs.prefetch(["b", "a", "c"])
    assert runs("a") == "result of a" and runs("a") == "result of a"
    assert runs("c") == "result of c" and runs("b") == "result of b"
    runs.close()
    assert [c[0] for c in calls] == ["b", "a", "c"]  # each once, in the declared order
    assert {c[1] for c in calls} == {"shared-simulator-runs-0"}  # by the background worker, not the readers
    assert {c[2] for c in calls} == {threading.current_thread().name}  # prepared (exported) in the caller's thread
    assert most[0] == 1


def test_two_workers_run_two_at_once_and_never_more(recorder):
    make, calls, _, most = recorder
    runs = make(workers=3)  # more workers than slots: the slots still bound the runs at once
    runs.prefetch(["a", "b", "c"])
    assert [runs(n) for n in ("a", "b", "c")] == ["result of a", "result of b", "result of c"]
    runs.close()
    assert sorted(c[0] for c in calls) == ["a", "b", "c"] and most[0] == 2


def test_a_failed_run_fails_every_reader_without_running_again(recorder):
    make, calls, _, _ = recorder
    runs = make(workers=2)
    runs.prefetch(["bad", "unprepared"])
    for _ in range(2):
        with pytest.raises(RuntimeError, match="bad failed"):
            runs("bad")
        with pytest.raises(ValueError, match="unprepared cannot be exported"):
            runs("unprepared")
    runs.close()
    assert [c[0] for c in calls] == ["bad"]


def test_undeclared_or_unknown_runs_are_refused(recorder):
    make, calls, _, _ = recorder
    runs = make(workers=2)
    runs.prefetch(["a"])
    with pytest.raises(KeyError, match=r"mark the test @pytest.mark.shared_runs\('unused'\)"):
        runs("unused")
    with pytest.raises(KeyError, match="no shared simulator run 'nope'"):
        runs("nope")
    assert runs("a") == "result of a"
    runs.close()
    assert [c[0] for c in calls] == ["a"]  # the refused reads started nothing


def test_background_runs_wait_while_a_test_holds_every_slot(recorder):
    make, calls, slots, _ = recorder
    runs = make(workers=2)
    with slots.all():  # a holder of every slot (SimulatorSlots.all)
        runs.prefetch(["a", "b"])
        time.sleep(0.3)
        assert calls == []  # the workers are waiting for the slots
    assert runs("a") == "result of a" and runs("b") == "result of b"
    runs.close()
    assert sorted(c[0] for c in calls) == ["a", "b"]


def _in_thread(body) -> threading.Thread:
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def test_slots_are_reentrant_and_all_waits_for_the_others():
    slots = SimulatorSlots(2)
    events = []

    def take_one():
        with slots.one():
            events.append("one")

    def take_all():
        with slots.all():
            events.append("all")

    with slots.one():
        with slots.one():  # the same thread takes no second slot: the other one is free for another thread
            _in_thread(take_one).join(5)
            assert events == ["one"]
        waiter = _in_thread(take_all)
        waiter.join(0.3)
        assert waiter.is_alive() and events == ["one"]  # all() waits while this thread holds a slot
    waiter.join(5)
    assert events == ["one", "all"]
    with pytest.raises(ValueError, match="at least one"):
        SimulatorSlots(0)
