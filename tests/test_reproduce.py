"""``benchmarks/reproduce.py`` and :mod:`benchmarks.core.tables`: results-page tables from a bench's ``results.json``.

The results are built in the test from per-image rows (through :func:`fedseg.bench.report.build_results`, as
``fedseg bench`` does); every number in a rendered table is checked against numpy / scipy applied to those rows
and per-seed finals directly. Also: ``fedseg bench`` records the code version (git commit) of what it ran.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from fedseg.bench.report import build_results

REPO = Path(__file__).resolve().parents[1]
SITES = ["s1", "s2"]
IDS = {"s1": ["a.png", "b.png", "c.png"], "s2": ["d.png", "e.png", "f.png", "g.png"]}
SEEDS = [0, 1, 2]
TRAIN_CONFIG = {"local_epochs": 1, "image_size": 64, "patch_size": 64, "spatial_mode": None, "num_classes": 3,
                "labels": {"background": 0, "rim": 1, "cup": 2}, "regions": {"disc": ["rim", "cup"], "cup": ["cup"]}}
HEADER = {
    "benchmark": "fedseg bench", "date": "2026-11-26T09:15:02", "command": "fedseg bench --family fundus --out X",
    "code_version": {"commit": "abc1234", "dirty": False}, "run_code_versions": {"abc1234": ["..."]},
    "machine": {"platform": "Linux", "cpu_count": 2, "python": "3.11.7", "torch": "2.13.0+cpu", "gpus": [],
                "loadavg_at_start": [2.5, 2.0, 1.0]},
    "seeds": SEEDS, "budget": {"profile": "default", "rounds": None, "local_epochs": None, "sets": {}},
    "spatial": {s: {"spatial_mode": "resize", "rescale": 1.0, "spatial_dims": 2, "input_size": 64} for s in SITES},
    "data": {"s1": {"training": 5, "validation": 1, "test": 3}, "s2": {"training": 6, "validation": 1, "test": 4}},
}
METRICS = ("dice", "dice:rim", "dice:cup", "dice:disc", "hd95", "assd")


def _rows(rng, offset):
    return {site: [{"id": i, **{m: float(np.clip(rng.uniform(0.5, 0.9) + offset, 0, 1)) if m.startswith("dice")
                                  else float(rng.uniform(2, 6)) for m in METRICS}} for i in IDS[site]] for site in SITES}


def _final(per_image):
    """A site's final metric = the mean over its test images (what a site reports)."""
    return {site: {m: float(np.mean([r[m] for r in rows])) for m in METRICS} for site, rows in per_image.items()}


def seg_record(label, method, seed, offset=0.0, kind="method", personalised=False, walls=(9.0, 2.0, 3.0, 4.0)):
    rng = np.random.default_rng(1000 * seed + sum(map(ord, label)))
    per_image = {"global": _rows(rng, offset)}
    if personalised:
        per_image["personalized"] = _rows(rng, offset + 0.01)
    rec = {"id": f"{kind}-{label}-seed{seed}", "kind": kind, "label": label, "method": method, "seed": seed,
           "task": "segmentation", "train_config": TRAIN_CONFIG, "num_rounds": 4,
           "final": {m: _final(p) for m, p in per_image.items()}, "per_image": per_image, "wall_s": 10.0 + seed,
           "report_path": "r.json", "val_dice_per_round": [0.5]}
    if kind == "method":
        rec.update(round_walls=[w * (1 + 0.1 * seed) for w in walls], upload_mb_per_site_round=7.76,
                   download_mb_per_site_round=7.76 * (2 if method != "fedavg" else 1), peak_site_memory_mb=700.0 + seed)
    else:
        rec["round_walls"] = []
    return rec


@pytest.fixture(scope="module")
def seg_records():
    recs = []
    for seed in SEEDS:
        recs += [seg_record("fedavg", "fedavg", seed), seg_record("fedevi", "fedevi", seed, -0.05, walls=(9, 4, 5, 6)),
                 seg_record("graphfedseg", "graphfedseg", seed, 0.01, personalised=True),
                 seg_record("local", "local", seed, 0.02, kind="reference")]
    return recs


@pytest.fixture(scope="module")
def seg_results(seg_records):
    return build_results(seg_records, SITES, dict(HEADER))


def _row(lines, name):
    """The cells of the markdown row whose first cell is ``name``."""
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == name:
            return cells[1:]
    raise AssertionError(f"no row {name!r} in:\n" + "\n".join(lines))


def _header(lines):
    return [c.strip() for c in lines[0].strip().strip("|").split("|")][1:]


def _pm(values, digits):
    return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"


def _fmt_p(p):
    return f"{p:.2e}" if p < 1e-3 else f"{p:.3f}"


def _site_mean_per_seed(records, label, metric, model="global"):
    """Per seed, the unweighted mean over sites of each site's final metric."""
    return [np.mean([r["final"][model][s][metric] for s in SITES]) for r in sorted(records, key=lambda r: r["seed"])
            if r["label"] == label]


def _pairs(records, label, base, metric, model="global"):
    """Per-image values of ``label`` and ``base`` (global), pooled over seeds (ascending) then sites."""
    x, y = [], []
    for seed in SEEDS:
        a = next(r for r in records if r["label"] == label and r["seed"] == seed)["per_image"][model]
        b = next(r for r in records if r["label"] == base and r["seed"] == seed)["per_image"]["global"]
        for site in SITES:
            x += [row[metric] for row in a[site]]
            y += [row[metric] for row in b[site]]
    return np.array(x), np.array(y)


# ------------------------------------------------------------------------------------------ accuracy
def test_accuracy_table_cells_match_the_per_seed_finals_and_scipy(seg_records, seg_results):
    from benchmarks.core.tables import accuracy_table

    lines = accuracy_table(seg_results)
    assert _header(lines)[:5] == ["Dice (mean of rim, cup)", "Dice rim", "Dice cup", "Dice disc", "HD95 (px)"]
    assert _header(lines)[5:] == [f"Δ {w} vs FedAvg (Wilcoxon p)" for w in ("Dice", "rim", "cup", "disc")] + [
        "Δ Dice per seed (mean ± std, seeds ahead)"]
    # rows: every approach, the personalised model included, references by their page names
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["FedAvg", "FedEvi", "GraphFedSeg",
                                                                    "GraphFedSeg (personalised)", "local only"]
    fedevi = _row(lines, "FedEvi")
    for col, metric, digits in ((0, "dice", 3), (2, "dice:cup", 3), (3, "dice:disc", 3), (4, "hd95", 2)):
        assert fedevi[col] == _pm(_site_mean_per_seed(seg_records, "fedevi", metric), digits)
    for col, metric in ((5, "dice"), (7, "dice:cup")):
        x, y = _pairs(seg_records, "fedevi", "fedavg", metric)
        assert len(x) == 21
        assert fedevi[col] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    pers = _row(lines, "GraphFedSeg (personalised)")
    assert pers[0] == _pm(_site_mean_per_seed(seg_records, "graphfedseg", "dice", "personalized"), 3)
    x, y = _pairs(seg_records, "graphfedseg", "fedavg", "dice", "personalized")
    assert pers[5] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    assert _row(lines, "FedAvg")[5:] == ["", "", "", "", ""]  # the baseline is not tested against itself
    # the per-seed column: each seed's site-mean Dice minus FedAvg's of the same seed, numpy on the finals
    for name, label, model in (("FedEvi", "fedevi", "global"), ("GraphFedSeg (personalised)", "graphfedseg", "personalized")):
        diffs = np.subtract(_site_mean_per_seed(seg_records, label, "dice", model),
                            _site_mean_per_seed(seg_records, "fedavg", "dice"))
        assert _row(lines, name)[9] == f"{np.mean(diffs):+.3f} ± {np.std(diffs, ddof=1):.3f} ({int((diffs > 0).sum())} of 3)"


