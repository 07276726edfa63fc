"""PathFL end to end in NVFlare's simulator on tiny built-in nuclei data: the full method with a privacy
audit (the shared ``pathfl`` run), and each module switched off on its own (2 sites, 1 round, the real server
workflow with in-process sites; tests/README.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inprocess import builtin_sites, run_in_process
from sim_utils import read_audit

SITES = ["site-1", "site-2", "site-3"]
STRATA = ["enc0", "enc1", "enc2", "bottleneck", "dec2", "dec1", "dec0", "head"]  # tiny U-Net, depth 3
CSE_KEYS = {"cse_mean", "cse_std"}
AFA_KEYS = {"afa_mean", "afa_sq_mean"}


@pytest.mark.shared_runs("pathfl")
def test_pathfl_job_report_and_privacy_audit(shared_runs):
    run = shared_runs("pathfl")
    report = run.report
    assert report["method"] == "pathfl"
    cfg = report["config"]
    assert cfg["train_config"]["data_family"] == "nuclei" and cfg["train_config"]["feature_alignment"] is True
    assert cfg["use_cse"] and cfg["use_afa"] and cfg["use_ssa"]
    for r in report["rounds"]:
        assert r["style_pool_size"] == 3
        assert r["ssa_sites"] == SITES
        assert list(r["ssa_similarity"]) == STRATA == list(r["ssa_coefficients"])
        for stratum in STRATA:
            sim = np.array(r["ssa_similarity"][stratum])
            mix = np.array(r["ssa_coefficients"][stratum])
            assert sim.shape == mix.shape == (3, 3)
            np.testing.assert_allclose(np.diag(sim), 1.0, atol=1e-6)
            np.testing.assert_allclose(mix.sum(1), 1.0, atol=1e-9)
            assert r["ssa_weights"][stratum] == pytest.approx(mix.mean(0).tolist())
        assert r["afa_global_std"] > 0 and math.isfinite(r["afa_global_mean"])
    for s in SITES:
        assert all(math.isfinite(v) for v in report["final"]["global"][s].values())
        assert (run.site_outputs(s) / "pathfl_cse_examples.png").is_file()  # site-local figure of restyled patches
    # the final model carries the global moments (bundle inference reproduces the alignment)
    ckpt = run.global_model()
    last = report["rounds"][-1]
    assert float(ckpt["model"]["bottleneck_alignment.active"]) == 1.0
    assert float(ckpt["model"]["bottleneck_alignment.target_mean"]) == pytest.approx(last["afa_global_mean"], rel=1e-5)
    assert ckpt["train_config"]["feature_alignment"] is True

    # payload accounting: each site sends its weights, 2 x 3 style numbers, 2 moments, n_samples, the
    # train metrics and a (4, 3, 64, 64) float32 noise batch per round
    n_weights = sum(v.numel() * v.element_size() for v in ckpt["model"].values())
    for r in report["rounds"]:
        per_site = r["bytes_received"] / 3
        assert n_weights + 4 * 3 * 64 * 64 * 4 <= per_site <= n_weights + 4 * 3 * 64 * 64 * 4 + 1000  # + a few dozen numbers
        assert r["bytes_sent"] >= 3 * n_weights

    # privacy: weights plus 2 x 3 style numbers, 2 moments and a noise batch of the declared shape
    audit = read_audit(report)
    train = [a for a in audit if a["task"] == "train"]
    assert len(train) == 3 * len(report["rounds"])
    for rec in train:
        # (NVFlare carries the scalar train metrics in "initial_metrics")
        assert set(rec["meta"]) - {"initial_metrics"} == {"n_samples", "round", "task_clock", "spatial"} | CSE_KEYS | AFA_KEYS | {"ssa_noise"}
        assert all(v["type"] == "float" for v in rec["meta"]["initial_metrics"]["items"].values())
        assert rec["meta"]["ssa_noise"]["shape"] == [4, 3, 64, 64]
        assert all(rec["meta"][k] == {"type": "list", "length": 3} for k in CSE_KEYS)
        assert all(rec["meta"][k]["type"] == "float" for k in AFA_KEYS)
    for rec in (a for a in audit if a["task"] == "evaluate"):
        assert rec["params"] == {} and not set(rec["meta"]) & (CSE_KEYS | AFA_KEYS | {"ssa_noise"})


@pytest.fixture(scope="module")
def nuclei_sites(tmp_path_factory):
    return builtin_sites("nuclei", SITES[:2], tmp_path_factory.mktemp("nuclei"))


@pytest.mark.parametrize("switch", ["use_cse", "use_afa", "use_ssa"])
def test_pathfl_each_module_switches_off(switch, nuclei_sites, tmp_path):
    """Each module off on its own (2 sites, 1 round), through the real server workflow with in-process sites
    (``fedseg.bench.inprocess``; the full method's NVFlare run is the shared ``pathfl`` run above): what the sites
    send and what the server reports lose exactly that module."""
    report = run_in_process("pathfl", nuclei_sites, tmp_path, num_rounds=1, local_epochs=1, **{switch: False})
    sites = list(nuclei_sites)
    assert report["config"][switch] is False
    sent = set().union(*(set(a["meta"]) for a in report["_controller"].received if a["task"] == "train"))
    last = report["rounds"][-1]
    if switch == "use_cse":
        assert not sent & CSE_KEYS and "style_pool_size" not in last
        assert not (tmp_path / "sites" / "site-1" / "fedseg_outputs" / "site-1" / "pathfl_cse_examples.png").exists()
    if switch == "use_afa":
        assert not sent & AFA_KEYS and "afa_global_mean" not in last
        assert report["config"]["train_config"]["feature_alignment"] is False
    if switch == "use_ssa":
        assert "ssa_noise" not in sent and "ssa_similarity" not in last
        assert sorted(last["aggregation_weight"]) == sites
    for s in sites:
        assert all(math.isfinite(v) for v in report["final"]["global"][s].values())
