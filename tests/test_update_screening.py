"""Hostile or broken updates are rejected before aggregation, each with its reason; honest ones pass."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from nvflare.app_common.abstract.fl_model import FLModel

from fedseg.fl.controller import FedSegController, RoundStats, broadcast_groups
from fedseg.fl.protocol import pack_models
from fedseg.fl.screening import (
    MAIN_MODEL,
    ScreeningConfig,
    check_result,
    check_statistic_ranges,
    coordinate_median,
    is_zero_model,
    screen_models,
    update_geometry,
)
from fedseg.fl.validation import InvalidUpdateError
from fedseg.objectives.registry import build_objective
from fedseg.strategies.base import SitePayload

CFG = ScreeningConfig()


def _model(seed: int, scale: float = 1.0, base=None):
    g = torch.Generator().manual_seed(seed)
    base = base or {"w": torch.ones(4, 3), "b": torch.zeros(3)}
    # honest updates share a direction (the common signal) plus site noise
    return {k: v + scale * (0.1 + 0.03 * torch.randn(v.shape, generator=g)) for k, v in base.items()}


GLOBAL = {"w": torch.ones(4, 3), "b": torch.zeros(3)}


def _sites(n: int, **overrides):
    models = {f"s{i}": {MAIN_MODEL: _model(i)} for i in range(n)}
    for site, params in overrides.items():
        models[site] = {MAIN_MODEL: params}
    sent = {s: {MAIN_MODEL: GLOBAL} for s in models}
    return models, sent


def test_honest_sites_pass():
    assert screen_models(*_sites(5), CFG) == {}


def test_scaled_update_rejected_by_norm_rule():
    scaled = {k: GLOBAL[k] + 100 * (v - GLOBAL[k]) for k, v in _model(9).items()}
    rejected = screen_models(*_sites(4, s3=scaled), CFG)
    assert list(rejected) == ["s3"] and "median of the other sites" in rejected["s3"]


def test_flipped_update_rejected_by_update_cosine_rule_against_a_consensus():
    flipped = {k: GLOBAL[k] - (v - GLOBAL[k]) for k, v in _model(9).items()}
    assert screen_models(*_sites(4, s3=flipped), CFG) == {}  # the direction rule is off by default
    rejected = screen_models(*_sites(4, s3=flipped), ScreeningConfig(min_update_cosine=-0.3))
    assert list(rejected) == ["s3"] and "update points against the other sites'" in rejected["s3"]


def test_sign_flipped_model_rejected_by_model_cosine_even_with_two_sites():
    negated = {k: -v for k, v in _model(9).items()}
    for n in (1, 4):
        rejected = screen_models(*_sites(n, s9=negated), CFG)
        assert list(rejected) == ["s9"] and "opposite model: cosine -" in rejected["s9"]


def test_honest_updates_without_consensus_are_not_rejected():
    # measured on the tiny profile: honest updates are nearly orthogonal (pairwise cosine ~0.05)
    g = torch.Generator().manual_seed(0)
    models = {f"s{i}": {MAIN_MODEL: {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in GLOBAL.items()}} for i in range(6)}
    sent = {s: {MAIN_MODEL: GLOBAL} for s in models}
    assert screen_models(models, sent, CFG) == {}


def test_relative_rules_need_three_sites():
    scaled = {k: GLOBAL[k] + 100 * (v - GLOBAL[k]) for k, v in _model(9).items()}
    assert screen_models(*_sites(1, s1=scaled), CFG) == {}
    # the absolute bound applies whatever the number of sites
    cfg = ScreeningConfig(max_update_norm=5.0)
    rejected = screen_models(*_sites(1, s1=scaled), cfg)
    assert list(rejected) == ["s1"] and "max_update_norm" in rejected["s1"]


def test_disabled_screening_passes_everything():
    flipped = {k: GLOBAL[k] - 50 * (v - GLOBAL[k]) for k, v in _model(9).items()}
    assert screen_models(*_sites(4, s3=flipped), ScreeningConfig(enabled=False)) == {}


def test_update_measured_from_what_each_site_was_sent():
    # personalised payloads (GraphFedSeg): a site far from the global but close to its own model is honest
    models, sent = _sites(4)
    far = {k: v + 1000.0 for k, v in GLOBAL.items()}
    models["s3"] = {MAIN_MODEL: {k: v + (m - GLOBAL[k]) for (k, v), m in zip(far.items(), _model(3).values())}}
    sent["s3"] = {MAIN_MODEL: far}
    assert screen_models(models, sent, CFG) == {}


def test_packed_models_each_screened():
    # FedEFM's overseas task: no main model, one guest model per host, each against the guest that was sent
    guests = {f"s{i}": {f"guest@s{(i + 1) % 4}": _model(i)} for i in range(4)}
    sent = {s: {name: GLOBAL for name in named} for s, named in guests.items()}
    assert screen_models(guests, sent, CFG) == {}
    guests["s2"] = {"guest@s3": {k: GLOBAL[k] + 100 * (v - GLOBAL[k]) for k, v in _model(2).items()}}
    rejected = screen_models(guests, sent, CFG)
    assert list(rejected) == ["s2"] and "[guest@s3]" in rejected["s2"]


def test_geometry_against_numpy():
    models, sent = _sites(5)
    flat = {(s, n): p for s, named in models.items() for n, p in named.items()}
    ref = {(s, n): GLOBAL for s, n in flat}
    geometry = update_geometry(flat, ref)
    u = np.stack([np.concatenate([(p[k] - GLOBAL[k]).numpy().ravel() for k in ("w", "b")]) for p in (flat[i] for i in flat)])
    median = np.median(u, axis=0)
    g = np.concatenate([GLOBAL[k].numpy().ravel() for k in ("w", "b")])
    for row, ident in zip(u, flat):
        norm, cos, model_cos = geometry[ident]
        assert norm == pytest.approx(np.linalg.norm(row))
        assert cos == pytest.approx(row @ median / (np.linalg.norm(row) * np.linalg.norm(median)))
        w = row + g
        assert model_cos == pytest.approx(w @ g / (np.linalg.norm(w) * np.linalg.norm(g)))


@settings(max_examples=40, deadline=2000)
@given(st.lists(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3), min_size=1, max_size=9))
def test_coordinate_median_is_numpys(rows):
    x = np.asarray(rows)
    np.testing.assert_allclose(coordinate_median(torch.as_tensor(x)).numpy(), np.median(x, axis=0))


def test_coordinate_median_beyond_the_sorting_network_is_numpys():
    """More sites than the sorting network takes (a sort along the first axis), odd and even K."""
    from fedseg.fl.screening import SORTING_NETWORK_SITES

    rng = np.random.default_rng(0)
    for k in (SORTING_NETWORK_SITES + 1, SORTING_NETWORK_SITES + 2):
        x = rng.normal(size=(k, 5))
        np.testing.assert_allclose(coordinate_median(torch.as_tensor(x)).numpy(), np.median(x, axis=0))


def test_zero_model_and_stale_round_and_ranges():
    zero = {"w": torch.zeros(4, 3), "b": torch.zeros(3), "n": torch.tensor(3)}
    assert is_zero_model(zero) and not is_zero_model({"n": torch.tensor(0)}) and not is_zero_model(GLOBAL)
    with pytest.raises(InvalidUpdateError, match="all-zero model"):
        check_result("s1", {MAIN_MODEL: zero}, {}, {}, 2, 2, CFG)
    with pytest.raises(InvalidUpdateError, match="stale update: result is for round 1, current round is 2"):
        check_result("s1", {MAIN_MODEL: GLOBAL}, {}, {}, 1, 2, CFG)
    check_result("s1", {MAIN_MODEL: GLOBAL}, {}, {}, None, 2, CFG)  # a result without a round: not judged
    with pytest.raises(InvalidUpdateError, match=r"'n_samples' = -3.0 outside its valid range \[0.0, inf\]"):
        check_result("s1", {}, {"n_samples": -3.0}, {"n_samples": (0.0, math.inf)}, 2, 2, CFG)


@pytest.mark.parametrize(
    "objective, statistics",
    [
        ("graphfedseg", {"uncertainty": -0.1}),
        ("fedevi", {"A": -1.0}),
        ("fedefm", {"teacher_weights": [0.4, 1.2]}),
        ("fedefm", {"teacher_emd": [-0.5]}),
        ("pathfl", {"cse_std": [0.1, -0.2, 0.1]}),
    ],
)
def test_declared_ranges_of_each_objective(objective, statistics):
    ranges = build_objective(objective).statistic_ranges
    with pytest.raises(InvalidUpdateError, match="outside its valid range"):
        check_statistic_ranges("s1", statistics, ranges)
    valid = {k: ([0.5] * len(v) if isinstance(v, list) else 0.5) for k, v in statistics.items()}
    check_statistic_ranges("s1", valid, ranges)


@pytest.mark.parametrize(
    "options, message",
    [({"norm_factor": 0.5}, "norm_factor"), ({"min_sites": 2}, "min_sites"), ({"min_model_cosine": 2}, "min_model_cosine"), ({"min_update_cosine": -3}, "min_update_cosine"),
     ({"max_update_norm": -1}, "max_update_norm"), ({"norm_factr": 3}, "unknown screening options")],
)
def test_bad_screening_options(options, message):
    with pytest.raises(ValueError, match=message):
        ScreeningConfig.from_options(options)


# ------------------------------------------------------------------ the controller's exchange, end to end
class ScriptedController(FedSegController):
    """The real ``_exchange`` with NVFlare's transport replaced by scripted site answers."""

    def __init__(self, answers, **kwargs):
        super().__init__(min_clients=2, **kwargs)
        self.answers = answers  # list of (site, params, meta, round)
        self.logged = []

    def send_model(self, task_name, data, targets=None, timeout=0, callback=None):
        for site, params, meta, round_ in [a for a in self.answers if a[0] in targets or a[0] == "intruder"]:
            callback(FLModel(params=params, meta={"client_name": site, **meta}, metrics={"val_dice": 0.5}, current_round=round_))
        self.answers = [a for a in self.answers if not (a[0] in targets or a[0] == "intruder")]

    def get_num_standing_tasks(self):
        return 0

    def warning(self, msg, *args, **kwargs):
        self.logged.append(msg)


