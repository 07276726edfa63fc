"""Unit tests of ``fedseg bench``'s pieces: paired statistics against scipy, option parsing, ``--set``
validation before any job, per-image evaluation, and ``fedseg infer`` reading the checkpoint's train_config."""

from __future__ import annotations

import json
import os

import pytest
import torch
from scipy import stats as sps

from fedseg.bench.runs import parse_sets, parse_variant
from fedseg.bench.stats import compare, paired_tests, paired_values, seed_spread, summarise_seeds


def _rows(ids, dice):
    return [{"id": i, "dice": d, "hd95": 10 * d, "assd": 1 + d} for i, d in zip(ids, dice)]


#: {seed: {site: rows}} for two approaches; seeds inserted out of order on purpose
A = {
    1: {"s1": _rows(["a.png", "b.png"], [0.61, 0.72]), "s2": _rows(["c.png", "d.png", "e.png"], [0.30, 0.45, 0.50])},
    0: {"s1": _rows(["a.png", "b.png"], [0.70, 0.52]), "s2": _rows(["c.png", "d.png", "e.png"], [0.33, 0.41, 0.58])},
}
B = {
    0: {"s1": _rows(["a.png", "b.png"], [0.65, 0.50]), "s2": _rows(["c.png", "d.png", "e.png"], [0.20, 0.47, 0.51])},
    1: {"s1": _rows(["a.png", "b.png"], [0.60, 0.64]), "s2": _rows(["c.png", "d.png", "e.png"], [0.35, 0.40, 0.42])},
    2: {"s1": _rows(["a.png", "b.png"], [0.1, 0.1]), "s2": _rows(["c.png", "d.png", "e.png"], [0.1, 0.1, 0.1])},
}


def test_pairing_pools_common_seeds_in_order_and_matches_scipy():
    x, y, keys = paired_values(A, B, "dice", ["s1", "s2"])
    # seed 2 exists only in B: left out; seeds ascending, then sites in the given order, then images
    assert keys == [(0, "s1", "a.png"), (0, "s1", "b.png"), (0, "s2", "c.png"), (0, "s2", "d.png"), (0, "s2", "e.png"),
                    (1, "s1", "a.png"), (1, "s1", "b.png"), (1, "s2", "c.png"), (1, "s2", "d.png"), (1, "s2", "e.png")]
    assert x == [0.70, 0.52, 0.33, 0.41, 0.58, 0.61, 0.72, 0.30, 0.45, 0.50]
    assert y == [0.65, 0.50, 0.20, 0.47, 0.51, 0.60, 0.64, 0.35, 0.40, 0.42]
    res = paired_tests(x, y)
    assert res["wilcoxon_p"] == pytest.approx(sps.wilcoxon(x, y).pvalue, rel=1e-12)
    assert res["wilcoxon_stat"] == pytest.approx(sps.wilcoxon(x, y).statistic)
    assert res["ttest_p"] == pytest.approx(sps.ttest_rel(x, y).pvalue, rel=1e-12)
    assert res["n"] == 10 and res["mean_diff"] == pytest.approx(sum(a - b for a, b in zip(x, y)) / 10)


def test_compare_per_site_and_metric():
    out = compare(A, B, ["s1", "s2"])
    x, y, _ = paired_values(A, B, "hd95", ["s2"])
    assert len(x) == 6
    assert out["hd95"]["per_site"]["s2"]["wilcoxon_p"] == pytest.approx(sps.wilcoxon(x, y).pvalue)
    assert out["dice"]["all"]["n"] == 10


