"""The per-task time split (fedseg.fl.task_clock) against hand-computed timelines."""

import math

import pytest

from fedseg.fl.task_clock import TASK_CLOCK_KEY, TaskClock, site_clock


def test_split_of_hand_made_timelines():
    clock = TaskClock()
    # sent at 100; site a starts at 100.5, answers at 103, server has it at 103.25
    clock.record("train", 100.0, 103.25, {TASK_CLOCK_KEY: [100.5, 103.0]})
    # site b: 0.25 s to start, 2 s of work, 0.5 s back
    clock.record("train", 100.0, 102.75, {TASK_CLOCK_KEY: [100.25, 102.25]})
    # site c: 1 s, 1 s, 0.75 s
    clock.record("train", 100.0, 102.75, {TASK_CLOCK_KEY: [101.0, 102.0]})
    clock.record("evaluate", 110.0, 110.5, {TASK_CLOCK_KEY: [110.125, 110.25]})
    clock.add_total("train", 3.5)
    clock.add_total("evaluate", 0.5)
    clock.add_total("evaluate", 0.25)  # a task sent twice in one round: its times add up
    assert clock.totals() == {"train": 3.5, "evaluate": 0.75}
    out = clock.breakdown()
    assert out["train"] == {"deliver": 0.5, "site": 2.0, "return": 0.5, "total": 3.5, "answers": 3}
    assert out["evaluate"] == {"deliver": 0.125, "site": 0.125, "return": 0.25, "total": 0.75, "answers": 1}


@pytest.mark.parametrize("meta", [{}, {TASK_CLOCK_KEY: [1.0]}, {TASK_CLOCK_KEY: ["a", 2.0]},
                                  {TASK_CLOCK_KEY: [2.0, 1.0]}, {TASK_CLOCK_KEY: [math.nan, 1.0]},
                                  {TASK_CLOCK_KEY: 5.0}])
def test_a_missing_or_malformed_stamp_counts_only_in_the_total(meta):
    assert site_clock(meta) is None
    clock = TaskClock()
    clock.record("train", 0.0, 1.0, meta)
    clock.add_total("train", 1.5)
    assert clock.breakdown() == {"train": {"total": 1.5, "answers": 0}}


def test_site_service_stamps_every_answer_even_a_failed_one(tmp_path):
    import argparse
    import time

    from fedseg.fl.client import SiteService

    args = argparse.Namespace(datalist=str(tmp_path / "missing.json"), site_datalists=None, data_root=None, bundle_dir=None)
    service = SiteService("site-x", args)
    before = time.time()
    out = service.answer("train", {}, {}, 0)
    started, answered = out["meta"][TASK_CLOCK_KEY]
    assert before <= started <= answered <= time.time()
    assert out["meta"]["error"]  # the task failed (no data), and the stamp still came back


def test_median_breakdown_over_rounds_skips_the_warm_up_round():
    from fedseg.bench.simulator import median_task_breakdown

    def round_(deliver, site, ret, total):
        return {"task_breakdown": {"train": {"deliver": deliver, "site": site, "return": ret, "total": total, "answers": 2}}}

    rounds = [round_(9.0, 9.0, 9.0, 30.0), round_(0.5, 2.0, 0.25, 3.0), round_(0.25, 1.0, 0.5, 2.0), round_(1.0, 3.0, 0.75, 5.0)]
    out = median_task_breakdown(rounds)
    assert out == {"train": {"deliver": 0.5, "site": 2.0, "return": 0.5, "total": 3.0, "framework": 1.0}}
    assert median_task_breakdown([]) == {}