def test_exchange_rejects_each_hostile_result_with_its_reason():
    sites = [f"site-{i}" for i in range(1, 7)]
    good = lambda i: {k: v.numpy() for k, v in _model(i).items()}  # noqa: E731
    answers = [(s, good(i), {"n_samples": 10}, 3) for i, s in enumerate(sites[:3])]
    answers += [
        ("site-4", {k: GLOBAL[k].numpy() + 100 * (v - GLOBAL[k].numpy()) for k, v in good(4).items()}, {"n_samples": 10}, 3),
        ("site-5", good(5), {"n_samples": 10, "round": 2}, 3),  # stale: the site says it trained for round 2
        ("site-6", {k: np.zeros_like(v) for k, v in good(6).items()}, {"n_samples": 10}, 3),
        ("site-1", good(11), {"n_samples": 10}, 3),  # a second answer under site-1's name
        ("intruder", good(12), {"n_samples": 10}, 3),
    ]
    controller = ScriptedController(answers)
    controller._reference = dict(GLOBAL)
    payloads = {s: SitePayload(params=GLOBAL) for s in sites}
    stats = RoundStats()
    results = controller._exchange("train", payloads, 3, stats=stats)
    assert sorted(results) == ["site-2", "site-3"]
    reasons = stats.rejected
    assert "duplicated site name" in reasons["site-1"]
    assert "median of the other sites" in reasons["site-4"]
    assert "stale update" in reasons["site-5"]
    assert "all-zero model" in reasons["site-6"]
    assert "not sent" in reasons["intruder"]
    assert all(r.startswith("train: ") for r in reasons.values())


