"""Shared fixtures: tiny built-in data, the tiny training configuration, and the shared simulator runs."""

from __future__ import annotations

import os

import pytest

#: the session's SharedRuns, for the terminal summary
_SHARED_RUNS = pytest.StashKey()

# two cores shared by the test process and the simulator's site processes
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_train_config():
    from fedseg.config import resolve_profile

    return resolve_profile("tiny")["train_config"]


@pytest.fixture(scope="session")
def tiny_datalist(tmp_path_factory):
    """A tiny polyp site (32 px, ~10 images) written to a session temp folder."""
    from fedseg.data.synthetic import generate_site_data

    root = tmp_path_factory.mktemp("tiny_data")
    return generate_site_data("polyp", "site-a", root, profile="tiny")


@pytest.fixture(scope="session")
def tiny_engine(tiny_datalist, tiny_train_config):
    from fedseg.engine import SegEngine

    return SegEngine("site-a", tiny_datalist, tiny_train_config)


def pytest_collection_modifyitems(config, items):
    """Order: the tests that need no simulator, then the readers of shared runs in the order the background workers
    take their runs (``sim_utils.background_order``; a reader of several runs by the last of them). The shared runs
    go on in the background while the first group runs (a reader placed among them would stall it while its run
    finishes)."""
    from sim_utils import background_order

    position = {name: i for i, name in enumerate(background_order(declared_shared_runs(items)))}

    def key(item) -> tuple:
        names = [n for mark in item.iter_markers("shared_runs") for n in mark.args]
        if not names:
            return (0, 0)
        return (1, max(position.get(n, len(position)) for n in names))

    items.sort(key=key)  # stable: file order kept within a group


def _skipped(item) -> bool:
    """A test that will be skipped before it runs (``skip``, or ``skipif`` with a true condition)."""
    for mark in item.iter_markers():
        if mark.name == "skip" or (mark.name == "skipif" and mark.args and mark.args[0] is True):
            return True
    return False


def declared_shared_runs(items) -> list:
    """The shared simulator runs the selected tests declare (marker ``shared_runs``), in the order they first read them."""
    names = []
    for item in items:
        if _skipped(item):
            continue
        for mark in item.iter_markers("shared_runs"):
            names += [n for n in mark.args if n not in names]
    return names


@pytest.fixture(scope="session")
def shared_runs(request, tmp_path_factory):
    """``shared_runs(name)`` -> the :class:`sim_utils.SimRun` of ``sim_utils.SHARED_RUNS[name]``, run once per
    session however many tests read it (tests/README.md). Started, for every test selected, by
    :func:`_start_shared_runs`."""
    from sim_utils import SHARED_RUNS, SharedRuns, background_order

    runs = SharedRuns(lambda name: tmp_path_factory.mktemp(f"sim_{name}"), SHARED_RUNS)
    runs.prefetch(background_order(declared_shared_runs(request.session.items)))
    request.config.stash[_SHARED_RUNS] = runs
    yield runs
    runs.close()


@pytest.fixture(scope="session", autouse=True)
def _start_shared_runs(request):
    """Start the selected tests' shared simulator runs in the background before the first test, so that they
    overlap the tests that need no simulator (at most ``sim_utils.SIMULATOR_SLOTS`` at once)."""
    if declared_shared_runs(request.session.items):
        request.getfixturevalue("shared_runs")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """With ``--durations``: the wall time of each shared run, which went on in the background (its readers' durations
    show only what they waited for it)."""
    runs = config.stash.get(_SHARED_RUNS, None)
    if runs is None or config.getoption("durations") is None or not runs.seconds:
        return
    terminalreporter.write_sep("=", "shared runs (background, wall time)")
    for name, seconds in sorted(runs.seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.2f}s {name}")
