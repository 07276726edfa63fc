"""Shared fixtures: tiny built-in data, the tiny training configuration, and the shared simulator runs."""

from __future__ import annotations

import os

import pytest

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
    """Order: the tests that need no simulator, then the readers of shared runs, then the tests that start NVFlare
    processes themselves (marker ``exclusive``). The shared runs go on in the background while the first group runs
    (a reader placed among them would stall it while its run finishes), and a test holding every simulator slot
    would stall the shared runs."""

    def group(item) -> int:
        if item.get_closest_marker("exclusive") is not None:
            return 2
        return 1 if item.get_closest_marker("shared_runs") is not None else 0

    items.sort(key=group)  # stable: file order kept within a group


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
    from sim_utils import SHARED_RUNS, SharedRuns

    runs = SharedRuns(lambda name: tmp_path_factory.mktemp(f"sim_{name}"), SHARED_RUNS)
    runs.prefetch(declared_shared_runs(request.session.items))
    yield runs
    runs.close()


@pytest.fixture(scope="session", autouse=True)
def _start_shared_runs(request):
    """Start the selected tests' shared simulator runs in the background before the first test, so that they
    overlap the tests that need no simulator (at most ``sim_utils.SIMULATOR_SLOTS`` at once)."""
    if declared_shared_runs(request.session.items):
        request.getfixturevalue("shared_runs")