def test_exchange_counts_the_bytes_the_sites_sent_not_the_task_meta_nvflare_echoes():
    """NVFlare's ModelController puts the task's meta into every result on the server ("props"); a method that
    sends a model-sized vector in the task meta (GraphFedSeg's neighbour direction) must not count it as upload."""
    params = {k: v.numpy() for k, v in _model(1).items()}
    echoed = {"props": {"graphfedseg": {"direction": np.zeros(10_000, dtype=np.float32)}}}
    controller = ScriptedController([(s, params, {"n_samples": 10, "uncertainty": 0.5, **echoed}, 0) for s in ("a", "b")])
    controller._reference = dict(GLOBAL)
    stats = RoundStats()
    controller._exchange("train", {s: SitePayload(params=GLOBAL) for s in "ab"}, 0, stats=stats)
    weights = sum(v.nbytes for v in params.values())
    # per site: the weights and two numbers at 8 bytes each (the echoed 40 kB and the name are left out)
    assert stats.bytes_received == 2 * (weights + 2 * 8)


def test_exchange_screens_packed_models():
    sites = ["a", "b", "c", "d"]
    answers = [(s, pack_models({"guest@x": {k: v.numpy() for k, v in _model(i).items()}}), {"n_samples": 5}, 0) for i, s in enumerate(sites)]
    scaled = {k: GLOBAL[k].numpy() + 100 * (v - GLOBAL[k].numpy()) for k, v in {k: v.numpy() for k, v in _model(7).items()}.items()}
    answers[2] = ("c", pack_models({"guest@x": scaled}), {"n_samples": 5}, 0)
    controller = ScriptedController(answers, strategy="fedefm", objective="fedefm")
    controller._reference = dict(GLOBAL)
    payloads = {s: SitePayload(params=pack_models({"guest@x": GLOBAL})) for s in sites}
    stats = RoundStats()
    results = controller._exchange("overseas_train", payloads, 0, stats=stats)
    assert sorted(results) == ["a", "b", "d"]
    assert "[guest@x]" in stats.rejected["c"] and "median of the other sites" in stats.rejected["c"]