def test_accuracy_extra_metrics_and_single_seed(seg_records):
    from benchmarks.core.tables import accuracy_note, accuracy_table

    one = build_results([r for r in seg_records if r["seed"] == 0], SITES, {**HEADER, "seeds": [0]})
    lines = accuracy_table(one, extra_metrics=["assd"])
    assert _header(lines)[5] == "ASSD (px)"
    # one seed: the mean alone, no ± 0.000
    assert _row(lines, "FedEvi")[0] == f"{_site_mean_per_seed(seg_records[:4], 'fedevi', 'dice')[0]:.3f}"
    assert "one seed: no spread" in accuracy_note(one) and "7 pairs" in accuracy_note(one)
    assert not any("per seed" in h for h in _header(lines)) and "per seed" not in accuracy_note(one)  # nothing to pair
    volumes = {**one, "spatial": {s: {"spatial_mode": "patch", "spatial_dims": 3, "input_size": [64, 64, 16]} for s in SITES}}
    assert _header(accuracy_table(volumes))[4] == "HD95 (voxels)"


def test_classification_accuracy_table_uses_mcnemar():
    from benchmarks.core.tables import accuracy_table, glance_rows

    def rec(label, seed, correct):
        per_image = {"s1": [{"id": f"{i}.png", "label": 0, "prediction": 0 if c else 1, "correct": float(c)}
                            for i, c in enumerate(correct)]}
        final = {"s1": {"accuracy": float(np.mean(correct)), "balanced_accuracy": float(np.mean(correct))}}
        return {"id": f"method-{label}-seed{seed}", "kind": "method", "label": label, "method": label, "seed": seed,
                "task": "classification", "final": {"global": final}, "per_image": {"global": per_image}, "wall_s": 1.0,
                "round_walls": [1.0, 1.0], "report_path": "r.json", "val_metric": "val_accuracy"}

    fedavg = {0: [1, 0, 0, 1, 0, 1], 1: [0, 0, 1, 1, 0, 0]}
    fedefm = {0: [1, 1, 1, 1, 0, 1], 1: [1, 1, 0, 1, 1, 0]}
    records = [rec("fedavg", s, fedavg[s]) for s in (0, 1)] + [rec("fedefm", s, fedefm[s]) for s in (0, 1)]
    res = build_results(records, ["s1"], {"seeds": [0, 1]})
    lines = accuracy_table(res)
    assert _header(lines) == ["Accuracy", "Balanced accuracy", "Δ accuracy vs FedAvg (McNemar p)",
                              "Δ accuracy per seed (mean ± std, seeds ahead)"]
    x, y = np.array(fedefm[0] + fedefm[1]), np.array(fedavg[0] + fedavg[1])
    b, c = int(np.sum((x == 1) & (y == 0))), int(np.sum((x == 0) & (y == 1)))
    p = sps.binomtest(b, b + c, 0.5).pvalue
    cells = _row(lines, "FedEFM")
    assert cells[0] == _pm([np.mean(fedefm[0]), np.mean(fedefm[1])], 3)
    assert cells[2] == f"{(b - c) / len(x):+.3f} ({_fmt_p(p)})"
    diffs = [np.mean(fedefm[s]) - np.mean(fedavg[s]) for s in (0, 1)]
    assert cells[3] == f"{np.mean(diffs):+.3f} ± {np.std(diffs, ddof=1):.3f} (2 of 2)"
    assert glance_rows(res, "x-ray", "t")[0][2].startswith("accuracy ")


# ---------------------------------------------------------------------------------------------- cost
def test_cost_table_matches_the_round_walls(seg_records, seg_results):
    from benchmarks.core.tables import cost_note, cost_table

    lines = cost_table(seg_results)

    def median_wall(label):  # every round but the first, pooled over seeds
        return float(np.median([w for r in seg_records if r["label"] == label for w in r["round_walls"][1:]]))

    fedevi = _row(lines, "FedEvi")
    assert fedevi[0] == f"{median_wall('fedevi'):.2f}"
    assert fedevi[1] == f"{median_wall('fedevi') / median_wall('fedavg'):.2f}x"
    assert fedevi[2] == "7.76 / 15.52"
    assert fedevi[3] == "702"  # the largest over seeds
    assert fedevi[4] == _pm([10.0, 11.0, 12.0], 1)
    assert _row(lines, "FedAvg")[1] == "1.00x"
    assert _row(lines, "local only")[:4] == ["-", "-", "-", "-"] and _row(lines, "local only")[4].endswith("(in process)")
    assert "(9 rounds per approach)" in cost_note(seg_results)


# ------------------------------------------------------------------------------------------- caption
def test_caption_carries_budget_machine_date_and_commit(seg_results):
    from benchmarks.core.tables import caption

    text = caption(seg_results, "Toy federation", "A note.")
    assert text.startswith("**Toy federation.** 2 sites, 7 test images, seeds 0, 1, 2;")
    for part in ("profile `default`", "rounds 4 (profile default)", "local epochs 1", "images resized to 64 px",
                 "classes rim, cup (regions disc = rim + cup)", "machine: 2 CPUs, no GPU, torch 2.13.0+cpu, load 2.5",
                 "2026-11-26 09:15", "code abc1234", "A note."):
        assert part in text, part
    mixed = {**seg_results, "code_version": {"commit": "abc1234", "dirty": True},
             "run_code_versions": {"abc1234": ["r1"], "not recorded": ["r2", "r3"]}}
    assert "code abc1234+dirty (runs: abc1234 ×1, not recorded ×2)" in caption(mixed, "t")
    old = {k: v for k, v in seg_results.items() if k not in ("code_version", "spatial")}
    assert "code version not recorded" in caption(old, "t") and "spatial mode not recorded" in caption(old, "t")


def test_budget_names_per_method_local_epochs_and_sets(seg_records):
    from benchmarks.core.tables import budget_text

    fvac = [{**r, "label": "fvac", "method": "fvac", "id": r["id"].replace("fedevi", "fvac"),
             "train_config": {**TRAIN_CONFIG, "local_epochs": 5}} for r in seg_records if r["label"] == "fedevi"]
    res = build_results([r for r in seg_records if r["label"] == "fedavg"] + fvac, SITES,
                        {**HEADER, "budget": {"profile": "tiny", "rounds": 4, "sets": {"lr": 0.01, "num_classes": 3},
                                              "task_request_interval": 0.2}})
    text = budget_text(res)
    assert "profile `tiny`" in text and "rounds 4," in text and "(profile default)" not in text
    assert "local epochs 1 (FVAC: 5)" in text and "set lr=0.01" in text and "num_classes" not in text
    assert "task request interval 0.2 s" in text