def test_pairing_refuses_different_images_and_degenerate_tests():
    bad = {0: {"s1": _rows(["a.png", "z.png"], [0.1, 0.2])}}
    with pytest.raises(ValueError, match="test images differ"):
        paired_values(bad, {0: {"s1": _rows(["a.png", "b.png"], [0.1, 0.2])}}, "dice", ["s1"])
    same = paired_tests([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert same["wilcoxon_p"] is None and "zero" in same["note"]
    assert paired_tests([0.5], [0.4])["ttest_p"] is None


def test_seed_summary_mean_and_sample_std():
    final = {0: {"s1": {"dice": 0.5}, "s2": {"dice": 0.7}}, 1: {"s1": {"dice": 0.6}, "s2": {"dice": 0.9}}}
    out = summarise_seeds(final, ["s1", "s2"], metrics=("dice",))
    assert out["s1"]["dice"]["mean"] == pytest.approx(0.55)
    assert out["s1"]["dice"]["std"] == pytest.approx(torch.tensor([0.5, 0.6]).double().std().item())
    assert out["mean"]["dice"]["values"] == pytest.approx([0.6, 0.75])
    assert seed_spread([0.3])["std"] == 0.0 and seed_spread([None])["mean"] is None


def test_parse_variant_keeps_compare_syntax():
    assert parse_variant("fedavg") == ("fedavg", "fedavg", {})
    assert parse_variant("graph_only=graphfedseg:gamma=0,lam=0") == ("graph_only", "graphfedseg", {"gamma": 0, "lam": 0})
    assert parse_variant("graphfedseg:uncertainty_pass=last_epoch") == (
        "graphfedseg:uncertainty_pass=last_epoch", "graphfedseg", {"uncertainty_pass": "last_epoch"})
    assert parse_variant("fp=fedevi:use_gap=false") == ("fp", "fedevi", {"use_gap": False})


def test_parse_sets_json_values_and_unknown_key():
    assert parse_sets(["batch_size=8", "channels=[8,16]", "optimizer_name=AdamW", "dp_target_epsilon=null"]) == {
        "batch_size": 8, "channels": [8, 16], "optimizer_name": "AdamW", "dp_target_epsilon": None}
    with pytest.raises(ValueError, match="unknown train_config keys \\['batch'\\]"):
        parse_sets(["batch=8"])


@pytest.mark.parametrize("argv", [
    ["run", "fedavg", "--set", "learning_rat=0.1"],
    ["bench", "--out", "OUT", "--family", "polyp", "--methods", "fedavg", "--set", "learning_rat=0.1"],
])
def test_unknown_set_key_fails_before_any_job(argv, tmp_path, monkeypatch):
    import subprocess

    import fedseg.cli as cli

    def forbidden(*a, **k):
        raise AssertionError("a job was started or exported")

    monkeypatch.setattr(subprocess, "call", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(cli, "export_job", forbidden)
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("OUT", str(tmp_path / "bench")) for a in argv]
    with pytest.raises(SystemExit, match="learning_rat"):
        cli.main(argv)
    assert not (tmp_path / "bench").exists() and not (tmp_path / "workspaces").exists()


def test_unknown_method_in_bench_fails_before_any_job(tmp_path):
    from fedseg.cli import main

    with pytest.raises(SystemExit, match="twice|share the label"):
        main(["bench", "--out", str(tmp_path / "b"), "--methods", "fedavg", "fedavg", "--references"])
    assert not (tmp_path / "b").exists()


def test_evaluate_per_image_rows_match_summary(tiny_engine):
    model = tiny_engine.build_network()
    summary, rows = tiny_engine.evaluate(model, "test", per_image=True)
    entries = tiny_engine.data["test"]
    assert [r["id"] for r in rows] == [os.path.basename(e["image"]) for e in entries]
    for metric in ("dice", "hd95", "assd"):
        assert summary[metric] == pytest.approx(sum(r[metric] for r in rows) / len(rows))
    assert tiny_engine.evaluate(model, "test") == pytest.approx(summary)


def _checkpoint_with_train_config(path, train_config):
    from fedseg.recipes.base import build_initial_network

    net = build_initial_network(train_config)
    torch.save({"model": net.state_dict(), "train_conf": {"train": {"model": "FeatureUNet"}},
                "train_config": train_config}, path)
    return path


def test_infer_uses_the_checkpoint_train_config(tmp_path, tiny_datalist, tiny_train_config, monkeypatch):
    import fedseg.inference as inference

    cfg = {**tiny_train_config, "image_size": 48, "channels": [4, 8, 16, 32]}
    ckpt = _checkpoint_with_train_config(tmp_path / "FL_global_model.pt", cfg)
    assert inference.checkpoint_train_config(ckpt)["image_size"] == 48
    assert "local_epochs" not in inference.checkpoint_train_config(ckpt)  # not a bundle variable

    seen = []
    original = inference._workflow

    def spy(*args, **kwargs):
        workflow = original(*args, **kwargs)
        seen.append(workflow.parser.get_parsed_content("image_size"))
        return workflow

    monkeypatch.setattr(inference, "_workflow", spy)
    # no overrides: the bundle default (64 px, 5 levels) would not even fit these weights
    written = inference.run_inference(ckpt, tmp_path / "masks", datalist=tiny_datalist, split="test")
    assert seen == [48] and written and all(p.is_file() for p in written)
    # explicit overrides win over the stored configuration
    inference.run_inference(ckpt, tmp_path / "masks32", datalist=tiny_datalist, split="test", overrides={"image_size": 32})
    assert seen == [48, 32]


def test_infer_cli_without_override(tmp_path, tiny_datalist, tiny_train_config):
    from fedseg.cli import main

    cfg = {**tiny_train_config, "image_size": 48, "channels": [4, 8, 16, 32]}
    ckpt = _checkpoint_with_train_config(tmp_path / "site-1.pt", cfg)
    main(["infer", "--checkpoint", str(ckpt), "--datalist", str(tiny_datalist), "--output", str(tmp_path / "out")])
    assert len(list((tmp_path / "out").glob("*_seg.png"))) == len(json.loads(open(tiny_datalist).read())["test"])


def test_compare_script_maps_onto_fedseg_bench(tmp_path):
    """``benchmarks/compare.py`` only translates its options into a ``fedseg bench`` command line."""
    import importlib.util
    from pathlib import Path

    from fedseg.cli import build_parser

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "compare.py"
    spec = importlib.util.spec_from_file_location("compare_script", path)
    compare_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare_script)
    import argparse

    args = argparse.Namespace(scenario="vessel", sites=["a", "b"], data_profile="tiny", methods=["fedavg", "x=fvac:beta=1"],
                              references=[], seed=3, seeds=None, profile="tiny", rounds=2, local_epochs=1, image_size=32,
                              task_check_period=0.5, omp_threads="1", task_request_interval=0.2, participants=None)
    parsed = build_parser().parse_args(compare_script.bench_argv(args, tmp_path))
    assert parsed.cmd == "bench" and parsed.family == "vessel" and parsed.sites == ["a", "b"]
    assert parsed.methods == ["fedavg", "x=fvac:beta=1"] and parsed.references == [] and parsed.seeds == [3]
    assert (parsed.rounds, parsed.local_epochs, parsed.image_size, parsed.task_request_interval) == (2, 1, 32, 0.2)



def test_payload_bytes_counts_tensors_arrays_and_numbers():
    import numpy as np
    import torch

    from fedseg.fl.controller import payload_bytes

    value = {"w": torch.zeros(2, 3), "b": torch.zeros(5, dtype=torch.float64), "n": 7, "s": [0.1, 0.2, 0.3],
             "noise": np.zeros((4, 3, 8, 8), np.float32), "name": "site-1"}
    assert payload_bytes(value) == 2 * 3 * 4 + 5 * 8 + 8 + 3 * 8 + 4 * 3 * 8 * 8 * 4
