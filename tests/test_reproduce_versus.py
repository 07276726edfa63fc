"""Results-page tables of one bench against several of its approaches (``render: versus``), the glance row of a
published method whose arms are ablation rows (FedEFM downstream), the name of an arm that starts from another run's
checkpoint, and the paper column of a pairs table. Every number is checked against numpy / scipy on the records."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from test_reproduce import SEEDS, SITES, _fmt_p, _pairs, _pm, _row, _site_mean_per_seed, _store_bench, seg_record

from benchmarks.core.tables import approach_title, glance_rows
from fedseg.bench.report import build_results


@pytest.fixture(scope="module")
def reproduce():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "reproduce.py"
    spec = importlib.util.spec_from_file_location("reproduce_versus_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_records():
    """FedAvg, two baselines (one with a personalised model) and a published method, three seeds."""
    recs = []
    for seed in SEEDS:
        recs += [seg_record("fedavg", "fedavg", seed), seg_record("fedavgm", "fedavgm", seed, 0.04),
                 seg_record("ditto", "ditto", seed, 0.02, personalised=True),
                 seg_record("fedevi", "fedevi", seed, -0.03, walls=(9, 4, 5, 6))]
    return recs


def _seed_diff(records, label, base, model="global"):
    """Per seed: the site mean of ``label``'s model minus ``base``'s global model; mean, sample std, seeds ahead."""
    a = np.array(_site_mean_per_seed(records, label, "dice", model))
    b = np.array(_site_mean_per_seed(records, base, "dice"))
    d = a - b
    return f"{d.mean():+.3f} ± {d.std(ddof=1):.3f} ({int((d > 0).sum())} of {len(d)})"


def test_versus_pairs_every_row_with_every_comparator_by_scipy(reproduce, tmp_path):
    records = _bench_records()
    command = "fedseg bench --out {out}"
    _store_bench(tmp_path, "toy", records, command)
    runs = {"toy": {"out": "toy", "commands": [command]}}
    tables = {"toy-versus": {"run": "toy", "render": "versus", "labels": ["fedavgm", "ditto"],
                             "against": ["fedavg", "fedavgm"], "title": "Toy baselines"}}
    text = reproduce.render("toy-versus", tmp_path, runs=runs, tables=tables)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "approach", "Dice", "Δ Dice vs FedAvg: per seed (seeds ahead)", "Δ Dice vs FedAvg: per image (Wilcoxon p)",
        "Δ Dice vs FedAvgM: per seed (seeds ahead)", "Δ Dice vs FedAvgM: per image (Wilcoxon p)", "round time vs FedAvg"]
    # the registry's rows only, in its order, each model of a label (FedEvi and FedAvg are not rows)
    assert [c.split("|")[1].strip() for c in lines[2:]] == ["FedAvgM", "Ditto", "Ditto (personalised)"]
    for label, model, name in (("fedavgm", "global", "FedAvgM"), ("ditto", "global", "Ditto"),
                               ("ditto", "personalized", "Ditto (personalised)")):
        cells = _row(lines, name)
        assert cells[0] == _pm(_site_mean_per_seed(records, label, "dice", model), 3)
        for k, base in enumerate(("fedavg", "fedavgm")):
            if (label, model) == (base, "global"):
                assert cells[1 + 2 * k:3 + 2 * k] == ["", ""]  # the comparator against itself
                continue
            x, y = _pairs(records, label, base, "dice", model)
            assert cells[1 + 2 * k] == _seed_diff(records, label, base, model)
            assert cells[2 + 2 * k] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"

    def median_wall(label):  # every round but the first, pooled over seeds
        return np.median([w for r in records if r["label"] == label for w in r["round_walls"][1:]])

    assert _row(lines, "Ditto")[-1] == f"{median_wall('ditto') / median_wall('fedavg'):.2f}x"


def test_versus_without_round_time_keeps_the_pairs_and_drops_the_timing(reproduce, tmp_path):
    records = _bench_records()
    command = "fedseg bench --out {out}"
    _store_bench(tmp_path, "toy", records, command)
    runs = {"toy": {"out": "toy", "commands": [command]}}
    table = {"run": "toy", "render": "versus", "labels": ["fedavgm", "ditto"], "against": ["fedavg"], "title": "Toy"}
    timed = reproduce.render("toy-versus", tmp_path, runs=runs, tables={"toy-versus": table})
    untimed = reproduce.render("toy-versus", tmp_path, runs=runs, tables={"toy-versus": {**table, "round_time": False}})
    rows = {t: [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("|")]
            for t, text in (("timed", timed), ("untimed", untimed))}
    assert rows["timed"][0][-1].strip() == "round time vs FedAvg" and "Round time" in timed
    assert "round time" not in untimed.lower()
    # the same rows and cells, less the last column
    assert [r[:-1] for r in rows["timed"]][2:] == rows["untimed"][2:]


def test_versus_refuses_a_label_the_bench_did_not_run(reproduce, tmp_path):
    command = "fedseg bench --out {out}"
    _store_bench(tmp_path, "toy", _bench_records(), command)
    runs = {"toy": {"out": "toy", "commands": [command]}}
    tables = {"toy-versus": {"run": "toy", "render": "versus", "labels": ["scaffold"], "against": ["fedavg"],
                             "title": "Toy"}}
    with pytest.raises(reproduce.ReproduceError, match=r"\['scaffold'\] are not approaches of the bench"):
        reproduce.render("toy-versus", tmp_path, runs=runs, tables=tables)


def _downstream_records():
    ckpt = "{root}/pre/workspaces/method-fedefm-seed%d/server/simulate_job/app_server/FL_global_model.pt"
    recs = []
    for seed in SEEDS:
        init = seg_record("unetr_fedefm_init", "fedefm_downstream", seed, 0.03)
        init["variant_args"] = {"foundation_ckpt": ckpt % seed}
        recs += [seg_record("fedavg", "fedavg", seed), seg_record("unetr_scratch", "fedefm_downstream", seed, 0.01),
                 init, seg_record("moon", "moon", seed, -0.01)]
    return recs


def test_an_arm_from_another_runs_checkpoint_is_named_by_that_run():
    entry = {"method": "fedefm_downstream", "label": "x", "variant_args": {
        "foundation_ckpt": "{root}/f/workspaces/method-fedefm_dfl-seed2/server/simulate_job/app_server/FL_global_model.pt",
        "partial_depth": True}}
    assert approach_title(entry) == "FedEFM downstream (foundation_ckpt from `fedefm_dfl`, partial_depth=True)"
    # any other path stays as it is
    assert approach_title({"method": "fedavg", "label": "y", "variant_args": {"bundle": "/b/unet"}}) == "FedAvg (bundle=/b/unet)"


def test_glance_labels_name_the_published_arms_and_keep_the_best_baseline_row():
    records = _downstream_records()
    results = build_results(records, SITES, {"seeds": SEEDS})
    # by the default rule an arm with options is an ablation row: only the plain UNETR (not FedEFM's arm) would show
    assert [r[0] for r in glance_rows(results, "dca1", "t")] == ["FedEFM downstream `unetr_scratch`", "best baseline: MOON"]
    rows = glance_rows(results, "dca1", "t", labels={"unetr_fedefm_init": "FedEFM (UNETR from its foundation)"})
    assert [r[0] for r in rows] == ["FedEFM (UNETR from its foundation)", "best baseline: MOON"]
    x, y = _pairs(records, "unetr_fedefm_init", "fedavg", "dice")
    assert rows[0][2] == (f"{_pm(_site_mean_per_seed(records, 'unetr_fedefm_init', 'dice'), 3)} "
                          f"({_pm(_site_mean_per_seed(records, 'fedavg', 'dice'), 3)})")
    assert rows[0][3] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    with pytest.raises(ValueError, match="glance labels \\['unetr_dfl'\\] are not approaches"):
        glance_rows(results, "dca1", "t", labels={"unetr_dfl": "x"})


def test_pairs_paper_column_holds_each_rows_published_number(reproduce, tmp_path):
    records = _downstream_records()
    command = "fedseg bench --out {out}"
    _store_bench(tmp_path, "toy", records, command)
    runs = {"toy": {"out": "toy", "commands": [command]}}
    tables = {"toy-pairs": {"run": "toy", "render": "pairs", "title": "Toy pairs", "paper_note": "Dice points (Table IV).",
                            "pairs": [["unetr_fedefm_init", "unetr_scratch", "+12.2"], ["unetr_scratch", "fedavg"]]}}
    text = reproduce.render("toy-pairs", tmp_path, runs=runs, tables=tables)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert lines[0].rstrip().endswith("| round wall A / B | paper |") and lines[1] == "|---|---|---|---|---|---|"
    first = _row(lines, "FedEFM downstream (foundation_ckpt from `fedefm`) vs FedEFM downstream `unetr_scratch`")
    x, y = _pairs(records, "unetr_fedefm_init", "unetr_scratch", "dice")
    assert first[2] == f"{np.mean(x - y):+.4f} ({sps.wilcoxon(x, y).pvalue:.3f}, {len(x)})" and first[-1] == "+12.2"
    assert _row(lines, "FedEFM downstream `unetr_scratch` vs FedAvg")[-1] == ""
    assert "Paper column: Dice points (Table IV)." in text