# -------------------------------------------------------------------------------------------- glance
def test_glance_rows_from_an_accuracy_run(seg_records, seg_results):
    from benchmarks.core.tables import accuracy_table, cost_table, glance_rows, glance_table

    rows = glance_rows(seg_results, "toy data", "toy-accuracy", link="docs/benchmarks.md")
    assert [r[0] for r in rows] == ["FedEvi", "GraphFedSeg", "GraphFedSeg (personalised)"]  # methods, not references
    fedevi = rows[0]
    base = _pm(_site_mean_per_seed(seg_records, "fedavg", "dice"), 3)
    assert fedevi[1] == "toy data"
    assert fedevi[2] == f"{_pm(_site_mean_per_seed(seg_records, 'fedevi', 'dice'), 3)} ({base})"
    x, y = _pairs(seg_records, "fedevi", "fedavg", "dice")
    assert fedevi[3] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    assert fedevi[4] == _row(cost_table(seg_results), "FedEvi")[1]  # the cost table's ratio to FedAvg
    assert fedevi[5] == "[toy-accuracy](docs/benchmarks.md#toy-accuracy)"
    assert len(glance_table(rows)) == 2 + 3
    ablation = [{**r, "label": "fp", "id": r["id"].replace("fedevi", "fp"), "variant_args": {"use_gap": False}}
                for r in seg_records if r["label"] == "fedevi"]
    with_ablation = build_results(seg_records + ablation, SITES, dict(HEADER))
    assert "FedEvi (use_gap=False)" in "\n".join(accuracy_table(with_ablation))
    assert [r[0] for r in glance_rows(with_ablation, "toy", "t")] == [r[0] for r in rows]  # ablation rows stay out
    fvac_base = build_results([{**r, "label": "fvac", "method": "fvac", "id": "x" + r["id"]} if r["label"] == "fedavg" else r
                               for r in seg_records if r["label"] in ("fedavg", "fedevi")], SITES, dict(HEADER), baseline="fvac")
    with pytest.raises(ValueError, match="baseline is 'fvac', not FedAvg"):
        glance_rows(fvac_base, "toy", "t")
    # round times from another run (a quiet cost run): its ratio, and the cell names its table
    quiet = build_results([{**r, "round_walls": [w * (3 if r["label"] == "fedevi" else 1) for w in r["round_walls"]]}
                           for r in seg_records], SITES, dict(HEADER))
    from_quiet = glance_rows(seg_results, "toy data", "toy-accuracy", timing_from=(quiet, "toy-quiet-cost"))
    assert from_quiet[0][4] == _row(cost_table(quiet), "FedEvi")[1] + " (`toy-quiet-cost`)"
    assert from_quiet[0][4] != fedevi[4] and from_quiet[0][:4] == rows[0][:4] and from_quiet[0][3] == fedevi[3]


