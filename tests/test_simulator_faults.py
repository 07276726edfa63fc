"""Hostile and broken sites in NVFlare's real simulator (the shared ``robustness`` run: FedAvg, tiny profile with
one local epoch, 5 sites, 3 rounds; tests/README.md).

* site-2..site-4 turn their results hostile (faults injected by ``fedseg.fl.faults``): each is rejected with its
  reason and the job finishes with the honest sites;
* site-5's datalist has a corrupt image: it is left out of every round, the others finish, and the file's name
  stays at the site.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sim_utils import broken_image_name

pytestmark = [pytest.mark.slow, pytest.mark.shared_runs("robustness")]

DATA_OK = ["site-1", "site-2", "site-3", "site-4"]  # the sites whose data is fine (site-1 stays honest throughout)
BROKEN = "site-5"
# per round at most two faulty sites, so two honest ones remain (min_clients) and the relative rules see three
EXPECTED = {
    0: {"site-2": "median of the other sites", "site-3": "all-zero model"},
    1: {"site-2": "opposite model: cosine -", "site-3": "stale update: result is for round 0, current round is 1"},
    2: {"site-4": "'n_samples' = -"},
}


@pytest.fixture(scope="module")
def robustness_run(shared_runs):
    return shared_runs("robustness")


def test_each_hostile_update_rejected_with_its_reason_and_the_job_finishes(robustness_run):
    report = robustness_run.report
    assert [r["round"] for r in report["rounds"]] == [0, 1, 2]
    for r in report["rounds"]:
        expected = EXPECTED[r["round"]]
        assert set(r["rejected"]) - {BROKEN} == set(expected), (r["round"], r["rejected"])
        for site, reason in expected.items():
            assert r["rejected"][site].startswith("train: ") and reason in r["rejected"][site], r["rejected"][site]
        # only the honest sites were averaged
        assert set(r["aggregation_weight"]) == set(DATA_OK) - set(expected)
        assert sum(r["aggregation_weight"].values()) == pytest.approx(1.0)
    for site in DATA_OK:  # the final model is usable everywhere: nothing hostile reached it
        final = report["final"]["global"][site]
        assert all(math.isfinite(v) for v in final.values()) and final["dice"] > 0.05, final


def test_site_with_bad_data_drops_out_and_the_job_continues(robustness_run):
    """site-5 points at a datalist with a corrupt image: it is left out, the others finish."""
    report = robustness_run.report
    for r in report["rounds"]:
        # left out: the site that failed, and the hostile results of the round
        assert sorted(r["missing"]) == sorted({BROKEN, *EXPECTED[r["round"]]}), (r["round"], r["missing"])
        assert "DatalistError" in r["rejected"][BROKEN]
    assert sorted(report["final"]["global"]) == DATA_OK
    # the failing file's name stayed at the site: not in anything the server wrote
    first_image = broken_image_name(robustness_run)
    server_text = Path(report["_path"]).read_text() + (robustness_run.run_dir / "privacy_audit.jsonl").read_text()
    assert first_image not in server_text
    assert first_image in robustness_run.site_log(BROKEN)
    # the sites that trained (built-in polyp data: resize mode) agree, and the saved model records it
    assert robustness_run.global_model()["train_config"]["spatial_mode"] == "resize"