def test_a_broadcast_is_one_task_and_a_site_with_its_own_params_or_meta_has_its_own():
    shared, own = dict(GLOBAL), dict(GLOBAL)  # the same tensors; `own` is another dict: a site's own payload
    payloads = {"a": SitePayload(params=shared), "b": SitePayload(params=shared), "c": SitePayload(params=own),
                "d": SitePayload(params=shared)}
    assert broadcast_groups(payloads) == [["a", "b", "d"], ["c"]]
    good = {k: v.numpy() for k, v in _model(1).items()}
    controller = ScriptedController([(s, good, {"n_samples": 10}, 0) for s in "abcd"])
    controller._reference = dict(GLOBAL)
    tasks = []
    send = controller.send_model
    controller.send_model = lambda task_name, data, targets=None, **kw: (tasks.append(list(targets)),
                                                                         send(task_name, data, targets=targets, **kw))
    stats = RoundStats()
    assert sorted(controller._exchange("train", payloads, 0, stats=stats)) == ["a", "b", "c", "d"]
    assert tasks == [["a", "b", "d"], ["c"]]
    assert stats.bytes_sent > 0 and set(stats.clock.totals()) == {"train"} and stats.rejected == {}
    # a broadcast whose sites' metas differ goes out as one task per site
    payloads = {s: SitePayload(params=shared, meta={"k": i}) for i, s in enumerate("ab")}
    controller.answers, tasks[:] = [(s, good, {"n_samples": 10}, 0) for s in "ab"], []
    controller._exchange("train", payloads, 0)
    assert tasks == [["a"], ["b"]]