# ----------------------------------------------------------------------------------------- the script
@pytest.fixture(scope="module")
def reproduce():
    spec = importlib.util.spec_from_file_location("reproduce_script", REPO / "benchmarks" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _toy_registry(command):
    runs = {"toy": {"out": "toy", "commands": [command]}}
    tables = {"toy-accuracy": {"run": "toy", "render": "accuracy", "title": "Toy accuracy", "data": "toy data"},
              "toy-cost": {"run": "toy", "render": "cost", "title": "Toy cost"},
              "glance": {"render": "glance", "title": "Results at a glance", "from": ["toy-accuracy"]}}
    return runs, tables


def _store(root, results, command):
    (root / "toy").mkdir(parents=True, exist_ok=True)
    (root / "toy" / "results.json").write_text(json.dumps({**results, "command": command}))


def test_script_renders_a_stored_run(reproduce, seg_results, tmp_path, capsys):
    runs, tables = _toy_registry("fedseg bench --family fundus --seeds 0 1 2 --out {out}")
    _store(tmp_path, seg_results, f"fedseg bench --family fundus --seeds 0 1 2 --out {tmp_path / 'toy'}")
    assert reproduce.main(["toy-accuracy", "toy-cost", "glance", "--records", str(tmp_path)], runs, tables) == 0
    out = capsys.readouterr().out
    assert "<!-- python benchmarks/reproduce.py toy-accuracy -->\n**Toy accuracy.** 2 sites" in out
    assert "Re-make: `python benchmarks/reproduce.py toy-accuracy --run`" in out and "code abc1234" in out
    assert "| FedEvi |" in out and "| median round wall (s) |" in out and "| GraphFedSeg (personalised) | toy data |" in out


def test_script_refuses_unknown_missing_and_stale(reproduce, seg_results, tmp_path, capsys):
    runs, tables = _toy_registry("fedseg bench --family fundus --out {out}")
    assert reproduce.main(["nope", "--records", str(tmp_path)], runs, tables) == 1
    err = capsys.readouterr().err
    assert "unknown table 'nope'" in err and "toy-accuracy" in err
    # not run yet: the exact command to make it
    assert reproduce.main(["toy-accuracy", "--records", str(tmp_path)], runs, tables) == 1
    assert f"fedseg bench --family fundus --out {reproduce.OUT_ROOT / 'toy'}" in capsys.readouterr().err
    assert reproduce.main(["--all", "--records", str(tmp_path)], runs, tables) == 0  # --all: what exists (nothing)
    capsys.readouterr()
    # made by another command than the registry's: refused, or rendered with a note
    _store(tmp_path, seg_results, "fedseg bench --family polyp --out elsewhere")
    assert reproduce.main(["toy-accuracy", "--records", str(tmp_path)], runs, tables) == 1
    assert "was made by\n  fedseg bench --family polyp --out elsewhere" in capsys.readouterr().err
    assert reproduce.main(["toy-accuracy", "--ignore-command", "--records", str(tmp_path)], runs, tables) == 0
    assert "NOTE: made by `fedseg bench --family polyp --out elsewhere`" in capsys.readouterr().out
    with pytest.raises(reproduce.ReproduceError, match="unknown renderer 'pie'"):
        reproduce.check_registry(runs, {"t": {"run": "toy", "render": "pie", "title": "x"}})
    with pytest.raises(reproduce.ReproduceError, match="unknown run"):
        reproduce.check_registry(runs, {"t": {"run": "nope", "render": "cost", "title": "x"}})
    with pytest.raises(reproduce.ReproduceError, match="must write the output"):
        reproduce.check_registry({"r": {"out": "r", "commands": ["fedseg bench --out elsewhere"]}}, {})


def test_script_run_executes_the_commands_then_renders(reproduce, seg_results, tmp_path, capsys):
    """``--run``: the registry's commands run from the repository root (here one that writes a stored results.json)."""
    copy = ("python -c \"import os, shutil, sys; os.makedirs(sys.argv[2], exist_ok=True); "
            "shutil.copy(sys.argv[1], os.path.join(sys.argv[2], 'results.json'))\" {root}/src.json {out}")
    runs, tables = _toy_registry(copy)
    root = tmp_path / "root"
    root.mkdir()
    (root / "src.json").write_text(json.dumps({**seg_results, "command": copy.format(out=root / "toy", root=root)}))
    records = tmp_path / "records"
    assert reproduce.main(["toy-cost", "--run", "--out-root", str(root), "--records", str(records)], runs, tables) == 0
    assert (root / "toy" / "results.json").is_file() and "**Toy cost.**" in capsys.readouterr().out
    # the output is recorded, the output root's path written as {root}
    recorded = json.loads((records / "toy" / "results.json").read_text())
    assert recorded["command"] == copy.format(out="{root}/toy", root="{root}") and str(root) not in json.dumps(recorded)


def test_list_and_the_registered_commands_parse_with_this_code(reproduce, capsys):
    from fedseg.cli import build_parser

    reproduce.check_registry()
    assert reproduce.main(["--list"]) == 0
    out = capsys.readouterr().out
    for table_id in reproduce.TABLES:
        assert out.count(f"{table_id}: ") >= 1
    assert "fedseg bench --family fundus --methods fedavg fedevi graphfedseg fvac pathfl fedavg_e5=fedavg:local_epochs=5 " \
           f"--references local pooled --seeds 0 1 2 --out {reproduce.OUT_ROOT / 'fundus'}" in out
    for run_id, run in reproduce.RUNS.items():
        for command in reproduce.commands(run, Path("/tmp/root")):
            words = shlex.split(command)
            if words[0] == "fedseg":
                build_parser().parse_args(words[1:])  # exits on an option this code does not have
            else:
                assert words[0] == "python" and (REPO / words[1]).is_file(), (run_id, command)



def test_command_check_ignores_only_the_out_value(reproduce):
    """An output made elsewhere (``--out /tmp/b`` on a GPU machine) and copied to its registry place matches; any
    other word that differs does not."""
    expected = "fedseg bench --family fundus --seeds 0 --rounds 40 --out /work/bench_out/gpu/fundus40"
    assert reproduce.stored_command_matches("fedseg bench --family fundus --seeds 0 --rounds 40 --out /tmp/b", expected)
    assert reproduce.stored_command_matches("python -m fedseg bench --family fundus --seeds 0 --rounds 40 --out=/tmp/b",
                                            expected)
    assert not reproduce.stored_command_matches("fedseg bench --family fundus --seeds 0 --rounds 20 --out /tmp/b", expected)
    assert not reproduce.stored_command_matches("fedseg bench --family fundus --seeds 0 --rounds 40", expected)
    assert not reproduce.stored_command_matches(None, expected)
    assert reproduce.stored_command_matches("benchmarks/gpu/gpu_check.py --out /tmp/gpu", "python benchmarks/gpu/gpu_check.py --out X")


GPU_CHECK = {
    "benchmark": "gpu_check", "date": "2026-11-26T10:17:27+00:00", "command": "python benchmarks/gpu/gpu_check.py --out /tmp/gpu",
    "device": {"cpu_count": 16, "torch": "2.11.0+cu130", "cuda": True, "device": "NVIDIA H100 80GB HBM3",
               "cuda_version": "13.0", "gpu_memory_gib": 79.2, "gpu_count": 1},
    "steps": {
        "cuda_tests": {"ok": True, "seconds": 58.1, "result": {
            "command": "/x/python3 -m pytest -q -m cuda tests/test_cuda.py",
            "counts": {"passed": 2, "failed": 0, "error": 0, "skipped": 0},
            "cases": [{"test": "tests.test_cuda::test_a", "outcome": "passed", "seconds": 1.084, "detail": ""},
                      {"test": "tests.test_cuda::test_b", "outcome": "passed", "seconds": 33.099, "detail": ""}]}},
        "engine_throughput": {"ok": True, "result": [
            {"image_size": 256, "precision": "float32", "device": "cuda", "engine_images_per_s": 586.9026,
             "plain_images_per_s": 618.0837, "ratio_engine_to_plain": 0.94955, "peak_gpu_memory_mib": 795}]},
        "engine_throughput_3d": {"ok": True, "result": [
            {"patch": [64, 64, 16], "precision": "float16", "device": "cuda", "engine_volumes_per_s": 166.427,
             "plain_volumes_per_s": 173.405, "engine_mvoxels_per_s": 21.8139, "ratio_engine_to_plain": 0.95976,
             "peak_gpu_memory_mib": 189}]},
        "simulator_round": {"ok": True, "result": {
            "command": "nvflare simulator J -w W -t 4 -c site-1,site-2,site-3,site-4 -gpu 0", "profile": "default",
            "rounds": 2, "sites": 4, "sites_on_cuda": 4, "job_total_s": 49.8, "final_mean_dice": 0.74517,
            "per_round": [{"round": 0, "wall": 22.5463, "max_compute": 1.3389, "sum_compute": 4.8054, "overhead": 21.2074,
                           "bytes_up": 31058304.0},
                          {"round": 1, "wall": 1.31268, "max_compute": 0.22263, "sum_compute": 0.70404, "overhead": 1.09005,
                           "bytes_up": 31058304.0}]}},
        "site_ranks": {"ok": True, "result": {"profile": "default", "gpus": 1, "runs": [
            {"ranks": 1, "backend": "nccl", "command": "nvflare simulator J -w W -t 1 -c site-1", "job_total_s": 69.0,
             "per_round": [{"round": 0, "wall": 41.6412}], "site_compute_s": 1.3512, "train_loss": 1.30391, "steps": 6.0,
             "test_dice": 0.68951}]}},
        "volume_networks_96": {"ok": True, "result": {"rows": [
            {"network": "unetr", "patch": [96, 96, 96], "batch": 2, "precision": "float16", "device": "cuda",
             "parameters_m": 92.8, "step_s": 0.054, "mvoxels_per_s": 32.56, "loss_finite": True,
             "peak_gpu_memory_mib": 2713}]}}},
    "ok": True,
}


def test_gpu_check_tables(reproduce, tmp_path, capsys):
    runs = {"gpu": {"out": "gpu", "result": "gpu_check.json", "commands": ["python benchmarks/gpu/gpu_check.py --out {out}"]}}
    tables = {f"gpu-{part}": {"run": "gpu", "render": "gpu-check", "part": part, "title": f"GPU {part}"}
              for part in ("tests", "engine", "simulator", "site-ranks", "networks-96")}
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "gpu_check.json").write_text(json.dumps(GPU_CHECK))
    assert reproduce.main(["gpu-tests", "gpu-engine", "gpu-simulator", "--records", str(tmp_path)], runs, tables) == 0
    out = capsys.readouterr().out
    assert "**GPU tests.** machine: 16 CPUs, device NVIDIA H100 80GB HBM3, 79.2 GiB, CUDA 13.0, torch 2.11.0+cu130; " \
           "2026-11-26 10:17" in out
    assert "| `test_a` | passed | 1.1 |" in out and "| `test_b` | passed | 33.1 |" in out and "2 passed, 0 failed" in out
    assert "| 256 px image | float32 | 586.9 img | 618.1 img | 0.95 | 795 |" in out
    assert "| 64×64×16 voxel patch | float16 | 166.4 vol (21.8 Mvoxel) | 173.4 vol | 0.96 | 189 |" in out
    assert "| 1 | 1.31 | 0.22 | 0.70 | 1.09 | 31.1 |" in out and "final mean Dice 0.745" in out
    assert reproduce.main(["gpu-site-ranks", "gpu-networks-96", "--records", str(tmp_path)], runs, tables) == 0
    out = capsys.readouterr().out
    assert "| 1 | nccl | 69.0 | 41.64 | 1.35 | 1.3039 | 6 | 0.690 |" in out and "1 GPU(s) on the machine" in out
    assert "| unetr | 92.8 | 96×96×96 × 2 | float16 | 0.054 | 32.6 | 2713 |" in out
    failed = {**GPU_CHECK, "steps": {**GPU_CHECK["steps"], "simulator_round": {"ok": False, "error": "timeout"}}}
    (tmp_path / "gpu" / "gpu_check.json").write_text(json.dumps(failed))
    assert reproduce.main(["gpu-simulator", "--records", str(tmp_path)], runs, tables) == 1
    assert "step 'simulator_round' of the GPU check failed: timeout" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- code version
def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_code_version_is_the_commit_and_dirty_flag(tmp_path):
    from fedseg.bench.bench import code_version, version_label

    pkg = tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    _git(tmp_path / "repo", "init", "-q")
    _git(tmp_path / "repo", "add", ".")
    _git(tmp_path / "repo", "commit", "-q", "-m", "one")
    head = _git(tmp_path / "repo", "rev-parse", "--short", "HEAD")
    assert code_version(pkg) == {"commit": head, "dirty": False}
    (pkg / "outputs.json").write_text("{}")  # untracked files are not code changes
    assert code_version(pkg)["dirty"] is False
    (pkg / "__init__.py").write_text("x = 2\n")
    assert code_version(pkg) == {"commit": head, "dirty": True} and version_label(code_version(pkg)) == f"{head}+dirty"
    loose = tmp_path / "repo" / "untracked_pkg"  # inside the repository's folder but not its code: no commit claimed
    loose.mkdir()
    (loose / "__init__.py").write_text("")
    assert code_version(loose) == {"commit": None, "dirty": None} and version_label(code_version(loose)) == "unknown"
    assert code_version(tmp_path) == {"commit": None, "dirty": None}
    assert version_label(None) == "not recorded"


