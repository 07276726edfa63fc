"""The glance and the README's "which to use" table from toy benches: each row links to its source table's page,
and the "best baseline" row is chosen from every bench paired with the source's FedAvg runs (checked with scipy)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps
from test_reproduce import SEEDS, _fmt_p, _pairs, _row, _site_mean_per_seed, _store_bench, seg_record

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def reproduce():
    spec = importlib.util.spec_from_file_location("reproduce_for_glance", REPO / "benchmarks" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _benches(root, other_fedavg_offset=0.0):
    """Bench ``a``: FedAvg, FedEvi, FedAvgM; bench ``b``: the same FedAvg runs (or others) and FedProx, the best."""
    a = [seg_record(label, label, seed, offset) for seed in SEEDS
         for label, offset in (("fedavg", 0.0), ("fedevi", -0.05), ("fedavgm", 0.02))]
    b = [seg_record("fedavg", "fedavg", seed, other_fedavg_offset) for seed in SEEDS]
    b += [seg_record("fedprox", "fedprox", seed, 0.04) for seed in SEEDS]
    _store_bench(root, "a", a, "fedseg bench --methods fedavg fedevi fedavgm --out X")
    _store_bench(root, "b", b, "fedseg bench --methods fedavg fedprox --out X")
    runs = {"a": {"out": "a", "commands": ["fedseg bench --methods fedavg fedevi fedavgm --out {out}"]},
            "b": {"out": "b", "commands": ["fedseg bench --methods fedavg fedprox --out {out}"]}}
    tables = {"a-acc": {"run": "a", "render": "accuracy", "title": "A", "data": "toy a", "baselines_from": ["b-acc"],
                        "page": "docs/results/toy.md"},
              "b-acc": {"run": "b", "render": "accuracy", "title": "B", "page": "docs/results/toy.md"},
              "glance": {"render": "glance", "title": "Results at a glance", "from": ["a-acc"], "page": "docs/benchmarks.md"},
              "use": {"render": "verdicts", "title": "Which to use", "from": ["a-acc"], "glance": "glance",
                      "page": "README.md"}}
    return a, b, runs, tables


def test_the_best_baseline_is_chosen_from_every_bench_paired_with_the_same_fedavg(reproduce, tmp_path):
    a, b, runs, tables = _benches(tmp_path)
    lines = [line for line in reproduce.render("glance", tmp_path, runs=runs, tables=tables).splitlines()
             if line.startswith("|")]
    cells = _row(lines, "best baseline: FedProx")
    x, y = _pairs(b, "fedprox", "fedavg", "dice")
    p = sps.wilcoxon(x, y).pvalue
    fedavg = _site_mean_per_seed(a, "fedavg", "dice")
    fedprox = _site_mean_per_seed(b, "fedprox", "dice")
    assert cells[1] == (f"{np.mean(fedprox):.3f} ± {np.std(fedprox, ddof=1):.3f} "
                        f"({np.mean(fedavg):.3f} ± {np.std(fedavg, ddof=1):.3f})")
    assert cells[2] == f"{np.mean(x - y):+.3f} ({_fmt_p(p)})"
    # each row links to its source table's page, relative to the glance's own page
    assert cells[4] == "[a-acc](results/toy.md#a-acc)"
    assert not any(line.startswith("| best baseline: FedAvgM") for line in lines)
    # without the other bench, the source's own best baseline; the methods' rows are the same either way
    alone = {**tables, "a-acc": {k: v for k, v in tables["a-acc"].items() if k != "baselines_from"}}
    text = reproduce.render("glance", tmp_path, runs=runs, tables=alone)
    assert "| best baseline: FedAvgM |" in text and "FedProx" not in text
    assert _row(text.splitlines(), "FedEvi") == _row(lines, "FedEvi")


def test_a_bench_of_other_fedavg_runs_cannot_lend_its_baselines(reproduce, tmp_path):
    _, _, runs, tables = _benches(tmp_path, other_fedavg_offset=0.01)
    with pytest.raises(reproduce.ReproduceError, match="b-acc cannot be paired with 'a-acc'.*not the one of"):
        reproduce.render("glance", tmp_path, runs=runs, tables=tables)
    with pytest.raises(reproduce.ReproduceError, match="'baselines_from' must list accuracy tables"):
        reproduce.check_registry(runs, {**tables, "a-acc": {**tables["a-acc"], "baselines_from": ["glance"]}})


def test_which_to_use_ranks_the_source_with_the_benches_it_draws_baselines_from(reproduce, tmp_path):
    from benchmarks.core.outputs import merge_benches
    from benchmarks.core.tables import recommendation

    _, b, runs, tables = _benches(tmp_path)
    text = reproduce.render("use", tmp_path, runs=runs, tables=tables)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert lines[0] == "| federation | use | by the rule | table |"
    merged = merge_benches(reproduce.load_output("a", tmp_path, runs), [reproduce.load_output("b", tmp_path, runs)])
    verdict = recommendation(merged)
    assert verdict["use"] == "FedProx"  # the highest mean of the two benches (+0.04 per image over FedAvg)
    assert merged["ranking"]["order"][0][0] == "fedprox"
    fedprox = _site_mean_per_seed(b, "fedprox", "dice")
    assert merged["ranking"]["order"][0][1] == pytest.approx(np.mean(fedprox), abs=1e-12)
    assert _row(lines, "toy a") == [f"**{verdict['use']}**", f"{verdict['how']} ({verdict['evidence']})",
                                    "[a-acc](docs/results/toy.md#a-acc)"]
    # the caption links the glance table on its page, from the README
    assert "[results at a glance](docs/benchmarks.md#glance)" in text
