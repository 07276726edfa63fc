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


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory):
    """``shared_runs(name)`` -> the :class:`sim_utils.SimRun` of ``sim_utils.SHARED_RUNS[name]``, run once per
    session however many tests read it (tests/README.md)."""
    from sim_utils import SHARED_RUNS, SharedRuns

    return SharedRuns(lambda name: tmp_path_factory.mktemp(f"sim_{name}"), SHARED_RUNS)