def test_code_version_of_a_copy_without_git_is_the_commit_its_copier_states(tmp_path, monkeypatch):
    """A tree copied to another machine: ``$FEDSEG_CODE_COMMIT`` names the commit, marked as stated, also where a git
    folder travelled with the copy (it can be an older commit than the tree: seen on a GPU lease); a value that is not
    a hash is ignored, and without the variable a real checkout's own commit is read."""
    from fedseg.bench.bench import code_version, version_label

    monkeypatch.setenv("FEDSEG_CODE_COMMIT", "8c08110")
    assert code_version(tmp_path) == {"commit": "8c08110", "dirty": False, "stated": True}
    assert version_label(code_version(tmp_path)) == "8c08110"
    monkeypatch.setenv("FEDSEG_CODE_COMMIT", "main; rm -rf /")
    assert code_version(tmp_path) == {"commit": None, "dirty": None}
    pkg = tmp_path / "repo" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    _git(tmp_path / "repo", "init", "-q")
    _git(tmp_path / "repo", "add", ".")
    _git(tmp_path / "repo", "commit", "-q", "-m", "one")
    monkeypatch.setenv("FEDSEG_CODE_COMMIT", "0000000")
    assert code_version(pkg) == {"commit": "0000000", "dirty": False, "stated": True}
    monkeypatch.delenv("FEDSEG_CODE_COMMIT")
    assert code_version(pkg) == {"commit": _git(tmp_path / "repo", "rev-parse", "--short", "HEAD"), "dirty": False}


def test_bench_writes_the_code_version_into_results_and_runs(tmp_path, tiny_datalist, tiny_train_config, monkeypatch):
    """``fedseg bench`` (a reference run stubbed out: no training) records the commit in results.json and in each run;
    a resumed bench lists every run's own version."""
    import fedseg.bench.bench as bench

    def fake_reference(spec, budget, mapping, root):
        rows = [{"id": "a.png", "dice": 0.5, "hd95": 1.0, "assd": 0.5}]
        return {"kind": "reference", "label": spec.label, "method": spec.label, "seed": spec.seed, "task": "segmentation",
                "train_config": tiny_train_config, "num_rounds": 1, "final": {"global": {"site-a": rows[0]}},
                "per_image": {"global": {"site-a": rows}}, "wall_s": 1.0, "round_walls": [], "report_path": None}

    monkeypatch.setattr(bench, "run_reference", fake_reference)
    mapping = tmp_path / "sites.json"
    mapping.write_text(json.dumps({"site-a": str(tiny_datalist)}))
    out = tmp_path / "out"
    res = bench.run_bench(str(out), methods=(), references=("local",), seeds=(0,), site_datalists=str(mapping))
    stored = json.loads((out / "results.json").read_text())
    version = bench.code_version()
    assert stored["code_version"] == version == res["code_version"]
    assert stored["run_code_versions"] == {bench.version_label(version): ["reference-local-seed0"]}
    assert json.loads((out / "runs" / "reference-local-seed0.json").read_text())["code_version"] == version
    assert stored["spatial"]["site-a"]["spatial_mode"] == "resize" and stored["spatial"]["site-a"]["input_size"] == 32
    assert "gpus" in stored["machine"]
    # a run trained by other code, resumed: results.json names both versions
    run_file = out / "runs" / "reference-local-seed0.json"
    run_file.write_text(json.dumps({**json.loads(run_file.read_text()), "code_version": {"commit": "0ld0ld0", "dirty": False}}))
    again = bench.run_bench(str(out), methods=(), references=("local",), seeds=(0,), site_datalists=str(mapping))
    assert again["run_code_versions"] == {"0ld0ld0": ["reference-local-seed0"]}
    from benchmarks.core.tables import code_text

    assert code_text(again) == f"code {bench.version_label(version)} (runs: 0ld0ld0 ×1)"


def test_bench_runs_method_jobs_in_parallel_and_keeps_the_bench_order(tmp_path, tiny_datalist, tiny_train_config,
                                                                      monkeypatch):
    """``--parallel 3``: three method runs (stubbed: a 0.3 s sleep each, no simulator) are in flight at once, the
    records come back in the bench's order, equal to the sequential bench's, and the header names the parallelism;
    a resumed bench reuses every run."""
    import threading
    import time

    import fedseg.bench.bench as bench

    state = {"running": 0, "most": 0}
    lock = threading.Lock()

    def fake_method(spec, budget, mapping, root, site_map_file, timeout=None):
        with lock:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
        time.sleep(0.3)
        with lock:
            state["running"] -= 1
        rows = [{"id": "a.png", "dice": 0.1 * (spec.seed + 1) + (0.05 if spec.method == "fedevi" else 0.0), "hd95": 1.0,
                 "assd": 0.5}]
        return {"kind": "method", "label": spec.label, "method": spec.method, "seed": spec.seed, "task": "segmentation",
                "train_config": tiny_train_config, "num_rounds": 1, "final": {"global": {"site-a": rows[0]}},
                "per_image": {"global": {"site-a": rows}}, "wall_s": 1.0, "round_walls": [1.0, 1.0],
                "report_path": None}

    monkeypatch.setattr(bench, "run_method", fake_method)
    mapping = tmp_path / "sites.json"
    mapping.write_text(json.dumps({"site-a": str(tiny_datalist)}))
    kwargs = dict(methods=("fedavg", "fedevi"), references=(), seeds=(0, 1, 2), site_datalists=str(mapping))
    sequential = bench.run_bench(str(tmp_path / "seq"), **kwargs)
    assert state["most"] == 1
    parallel = bench.run_bench(str(tmp_path / "par"), parallel=3, **kwargs)
    assert state["most"] == 3
    assert list(parallel["runs"]) == list(sequential["runs"])  # the bench's order: methods, then seeds
    assert parallel["approaches"] == sequential["approaches"] and parallel["comparisons"] == sequential["comparisons"]
    assert parallel["parallel_runs"] == 3 and sequential["parallel_runs"] == 1
    state["most"] = 0
    again = bench.run_bench(str(tmp_path / "par"), parallel=3, **kwargs)
    assert state["most"] == 0 and again["approaches"] == sequential["approaches"]
    with pytest.raises(ValueError, match="parallel"):
        bench.run_bench(str(tmp_path / "bad"), parallel=0, **kwargs)


