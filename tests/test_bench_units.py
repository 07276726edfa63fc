"""Unit tests of ``fedseg bench``'s pieces: paired statistics against scipy, option parsing, ``--set``
validation before any job, per-image evaluation, and ``fedseg infer`` reading the checkpoint's train_config."""

from __future__ import annotations

import json
import os

from pathlib import Path

import pytest
import torch
from scipy import stats as sps

from fedseg.bench.runs import parse_sets, parse_variant
from fedseg.bench.stats import compare, paired_tests, paired_values, seed_differences, seed_spread, summarise_seeds


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


def test_seed_differences_pair_site_means_seed_by_seed():
    # hand numbers: site means a = 0.6, 0.75, 0.50 (seed 2 lacks a site for b: left out); b = 0.55, 0.80
    a = {0: {"s1": {"dice": 0.5}, "s2": {"dice": 0.7}}, 1: {"s1": {"dice": 0.6}, "s2": {"dice": 0.9}},
         2: {"s1": {"dice": 0.4}, "s2": {"dice": 0.6}}, 3: {"s1": {"dice": 0.1}, "s2": {"dice": 0.1}}}
    b = {"1": {"s1": {"dice": 0.7}, "s2": {"dice": 0.9}}, "0": {"s1": {"dice": 0.4}, "s2": {"dice": 0.7}},
         "2": {"s1": {"dice": 0.4}}}
    a = {str(k): v for k, v in a.items()}  # seeds as results.json stores them
    out = seed_differences(a, b, ["s1", "s2"])
    assert out["seeds"] == [0, 1] and out["n"] == 2 and out["ahead"] == 1
    assert out["values"] == pytest.approx([0.05, -0.05])
    assert out["mean"] == pytest.approx(0.0) and out["std"] == pytest.approx(0.1 / 2 ** 0.5)
    assert seed_differences(a, {}, ["s1"])["n"] == 0


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
    import fedseg.recipes.export as export

    def forbidden(*a, **k):
        raise AssertionError("a job was started or exported")

    monkeypatch.setattr(subprocess, "call", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(cli, "export_job", forbidden)
    monkeypatch.setattr(export, "export_job", forbidden)
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


def test_a_paper_bench_of_two_published_methods_needs_its_protocol_named(tmp_path):
    from fedseg.cli import main

    with pytest.raises(SystemExit, match="--protocol"):
        main(["bench", "--out", str(tmp_path / "b"), "--methods", "fedavg", "fedevi", "graphfedseg", "--profile", "paper",
              "--references"])
    assert not (tmp_path / "b").exists()


def test_simulator_timeout_reaches_every_method_run_and_is_not_part_of_the_run_config(tmp_path, monkeypatch):
    from fedseg.bench import runs
    from fedseg.cli import main

    seen = []

    def fake_simulator(job, workspace, sites, **kwargs):
        seen.append(kwargs["timeout"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(runs, "run_simulator", fake_simulator)
    with pytest.raises(RuntimeError, match="stop here"):
        main(["bench", "--out", str(tmp_path / "b"), "--family", "polyp", "--data-profile", "tiny", "--methods", "fedavg",
              "--references", "--rounds", "1", "--simulator-timeout", "7200"])
    assert seen == [7200]
    assert "simulator_timeout" not in runs.Budget().to_dict()
    with pytest.raises(SystemExit, match="simulator_timeout"):
        main(["bench", "--out", str(tmp_path / "c"), "--methods", "fedavg", "--references", "--simulator-timeout", "0"])


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
    """``benchmarks/accuracy/compare.py`` only translates its options into a ``fedseg bench`` command line."""
    import importlib.util
    from pathlib import Path

    from fedseg.cli import build_parser

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "accuracy" / "compare.py"
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


# ------------------------------------------------------------------------------------ classification
def _binomial_two_sided(b: int, c: int) -> float:
    """McNemar's exact p by hand: P(X <= min(b, c)) doubled for X ~ Binomial(b + c, 1/2), capped at 1."""
    from math import comb

    n = b + c
    return min(1.0, 2 * sum(comb(n, k) for k in range(min(b, c) + 1)) / 2**n)


def test_mcnemar_exact_against_a_hand_binomial():
    from fedseg.bench.stats import mcnemar_exact

    # 12 images: 7 only A right, 2 only B right, 2 both right, 1 both wrong
    x = [1] * 7 + [0] * 2 + [1, 1, 0]
    y = [0] * 7 + [1] * 2 + [1, 1, 0]
    out = mcnemar_exact(x, y)
    assert (out["b"], out["c"], out["n"]) == (7, 2, 12)
    assert out["mcnemar_p"] == pytest.approx(_binomial_two_sided(7, 2), rel=1e-12)  # 0.1796875
    assert out["mean_diff"] == pytest.approx(sum(x) / 12 - sum(y) / 12)
    assert mcnemar_exact(y, x)["mcnemar_p"] == pytest.approx(out["mcnemar_p"])  # symmetric in A and B
    assert mcnemar_exact([1, 0] * 5, [1, 0] * 5)["mcnemar_p"] is None  # no discordant pair
    assert mcnemar_exact([1], [0])["mcnemar_p"] is None
    with pytest.raises(ValueError, match="0 or 1"):
        mcnemar_exact([0.5, 1], [1, 1])


def _cls_rows(ids, correct):
    return [{"id": i, "label": 0, "prediction": 0 if c else 1, "correct": float(c)} for i, c in zip(ids, correct)]


def _cls_record(label, seed, correct_s1, correct_s2, kind="method"):
    per_image = {"s1": _cls_rows(["a.png", "b.png", "c.png"], correct_s1), "s2": _cls_rows(["d.png", "e.png"], correct_s2)}
    final = {s: {"accuracy": sum(r["correct"] for r in rows) / len(rows), "balanced_accuracy": 0.5} for s, rows in per_image.items()}
    return {"id": f"{kind}-{label}-seed{seed}", "kind": kind, "label": label, "method": "fedefm", "seed": seed,
            "task": "classification", "final": {"global": final}, "per_image": {"global": per_image},
            "wall_s": 1.0, "round_walls": [1.0, 1.0], "report_path": "r.json", "val_metric": "val_accuracy",
            "val_accuracy_per_round": [0.2, 0.4]}


def test_classification_results_use_accuracy_and_mcnemar_against_the_fedavg_row(tmp_path):
    from fedseg.bench.report import build_results, markdown, plot_results
    from fedseg.bench.stats import mcnemar_exact

    records = [_cls_record("fedavg_cfl", 0, [1, 0, 0], [1, 0]), _cls_record("fedefm", 0, [1, 1, 1], [0, 1]),
               _cls_record("fedavg_cfl", 1, [0, 0, 1], [1, 1]), _cls_record("fedefm", 1, [1, 1, 0], [1, 1]),
               {**_cls_record("pooled", 0, [1, 1, 1], [1, 1], kind="reference"), "method": "pooled"}]
    res = build_results(records, ["s1", "s2"], {"seeds": [0, 1]})
    assert res["task"] == "classification" and res["metrics"] == ["accuracy", "balanced_accuracy"]
    assert res["baseline"] == "fedavg_cfl"  # the only label starting with fedavg
    summary = res["approaches"]["fedefm"]["summary"]
    assert set(summary["s1"]) == {"accuracy", "balanced_accuracy"}
    assert summary["s1"]["accuracy"]["mean"] == pytest.approx((1 + 2 / 3) / 2)
    got = res["comparisons"]["fedefm"]["metrics"]["correct"]
    # pairs: seed 0 then 1, site s1 then s2
    x = [1, 1, 1, 0, 1] + [1, 1, 0, 1, 1]
    y = [1, 0, 0, 1, 0] + [0, 0, 1, 1, 1]
    assert got["all"] == mcnemar_exact(x, y)
    assert got["all"]["mcnemar_p"] == pytest.approx(_binomial_two_sided(5, 2))
    assert got["per_site"]["s2"]["n"] == 4
    assert res["methods"]["fedefm"]["val_accuracy_per_round"] == pytest.approx([0.2, 0.4])
    text = markdown(res)
    assert "## Accuracy" in text and "## Balanced accuracy" in text and "McNemar" in text
    assert "Dice" not in text and "Wilcoxon" not in text and "vs `fedavg_cfl`" in text
    names = [p.name for p in plot_results(res, records, tmp_path)]
    assert names == ["accuracy_per_site.png", "val_accuracy_rounds.png"]
    with pytest.raises(ValueError, match="baseline 'x'"):
        build_results(records, ["s1", "s2"], {}, baseline="x")
    seg = {**records[0], "task": None, "id": "method-seg-seed0", "label": "seg"}
    with pytest.raises(ValueError, match="mix tasks"):
        build_results(records + [seg], ["s1", "s2"], {})


def test_segmentation_results_keep_dice_tables_and_wilcoxon():
    from fedseg.bench.report import build_results, markdown

    def rec(label, seed, rows):
        per_image = {"s1": rows}
        final = {"s1": {m: sum(r[m] for r in rows) / len(rows) for m in ("dice", "hd95", "assd")}}
        return {"id": f"method-{label}-seed{seed}", "kind": "method", "label": label, "method": label, "seed": seed,
                "final": {"global": final}, "per_image": {"global": per_image}, "wall_s": 1.0, "round_walls": [1.0],
                "report_path": "r.json", "val_dice_per_round": [0.3]}  # a run stored before "task" existed

    ids = ["a.png", "b.png", "c.png"]
    res = build_results([rec("fedavg", 0, _rows(ids, [0.5, 0.6, 0.7])), rec("fedevi", 0, _rows(ids, [0.6, 0.5, 0.9]))], ["s1"], {})
    assert res["task"] == "segmentation" and res["baseline"] == "fedavg" and "accuracy" not in res["metrics"]
    assert set(res["comparisons"]["fedevi"]["metrics"]) == {"dice", "hd95", "assd"}
    assert res["methods"]["fedavg"]["val_dice_per_round"] == [0.3]
    text = markdown(res)
    assert "## Dice" in text and "Wilcoxon" in text and "McNemar" not in text and "Accuracy" not in text
    assert "Jaccard" not in text and "mIoU" not in text  # only where a run reports them

    # a job that asks for Jaccard and mIoU (FedEFM's downstream job) gets their tables, in that order after Dice
    def with_iou(record, iou):
        final = {"s1": {**record["final"]["global"]["s1"], "iou": iou, "miou": (1 + iou) / 2}}
        return {**record, "final": {"global": final}}

    res = build_results([with_iou(rec("fedavg", 0, _rows(ids, [0.5, 0.6, 0.7])), 0.45),
                         with_iou(rec("fedevi", 0, _rows(ids, [0.6, 0.5, 0.9])), 0.5)], ["s1"], {})
    assert res["approaches"]["fedevi"]["summary"]["s1"]["iou"]["mean"] == pytest.approx(0.5)
    text = markdown(res)
    assert text.index("## Dice") < text.index("## Jaccard (IoU)") < text.index("## mIoU") < text.index("## HD95")
    assert "| fedevi | 0.500 ± 0.000 |" in text and "| fedevi | 0.750 ± 0.000 |" in text


@pytest.fixture(scope="module")
def foundation_silos(tmp_path_factory):
    from fedseg.bench.bench import prepare_federation

    out = tmp_path_factory.mktemp("xray_foundation")
    return out, prepare_federation(out, family="xray_foundation", sites=["site-1", "site-2"], data_profile="tiny",
                                   sets={"data_unseen": 0.5})


def test_bench_builds_foundation_silos_with_the_unseen_proportion(foundation_silos):
    from fedseg.bench.runs import federation_task
    from fedseg.data.synthetic.xray_builtin import builtin_assignment

    out, mapping = foundation_silos
    assert list(mapping) == ["site-1", "site-2"] and federation_task(mapping) == "classification"
    # the silos a site process would generate itself: 3 scanners (BASE_TRAIN_CONFIG) x 4 devices, unseen 0.5
    expected = builtin_assignment(["site-1", "site-2"], unseen=0.5, seed=0, n_scanners=3)
    for site, path in mapping.items():
        info = json.loads(open(path).read())
        assert info["task"] == "classification" and len(info["label_space"]) == 12
        assert info["classes"] == expected[site]
    assert json.loads((out / "site_datalists.json").read_text()) == mapping


def test_pooled_classification_datalist_keeps_label_space_and_int_labels(foundation_silos, tmp_path):
    from fedseg.bench.runs import Budget, pooled_datalist, reference_config
    from fedseg.data.classification import load_classification_datalist
    from fedseg.engine.factory import build_engine

    _, mapping = foundation_silos
    path = pooled_datalist(mapping, tmp_path / "pooled" / "datalist.json")
    pooled = json.loads(path.read_text())
    site_lists = {s: load_classification_datalist(p, check_files=False) for s, p in mapping.items()}
    space = json.loads(open(mapping["site-1"]).read())["label_space"]
    assert pooled["task"] == "classification" and pooled["label_space"] == space
    for split in ("training", "validation", "test"):
        want = [{"image": e["image"], "label": e["label"]} for s in mapping for e in site_lists[s][split]]
        assert pooled[split] == want and all(type(e["label"]) is int for e in pooled[split])
    assert set(pooled["classes"]) == {space[e["label"]] for split in ("training", "validation", "test") for e in pooled[split]}
    loaded = load_classification_datalist(path)  # a valid classification datalist, images on disk
    assert sum(len(v) for v in loaded.values()) == sum(len(v) for s in site_lists.values() for v in s.values())
    # the reference trains the ViT over the global label space through the task's engine
    cfg = reference_config(Budget(profile="tiny", rounds=1), 0, mapping)["train_config"]
    assert cfg["task"] == "classification" and cfg["num_classes"] == 12
    assert type(build_engine("pooled", path, cfg)).__name__ == "ClassificationEngine"
    # silos on different label spaces cannot be pooled
    other = json.loads(open(mapping["site-2"]).read())
    other["label_space"] = list(reversed(other["label_space"]))
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({**other, **{k: [{**e, "image": str(Path(mapping["site-2"]).parent / e["image"])}
                                               for e in other[k]] for k in ("training", "validation", "test")}}))
    with pytest.raises(ValueError, match="different label spaces"):
        pooled_datalist({"site-1": mapping["site-1"], "site-2": str(bad)}, tmp_path / "bad.json")


def test_round_timings_reads_walls_compute_tasks_and_bytes():
    from fedseg.bench.simulator import round_timings

    report = {"rounds": [
        {"round": 0, "wall_time": 5.0, "metrics": {"a": {"compute_time": 3.0}, "b": {"compute_time": 4.0}},
         "task_times": {"train": 4.5, "evaluate_surrogate": 0.4}, "bytes_received": 200, "bytes_sent": 100},
        {"round": 1, "wall_time": 2.0, "metrics": {}},
    ]}
    first, second = round_timings(report)
    assert first == {"round": 0, "wall": 5.0, "tasks": 2, "bytes_up": 200.0, "bytes_down": 100.0,
                     "max_compute": 4.0, "sum_compute": 7.0, "overhead": 1.0}
    assert second == {"round": 1, "wall": 2.0, "tasks": 1, "bytes_up": 0.0, "bytes_down": 0.0}


def test_results_of_a_method_without_a_global_model():
    """FedBN / FedRep runs report only personalised models: the bench lists them as '<label> (personalised)',
    tests them against FedAvg's global model, and keeps them in the cost table."""
    from fedseg.bench.report import build_results, markdown

    ids = ["a.png", "b.png", "c.png"]

    def rec(label, model, dice):
        rows = _rows(ids, dice)
        final = {"s1": {m: sum(r[m] for r in rows) / len(rows) for m in ("dice", "hd95", "assd")}}
        return {"id": f"method-{label}-seed0", "kind": "method", "label": label, "method": label, "seed": 0,
                "final": {model: final}, "per_image": {model: {"s1": rows}}, "wall_s": 1.0, "round_walls": [1.0, 2.0],
                "report_path": "r.json", "val_dice_per_round": [0.3]}

    res = build_results([rec("fedavg", "global", [0.5, 0.6, 0.7]), rec("fedbn", "personalized", [0.6, 0.7, 0.8])], ["s1"], {})
    assert set(res["approaches"]) == {"fedavg", "fedbn (personalised)"}
    assert res["comparisons"]["fedbn (personalised)"]["metrics"]["dice"]["all"]["mean_diff"] == pytest.approx(0.1)
    assert "global" not in res["methods"]["fedbn"] and res["methods"]["fedbn"]["personalized"]["s1"]["dice"] == pytest.approx(0.7)
    assert "| fedbn | 1 |" in markdown(res)
