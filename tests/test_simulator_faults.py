"""Hostile site results in NVFlare's real simulator: each is rejected with its reason, the job finishes with the
honest sites (FedAvg, tiny profile with one local epoch, 4 sites, 3 rounds; faults injected by ``fedseg.fl.faults``)."""

from __future__ import annotations

import math
import os

import pytest

from fedseg.cli import export_job
from fedseg.fl.faults import FAULT_ENV
from sim_utils import run_simulator

pytestmark = pytest.mark.slow

SITES = ["site-1", "site-2", "site-3", "site-4"]
# per round at most two faulty sites, so two honest ones remain (min_clients) and the relative rules see three
FAULTS = "site-2:scale=100@0,site-3:zero@0,site-2:sign_flip@1,site-3:stale@1,site-4:bad_stat@2"
EXPECTED = {
    0: {"site-2": "median of the other sites", "site-3": "all-zero model"},
    1: {"site-2": "opposite model: cosine -", "site-3": "stale update: result is for round 0, current round is 1"},
    2: {"site-4": "'n_samples' = -"},
}


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults_sim")
    # one local epoch: the faults, not the training, are under test (keeps the run well under 2 min)
    job = export_job("fedavg", root / "jobs", profile="tiny", num_rounds=3, local_epochs=1)
    old = os.environ.get(FAULT_ENV)
    os.environ[FAULT_ENV] = FAULTS
    try:
        return run_simulator(job, root / "ws", n_clients=4)
    finally:
        os.environ.pop(FAULT_ENV) if old is None else os.environ.__setitem__(FAULT_ENV, old)


def test_each_hostile_update_rejected_with_its_reason_and_the_job_finishes(faulty_run):
    report = faulty_run
    assert [r["round"] for r in report["rounds"]] == [0, 1, 2]
    for r in report["rounds"]:
        expected = EXPECTED[r["round"]]
        assert set(r["rejected"]) == set(expected), (r["round"], r["rejected"])
        for site, reason in expected.items():
            assert r["rejected"][site].startswith("train: ") and reason in r["rejected"][site], r["rejected"][site]
        # only the honest sites were averaged
        assert set(r["aggregation_weight"]) == set(SITES) - set(expected)
        assert sum(r["aggregation_weight"].values()) == pytest.approx(1.0)
    for site in SITES:  # the final model is usable everywhere: nothing hostile reached it
        final = report["final"]["global"][site]
        assert all(math.isfinite(v) for v in final.values()) and final["dice"] > 0.05, final