def test_pairs_table_compares_two_settings_of_a_method_with_scipy(reproduce, seg_records, seg_results, tmp_path):
    """``render: pairs`` (window sample vs whole image): each setting's Dice over seeds, the paired per-image
    difference with scipy's Wilcoxon, and the round-wall ratio, from the bench's stored per-run records."""
    whole = [dict(seg_record("fedevi_whole", "fedevi", seed, -0.06, walls=(9, 8, 10, 12))) for seed in SEEDS]
    records = [r for r in seg_records if r["kind"] == "method"] + whole
    (tmp_path / "toy" / "runs").mkdir(parents=True)
    for r in records:
        (tmp_path / "toy" / "runs" / f"{r['id']}.json").write_text(json.dumps(r))
    results = build_results(seg_records + whole, SITES, dict(HEADER))
    _store(tmp_path, results, f"fedseg bench --out {tmp_path / 'toy'}")
    runs = {"toy": {"out": "toy", "commands": ["fedseg bench --out {out}"]}}
    tables = {"toy-pairs": {"run": "toy", "render": "pairs", "pairs": [["fedevi", "fedevi_whole"]], "title": "Toy pairs"}}
    text = reproduce.render("toy-pairs", tmp_path, runs=runs, tables=tables)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    # the metric as the accuracy tables name it (the toy bench has two foreground classes), not its key
    assert lines[0].startswith("| method (A vs B) | Dice (mean of rim, cup): A | Dice (mean of rim, cup): B | Δ Dice (mean")
    cells = _row(lines, "FedEvi vs FedEvi `fedevi_whole`")
    assert cells[0] == _pm(_site_mean_per_seed(records, "fedevi", "dice"), 3)
    assert cells[1] == _pm(_site_mean_per_seed(records, "fedevi_whole", "dice"), 3)
    x, y = _pairs(records, "fedevi", "fedevi_whole", "dice")
    p = sps.wilcoxon(x, y).pvalue
    assert cells[2] == f"{np.mean(x - y):+.4f} ({p:.3f}, {len(x)})" and p >= 1e-3

    def median_wall(label):  # every round but the first, pooled over seeds
        return np.median([w for r in records if r["label"] == label for w in r["round_walls"][1:]])

    assert cells[3] == f"{median_wall('fedevi') / median_wall('fedevi_whole'):.2f}x"


# ------------------------------------------------------------------------ seeds of a bench, the budget curve
def _store_bench(root, name, records, command, rounds=None):
    """A bench output as ``fedseg bench`` leaves it: ``runs/<id>.json`` per run and ``results.json``."""
    (root / name / "runs").mkdir(parents=True, exist_ok=True)
    for r in records:
        (root / name / "runs" / f"{r['id']}.json").write_text(json.dumps(r))
    seeds = sorted({r["seed"] for r in records})
    header = {**HEADER, "seeds": seeds, "budget": {**HEADER["budget"], "rounds": rounds},
              "runs": {r["id"]: str(root / name / "runs" / f"{r['id']}.json") for r in records}}
    results = build_results(records, SITES, header)
    (root / name / "results.json").write_text(json.dumps({**results, "command": command}))


def test_a_table_of_one_seed_re_aggregates_the_bench_and_accepts_other_seeds_only(reproduce, seg_records, tmp_path):
    """``"seeds": [0]``: the Dice cells and Δ are seed 0's alone (checked against the records and scipy), from a bench
    of three seeds or of seed 0 only; a bench that did not run the seed, or differs in another word, is refused."""
    registry = "fedseg bench --family fundus --seeds 0 1 2 --out {out}"
    runs = {"toy": {"out": "toy", "commands": [registry]}}
    tables = {"one": {"run": "toy", "render": "accuracy", "seeds": [0], "title": "Seed 0"},
              "all": {"run": "toy", "render": "accuracy", "title": "All seeds"},
              "seed1": {"run": "toy", "render": "accuracy", "seeds": [1], "title": "Seed 1"}}
    seed0 = [r for r in seg_records if r["seed"] == 0]
    x, y = (np.array(v) for v in zip(*[(a[m], b[m]) for m in ["dice"] for s in SITES for a, b in zip(
        next(r for r in seed0 if r["label"] == "fedevi")["per_image"]["global"][s],
        next(r for r in seed0 if r["label"] == "fedavg")["per_image"]["global"][s])]))
    expected_delta = f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    for stored_records, stored_seeds in ((seg_records, "0 1 2"), (seed0, "0")):
        _store_bench(tmp_path, "toy", stored_records, f"fedseg bench --family fundus --seeds {stored_seeds} --out elsewhere")
        text = reproduce.render("one", tmp_path, runs=runs, tables=tables)
        lines = [line for line in text.splitlines() if line.startswith("|")]
        fedevi = _row(lines, "FedEvi")
        assert fedevi[0] == f"{_site_mean_per_seed(seed0, 'fedevi', 'dice')[0]:.3f}"  # one seed: no spread
        assert fedevi[next(i for i, h in enumerate(_header(lines)) if h.startswith("Δ Dice"))] == expected_delta
        assert "seed 0;" in text
        assert ("of a bench that ran seed(s) 0, 1, 2" in text) == (stored_seeds == "0 1 2")
    # the seed-0 bench: the all-seeds table's command differs; seed 1 was not run
    with pytest.raises(reproduce.ReproduceError, match="was made by"):
        reproduce.render("all", tmp_path, runs=runs, tables=tables)
    with pytest.raises(reproduce.ReproduceError, match="was made by"):
        reproduce.render("seed1", tmp_path, runs=runs, tables=tables)
    _store_bench(tmp_path, "toy", seed0, "fedseg bench --family polyp --seeds 0 --out elsewhere")
    with pytest.raises(reproduce.ReproduceError, match="was made by"):
        reproduce.render("one", tmp_path, runs=runs, tables=tables)
    assert reproduce.same_but_seeds("fedseg bench --seeds 0 --rounds 20 --out a", "fedseg bench --seeds 0 1 2 --rounds 20 --out b")
    assert not reproduce.same_but_seeds("fedseg bench --seeds 0 --rounds 10", "fedseg bench --seeds 0 1 2 --rounds 20")


def test_a_re_render_after_a_record_changed_shows_the_new_record(reproduce, seg_records, tmp_path):
    """A bench's aggregation is computed once per process for the same records: a run record changed on disk (same
    path, other numbers) is aggregated afresh, and the table shows scipy's Wilcoxon of the new per-image values."""
    runs = {"toy": {"out": "toy", "commands": ["fedseg bench --family fundus --seeds 0 1 2 --out {out}"]}}
    tables = {"one": {"run": "toy", "render": "accuracy", "seeds": [0], "title": "Seed 0"}}
    seed0 = [json.loads(json.dumps(r)) for r in seg_records if r["seed"] == 0]

    def delta_cell():
        lines = [line for line in reproduce.render("one", tmp_path, runs=runs, tables=tables).splitlines()
                 if line.startswith("|")]
        return _row(lines, "FedEvi")[next(i for i, h in enumerate(_header(lines)) if h.startswith("Δ Dice"))]

    def expected(records):
        fedevi, fedavg = (next(r for r in records if r["label"] == label)["per_image"]["global"] for label in ("fedevi", "fedavg"))
        x, y = (np.array(v) for v in zip(*[(a["dice"], b["dice"]) for s in SITES for a, b in zip(fedevi[s], fedavg[s])]))
        return f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"

    _store_bench(tmp_path, "toy", seed0, "fedseg bench --family fundus --seeds 0 --out elsewhere")
    before = delta_cell()
    assert before == expected(seed0) and delta_cell() == before
    fedevi = next(r for r in seed0 if r["label"] == "fedevi")
    for rows in fedevi["per_image"]["global"].values():
        for row in rows:
            row["dice"] = min(1.0, row["dice"] + 0.2)
    (tmp_path / "toy" / "runs" / f"{fedevi['id']}.json").write_text(json.dumps(fedevi))
    after = delta_cell()
    assert after == expected(seed0) and after != before