def test_round_stats_report_fields_in_the_reports_order():
    stats = RoundStats()
    stats.rejected["a"] = "train: a: bad"
    stats.bytes_sent, stats.bytes_received = 3, 5
    stats.clock.add_total("train", 1.5)
    fields = stats.report_fields()
    assert list(fields) == ["rejected", "screening", "wall_time", "server_cpu_time", "task_times", "task_breakdown",
                            "bytes_sent", "bytes_received", "server_peak_memory_mb"]
    assert fields["server_cpu_time"] >= 0
    assert fields["rejected"] == {"a": "train: a: bad"} and fields["rejected"] is not stats.rejected
    assert (fields["bytes_sent"], fields["bytes_received"], fields["task_times"]) == (3, 5, {"train": 1.5})
    assert fields["wall_time"] >= 0 and fields["task_breakdown"]["train"]["total"] == 1.5


# ------------------------------------------------------------------------------ test-only fault injection
def test_fault_injection_parses_and_distorts_as_documented():
    from fedseg.fl.faults import apply_faults, faults_for, parse_faults

    env = {"FEDSEG_FAULT_INJECTION": "site-2:scale=10@1, site-2:sign_flip@2,site-3:zero,site-3:stale@1,site-4:bad_stat,site-4:flip_update"}
    assert [f.kind for f in faults_for("site-2", env)] == ["scale", "sign_flip"] and faults_for("site-9", env) == []
    assert faults_for("site-2", {}) == []  # unset: nothing
    sent = {"w": torch.ones(2), "n": torch.tensor(3)}
    out = {"params": {"w": torch.tensor([2.0, 3.0]), "n": torch.tensor(4)}, "metrics": {}, "meta": {"n_samples": 7, "round": 1}}
    scaled = apply_faults(faults_for("site-2", env), "train", 1, out, sent)
    torch.testing.assert_close(scaled["params"]["w"], torch.tensor([11.0, 21.0]))
    assert int(scaled["params"]["n"]) == 4  # integer entries untouched
    torch.testing.assert_close(apply_faults(faults_for("site-2", env), "train", 2, out, sent)["params"]["w"], torch.tensor([-2.0, -3.0]))
    assert apply_faults(faults_for("site-2", env), "train", 0, out, sent) == out  # no fault this round
    assert apply_faults(faults_for("site-2", env), "evaluate", 1, out, sent) == out  # train results only
    broken = apply_faults(faults_for("site-3", env), "train", 1, out, sent)
    assert not broken["params"]["w"].any() and broken["meta"]["round"] == 0
    hostile = apply_faults(faults_for("site-4", env), "train", 1, out, sent)
    assert hostile["meta"]["n_samples"] == -7
    torch.testing.assert_close(hostile["params"]["w"], torch.tensor([0.0, -1.0]))  # 1 - (w - 1)
    for bad in ("site-2", "site-2:explode", "site-2:scale=abc", ":zero"):
        with pytest.raises(ValueError, match="FEDSEG_FAULT_INJECTION"):
            parse_faults(bad)


def test_a_site_that_cannot_read_its_data_is_left_out_and_the_others_continue():
    """The site loop answers a failed task with the exception type only (``fedseg.fl.client``): the server
    records that type, never the site's file names, and aggregates the other sites."""
    good = lambda i: {k: v.numpy() for k, v in _model(i).items()}  # noqa: E731
    answers = [(s, good(i), {"n_samples": 10, "round": 0}, 0) for i, s in enumerate(["a", "b", "c"])]
    answers.append(("d", {}, {"error": "DatalistError"}, 0))
    controller = ScriptedController(answers)
    controller._reference = dict(GLOBAL)
    stats = RoundStats()
    results = controller._exchange("train", {s: SitePayload(params=GLOBAL) for s in "abcd"}, 0, stats=stats)
    assert sorted(results) == ["a", "b", "c"]
    assert stats.rejected == {"d": "train: d: the site could not run the task (DatalistError; details in its log)"}
