"""The cost page's HE table (``benchmarks/cost/render.py``: ``he_cost_rows``, ``render_he_cost``) from a small record
of ``benchmarks/cost/he_cost.py``'s shape (no run here)."""

import importlib
import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def render():
    """``benchmarks.cost.render``, imported as the command does (``reproduce.py`` puts this ``benchmarks`` first)."""
    spec = importlib.util.spec_from_file_location("reproduce_for_he_cost_test", BENCHMARKS / "reproduce.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return importlib.import_module("benchmarks.cost.render")


def _mode(round_s, cpu, up, down, dice):
    return {"median_round_s": round_s, "median_server_cpu_s": cpu, "bytes_up_per_round": up, "bytes_down_per_round": down,
            "final_test_dice": dice}


def _record():
    plain = _mode(2.0, 0.5, 24e6, 24e6, {"site-2": 0.8, "site-1": 0.6})
    he = _mode(8.0, 5.0, 360e6, 200e6, {"site-2": 0.8, "site-1": 0.6001})
    run = {"loadavg_at_start": [1.5, 1.0, 1.0]}
    return {
        "date": "2026-11-29T16:00:00", "code_version": {"commit": "abc1234", "dirty": False}, "rounds": 3, "repeats": 2,
        "command": "python benchmarks/cost/he_cost.py --out {root}/he_cost_cpu",
        "machine": {"cpu_count": 2, "torch": "2.13.0+cpu", "gpus": []},
        "arms": {"fedavg-2d": {
            "method": "fedavg", "family": "polyp", "data_profile": "default", "sites": ["site-1", "site-2"],
            "parameters": 1941122, "modes": {"plain": plain, "he": he},
            "ratio_he_over_plain": {"median_round_s": 4.0, "median_server_cpu_s": 10.0, "bytes_up_per_round": 15.0,
                                    "bytes_down_per_round": 200 / 24},
            "accuracy": {"max_abs_diff_global_model": 1.4e-3, "plain_repeats_max_abs_diff": 0.0,
                         "he_repeats_max_abs_diff": 9e-4, "max_abs_diff_final_test_dice": 1e-4,
                         "one_round": {"max_abs_diff_global_model": 1.6e-7, "ckks_bound_one_aggregation": 1e-5}},
            "commands": {"plain": "fedseg run fedavg --rounds 3", "he": "fedseg run fedavg --rounds 3 --he"},
            "runs": {"plain": [run], "he": [run]}}},
    }


def test_he_cost_rows_show_each_mode_their_ratio_and_how_far_the_models_part(render):
    lines = render.he_cost_rows(_record())
    assert len(lines) == 2 + 3  # header, rule, plain, HE, ratio
    plain, he, ratio = ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])
    assert plain[1:8] == ["in the clear", "1,941,122", "2.00", "0.50", "24.00", "24.00", "0.600 / 0.800"]
    assert he[1:8] == ["HE (CKKS)", "1,941,122", "8.00", "5.00", "360.00", "200.00", "0.600 / 0.800"]
    assert he[8] == "after 1 round 1.6e-07 (CKKS bound 1.0e-05); after 3 rounds 1.4e-03 (two plain runs 0)"
    assert ratio[1:8] == ["HE / plain", "", "4.00x", "10.00x", "15.00x", "8.33x", "largest difference 1.0e-04"]


def test_render_he_cost_captions_the_command_the_load_and_the_he_runs(render):
    lines = render.render_he_cost("he-cost-cpu", {"title": "HE against the clear"}, [_record()])
    assert lines[0].startswith("**HE against the clear.**") and lines[1] == ""
    for part in ("`python benchmarks/cost/he_cost.py --out {root}/he_cost_cpu`", "load at the runs' starts 1.5-1.5",
                 "two HE runs: at most 9.0e-04", "`fedseg run fedavg --rounds 3 --he`",
                 "`python benchmarks/reproduce.py he-cost-cpu --run`"):
        assert part in lines[0], part
    assert lines[2:] == render.he_cost_rows(_record())