def test_a_table_with_another_baseline_re_aggregates_every_seed_against_it(reproduce, seg_records, tmp_path):
    """``"baseline": "fedevi"``: each Δ is against FedEvi of the same seed (scipy's Wilcoxon over the pooled image
    pairs, and the per-seed site means from the records); FedAvg becomes a compared row; an unknown label is refused."""
    command = "fedseg bench --family fundus --seeds 0 1 2 --out {out}"
    runs = {"toy": {"out": "toy", "commands": [command]}}
    tables = {"vs": {"run": "toy", "render": "accuracy", "baseline": "fedevi", "title": "Against FedEvi"},
              "bad": {"run": "toy", "render": "accuracy", "baseline": "nobody", "title": "Against nobody"}}
    _store_bench(tmp_path, "toy", seg_records, "fedseg bench --family fundus --seeds 0 1 2 --out elsewhere")
    lines = [line for line in reproduce.render("vs", tmp_path, runs=runs, tables=tables).splitlines()
             if line.startswith("|")]
    header = _header(lines)
    delta = next(i for i, h in enumerate(header) if h.startswith("Δ Dice vs"))
    assert header[delta].startswith("Δ Dice vs FedEvi")
    pairs = [(a["dice"], b["dice"]) for seed in SEEDS for s in SITES for a, b in zip(
        next(r for r in seg_records if r["label"] == "fedavg" and r["seed"] == seed)["per_image"]["global"][s],
        next(r for r in seg_records if r["label"] == "fedevi" and r["seed"] == seed)["per_image"]["global"][s])]
    x, y = (np.array(v) for v in zip(*pairs))
    fedavg = _row(lines, "FedAvg")
    assert fedavg[delta] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    per_seed = np.array(_site_mean_per_seed(seg_records, "fedavg", "dice")) - np.array(
        _site_mean_per_seed(seg_records, "fedevi", "dice"))
    assert fedavg[header.index("Δ Dice per seed (mean ± std, seeds ahead)")] == f"{per_seed.mean():+.3f} ± {per_seed.std(ddof=1):.3f} ({int((per_seed > 0).sum())} of 3)"
    assert _row(lines, "FedEvi")[delta] == ""
    with pytest.raises(ValueError, match="nobody"):
        reproduce.render("bad", tmp_path, runs=runs, tables=tables)


def test_budget_curve_has_a_column_per_bench_and_names_the_missing_one(reproduce, tmp_path):
    """``render: budget``: per approach, each bench's Dice and its paired Δ to FedAvg (scipy's Wilcoxon), the
    bench's rounds in the header; a bench not run yet is named, not drawn."""
    benches = {}
    for name, rounds, gain in (("b10", 10, -0.04), ("b30", 30, 0.03)):
        records = [seg_record("fedavg", "fedavg", 0), seg_record("graphfedseg", "graphfedseg", 0, gain, personalised=True),
                   seg_record("fedprox", "fedprox", 0)]
        _store_bench(tmp_path, name, records, f"fedseg bench --rounds {rounds} --seeds 0 --out x", rounds=rounds)
        benches[rounds] = records
    runs = {f"b{r}": {"out": f"b{r}", "commands": [f"fedseg bench --rounds {r} --seeds 0 --out {{out}}"]} for r in (10, 30, 100)}
    tables = {"curve": {"run": ["b10", "b30", "b100"], "render": "budget", "seeds": [0], "missing_ok": True,
                        "labels": ["fedavg", "graphfedseg"], "title": "Budget"}}
    text = reproduce.render("curve", tmp_path, runs=runs, tables=tables)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert _header(lines) == ["10 rounds: Dice (Δ vs FedAvg, Wilcoxon p)", "30 rounds: Dice (Δ vs FedAvg, Wilcoxon p)"]
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["FedAvg", "GraphFedSeg", "GraphFedSeg (personalised)"]
    for col, rounds in enumerate((10, 30)):
        records = benches[rounds]
        for name, model in (("GraphFedSeg", "global"), ("GraphFedSeg (personalised)", "personalized")):
            a = next(r for r in records if r["label"] == "graphfedseg")["per_image"][model]
            b = next(r for r in records if r["label"] == "fedavg")["per_image"]["global"]
            x = np.array([row["dice"] for s in SITES for row in a[s]])
            y = np.array([row["dice"] for s in SITES for row in b[s]])
            dice = np.mean([next(r for r in records if r["label"] == "graphfedseg")["final"][model][s]["dice"] for s in SITES])
            assert _row(lines, name)[col] == f"{dice:.3f} ({np.mean(x - y):+.3f}, {_fmt_p(sps.wilcoxon(x, y).pvalue)})"
        assert _row(lines, "FedAvg")[col] == f"{np.mean([records[0]['final']['global'][s]['dice'] for s in SITES]):.3f}"
    assert "Not run yet: `b100`." in text and "FedProx" not in text and "fedprox" not in text
    assert "rounds 10 / 30, local epochs" in text  # the caption's budget: every column's rounds
    # no bench at all: the table is missing, with the paths
    with pytest.raises(reproduce.MissingOutput, match="none of its runs"):
        reproduce.render("curve", tmp_path / "empty", runs=runs, tables=tables)


def test_protocol_ablation_rows_pair_each_bench_and_each_method_against_the_reference_bench(reproduce, tmp_path):
    """``render: protocol-ablation``: per row, the baseline's and the method's Dice over seeds, the method − baseline
    difference per seed (mean ± std, seeds ahead) and per image (scipy's Wilcoxon), and each one's per-image
    difference to its run in the reference bench; a metric or model other than the reference's leaves those blank."""
    benches = {}
    for name, offset in (("default", 0.0), ("variant", -0.03)):
        records = []
        for seed in SEEDS:
            records += [seg_record("fedavg", "fedavg", seed, offset), seg_record("fedevi", "fedevi", seed, 0.02 + offset)]
        _store_bench(tmp_path, name, records, f"fedseg bench --{name} --out x")
        benches[name] = records
    runs = {n: {"out": n, "commands": [f"fedseg bench --{n} --out {{out}}"]} for n in ("default", "variant", "later")}
    tables = {"ablation": {"run": ["default", "variant", "later"], "render": "protocol-ablation", "missing_ok": True,
                           "reference": ("default", "fedavg", "fedevi"), "title": "Toy ablation",
                           "rows": [("default", "fedavg", "fedevi", "default", "dice", "global"),
                                    ("variant", "fedavg", "fedevi", "+ variant", "dice", "global"),
                                    ("variant", "fedavg", "fedevi", "+ variant, HD95", "hd95", "global")]}}
    text = reproduce.render("ablation", tmp_path, runs=runs, tables=tables)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = _row(lines, "+ variant")
    records = benches["variant"]
    assert cells[1] == _pm(_site_mean_per_seed(records, "fedavg", "dice"), 3)
    assert cells[2] == _pm(_site_mean_per_seed(records, "fedevi", "dice"), 3)
    per_seed = np.array(_site_mean_per_seed(records, "fedevi", "dice")) - np.array(_site_mean_per_seed(records, "fedavg", "dice"))
    assert cells[3] == f"{per_seed.mean():+.3f} ± {per_seed.std(ddof=1):.3f} ({int((per_seed > 0).sum())} of 3)"
    x, y = _pairs(records, "fedevi", "fedavg", "dice")
    assert cells[4] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    for col, label in ((5, "fedavg"), (6, "fedevi")):  # against the same method in the reference bench, image by image
        x, y = _pairs(records + [dict(r, label="ref") for r in benches["default"] if r["label"] == label], label, "ref", "dice")
        assert cells[col] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"
    assert _row(lines, "default")[5:] == ["", ""] and _row(lines, "+ variant, HD95")[5:] == ["", ""]
    assert "Not run yet: `later`." in text


def test_paper_column_puts_each_published_number_on_its_approach(reproduce, seg_results, tmp_path):
    """``"paper"``: a last column with the registry's published number on the first row of each label (GraphFedSeg's
    on its global row, not its personalised one), blank for rows without one; the note names the source."""
    runs, tables = _toy_registry("fedseg bench --family fundus --seeds 0 1 2 --out {out}")
    _store(tmp_path, seg_results, f"fedseg bench --family fundus --seeds 0 1 2 --out {tmp_path / 'toy'}")
    tables["toy-accuracy"]["paper"] = {"title": "paper Δ", "note": "from Table 9.",
                                       "values": {"graphfedseg": "+0.041 (T2)", "fedevi": "+0.098 (T1)"}}
    text = reproduce.render("toy-accuracy", tmp_path, runs=runs, tables=tables)
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert _header(lines)[-1] == "paper Δ" and "Paper column: from Table 9." in text
    assert _row(lines, "GraphFedSeg")[-1] == "+0.041 (T2)" and _row(lines, "FedEvi")[-1] == "+0.098 (T1)"
    assert _row(lines, "GraphFedSeg (personalised)")[-1] == "" and _row(lines, "FedAvg")[-1] == ""
    assert len({len(line.split("|")) for line in lines}) == 1  # every row has the new cell


def test_a_one_site_column_shows_that_sites_value_and_its_paired_test(reproduce, tmp_path):
    """``metrics: ["dice_fov@s1"]`` (a metric only site s1 reports, like DRIVE's field-of-view Dice): the cell is s1's
    value (mean ± std over seeds of its final), the Δ is the Wilcoxon test over s1's images alone (scipy); a mean over
    sites would have no value."""
    records = []
    for seed in SEEDS:
        for label, offset in (("fedavg", 0.0), ("fedevi", -0.03)):
            rec = seg_record(label, label, seed, offset)
            rng = np.random.default_rng(seed * 7 + len(label))
            for row in rec["per_image"]["global"]["s1"]:
                row["dice_fov"] = float(np.clip(row["dice"] + rng.normal(0.02, 0.05), 0, 1))
            rec["final"]["global"]["s1"]["dice_fov"] = float(np.mean([r["dice_fov"] for r in rec["per_image"]["global"]["s1"]]))
            records.append(rec)
    _store_bench(tmp_path, "toy", records, "fedseg bench --seeds 0 1 2 --out x")
    runs = {"toy": {"out": "toy", "commands": ["fedseg bench --seeds 0 1 2 --out {out}"]}}
    tables = {"t": {"run": "toy", "render": "accuracy", "metrics": ["dice_fov@s1"], "title": "FOV"}}
    lines = [line for line in reproduce.render("t", tmp_path, runs=runs, tables=tables).splitlines() if line.startswith("|")]
    header = _header(lines)
    assert "Dice FOV (s1)" in header and "Δ Dice FOV (s1) vs FedAvg (Wilcoxon p)" in header
    fedevi = dict(zip(header, _row(lines, "FedEvi")))
    finals = [r["final"]["global"]["s1"]["dice_fov"] for r in sorted(records, key=lambda r: r["seed"]) if r["label"] == "fedevi"]
    assert fedevi["Dice FOV (s1)"] == _pm(finals, 3)
    x = np.array([row["dice_fov"] for s in SEEDS for r in records if r["label"] == "fedevi" and r["seed"] == s
                  for row in r["per_image"]["global"]["s1"]])
    y = np.array([row["dice_fov"] for s in SEEDS for r in records if r["label"] == "fedavg" and r["seed"] == s
                  for row in r["per_image"]["global"]["s1"]])
    assert fedevi["Δ Dice FOV (s1) vs FedAvg (Wilcoxon p)"] == f"{np.mean(x - y):+.3f} ({_fmt_p(sps.wilcoxon(x, y).pvalue)})"


def test_input_text_names_the_sites_where_their_inputs_differ():
    """One text where every site reaches the network alike; else each text with its sites (CHASE_DB1 is rescaled by
    0.5 in the retina federation, DRIVE and STARE are not)."""
    from benchmarks.core.tables import input_text

    patch = {"spatial_mode": "patch", "rescale": 1.0, "spatial_dims": 2, "input_size": 64}
    same = {"spatial": {"a": patch, "b": dict(patch)}}
    assert input_text(same) == "native resolution, 64 px patches"
    mixed = {"spatial": {"DRIVE": patch, "STARE": dict(patch), "CHASE_DB1": {**patch, "rescale": 0.5}}}
    assert input_text(mixed) == ("native resolution, 64 px patches (DRIVE, STARE); "
                                 "native resolution, 64 px patches, rescale 0.5 (CHASE_DB1)")
    resized = {"spatial": {"a": {"spatial_mode": "resize", "spatial_dims": 2, "input_size": 96}}}
    assert input_text(resized) == "images resized to 96 px"


def test_every_method_and_reference_has_a_page_name():
    """The results page names each method as its paper does (FedProx, SCAFFOLD, ...), not by its CLI label."""
    from fedseg.bench.bench import REFERENCES
    from benchmarks.core.tables import METHOD_NAMES, approach_title
    from fedseg.recipes import available_methods

    missing = [m for m in [*available_methods(), *REFERENCES] if m not in METHOD_NAMES]
    assert not missing, f"add a page name to benchmarks.core.tables.METHOD_NAMES for {missing}"
    assert approach_title({"method": "scaffold", "label": "scaffold"}) == "SCAFFOLD"
    assert approach_title({"method": "fedbn", "label": "fedbn", "model": "personalized"}) == "FedBN (personalised)"


def test_bench_reuse_copies_runs_of_the_same_configuration_only(tmp_path, tiny_datalist, tiny_train_config, monkeypatch):
    """``fedseg bench --reuse OTHER``: a run finished in OTHER with the same run configuration is copied, not trained
    (seed 0 of a one-seed bench inside a three-seed one); a run of another budget is trained."""
    import fedseg.bench.bench as bench
    from fedseg.cli import main

    trained = []

    def fake_run(kind):
        def run(spec, budget, *_, **__):
            trained.append((spec.label, spec.seed, budget.rounds))
            rows = [{"id": "a.png", "dice": 0.5 + 0.01 * spec.seed, "hd95": 1.0, "assd": 0.5}]
            return {"kind": kind, "label": spec.label, "method": spec.method, "seed": spec.seed, "task": "segmentation",
                    "train_config": tiny_train_config, "num_rounds": budget.rounds, "final": {"global": {"site-a": rows[0]}},
                    "per_image": {"global": {"site-a": rows}}, "wall_s": 1.0, "round_walls": [2.0, 1.0],
                    "report_path": None}
        return run

    monkeypatch.setattr(bench, "run_method", fake_run("method"))
    monkeypatch.setattr(bench, "run_reference", fake_run("reference"))
    mapping = tmp_path / "sites.json"
    mapping.write_text(json.dumps({"site-a": str(tiny_datalist)}))

    def bench_argv(out, seeds, rounds):
        return ["bench", "--out", str(tmp_path / out), "--site-datalists", str(mapping), "--methods", "fedavg",
                "--references", "--seeds", *seeds, "--rounds", str(rounds)]

    main(bench_argv("first", ["0"], 5))
    assert trained == [("fedavg", 0, 5)]
    main(bench_argv("second", ["0", "1"], 5) + ["--reuse", str(tmp_path / "first")])
    assert trained == [("fedavg", 0, 5), ("fedavg", 1, 5)]  # seed 0 copied, seed 1 trained
    copied = "method-fedavg-seed0.json"
    assert json.loads((tmp_path / "second" / "runs" / copied).read_text()) == json.loads(
        (tmp_path / "first" / "runs" / copied).read_text())
    # another budget: a different run, trained although OTHER has the seed
    main(bench_argv("third", ["0"], 7) + ["--reuse", str(tmp_path / "first")])
    assert trained[-1] == ("fedavg", 0, 7)
