"""``fedseg bench`` end to end in NVFlare's real simulator (tiny: 2 polyp sites, 1 round, 2 seeds), its resume,
the privacy of per-image results, and ``fedseg run --seed/--set`` reproducibility."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from scipy import stats as sps

from fedseg.cli import main
from sim_utils import run_cli

pytestmark = pytest.mark.slow

SITES = ["site-1", "site-2"]


def _bench_argv(out: Path):
    return ["bench", "--out", str(out), "--family", "polyp", "--sites", *SITES, "--data-profile", "tiny",
            "--profile", "tiny", "--rounds", "1", "--local-epochs", "1", "--set", "batch_size=2",
            "--methods", "fedavg", "fedevi", "--references", "local", "--seeds", "0", "1"]


def _run_seed1_argv(bench_out: Path, workspace: Path):
    """``fedseg run`` with the bench's data and budget, seed 1."""
    return ["run", "fedavg", "-n", "2", "-w", str(workspace), "--profile", "tiny", "--rounds", "1", "--local-epochs",
            "1", "--family", "polyp", "--site-datalists", str(bench_out / "site_datalists.json"), "--seed", "1",
            "--set", "batch_size=2"]


def polyp_bench(root: Path):
    """Shared run ``bench_polyp`` (tests/sim_utils.py; run in the background): the bench into ``root/bench``, then
    ``fedseg run --seed 1`` into ``root/run_seed1``; the readers get ``root``."""

    def run() -> Path:
        run_cli(_bench_argv(root / "bench"), root / "bench.log")
        run_cli(_run_seed1_argv(root / "bench", root / "run_seed1"), root / "run_seed1.log")
        return root

    return run


def fedefm_bench(root: Path):
    """Shared run ``bench_fedefm``: FedEFM (1 round) on the built-in X-ray silos and the pooled reference."""
    out = root / "fedefm"
    argv = ["bench", "--out", str(out), "--family", "xray_foundation", "--sites", *SITES, "--data-profile", "tiny",
            "--profile", "tiny", "--rounds", "1", "--local-epochs", "1", "--set", "batch_size=4", "data_unseen=0.5",
            "--methods", "fedefm", "--references", "pooled", "--seeds", "0", "--baseline", "fedefm"]

    def run() -> Path:
        run_cli(argv, root / "fedefm.log")
        return out

    return run


@pytest.fixture()
def bench(shared_runs):
    return shared_runs("bench_polyp") / "bench"


def _site_rows(out: Path, label: str, seed: int, site: str):
    """Per-image rows as the site wrote them into its own simulator workspace."""
    path = out / "workspaces" / f"method-{label}-seed{seed}" / site / "fedseg_outputs" / site / "per_image_global.json"
    data = json.loads(path.read_text())
    assert data["site"] == site and data["model"] == "global" and data["split"] == "test"
    return data["rows"]


@pytest.mark.shared_runs("bench_polyp")
def test_outputs_and_paired_test_equal_scipy_on_site_files(bench):
    results = json.loads((bench / "results.json").read_text())
    assert (bench / "results.md").is_file()
    assert (bench / "plots" / "dice_per_site.png").is_file() and (bench / "plots" / "val_dice_rounds.png").is_file()
    assert set(results["approaches"]) == {"fedavg", "fedevi", "local"}
    assert results["approaches"]["fedevi"]["seeds"] == [0, 1]
    # Wilcoxon of FedEvi vs FedAvg, pooled over seeds and sites, from the files in the site workspaces
    x, y = [], []
    for seed in (0, 1):
        for site in SITES:
            a, b = _site_rows(bench, "fedevi", seed, site), _site_rows(bench, "fedavg", seed, site)
            assert [r["id"] for r in a] == [r["id"] for r in b] and a
            x += [r["dice"] for r in a]
            y += [r["dice"] for r in b]
    got = results["comparisons"]["fedevi"]["metrics"]["dice"]["all"]
    assert got["n"] == len(x)
    assert got["wilcoxon_p"] == pytest.approx(sps.wilcoxon(x, y).pvalue, rel=1e-9)
    assert got["ttest_p"] == pytest.approx(sps.ttest_rel(x, y).pvalue, rel=1e-9)
    # a site's summary in report.json is the mean of its per-image rows
    run = json.loads((bench / "runs" / "method-fedavg-seed1.json").read_text())
    report = json.loads(Path(run["report_path"]).read_text())
    for site in SITES:
        rows = _site_rows(bench, "fedavg", 1, site)
        assert report["final"]["global"][site]["dice"] == pytest.approx(sum(r["dice"] for r in rows) / len(rows))
    # seed spread per site, and the cost table against FedAvg
    spread = results["approaches"]["fedavg"]["summary"]["site-1"]["dice"]
    assert spread["n"] == 2 and spread["std"] >= 0
    assert results["timing"]["fedavg"]["round_wall_ratio_to_fedavg"] == pytest.approx(1.0)
    assert results["timing"]["fedevi"]["round_wall_ratio_to_fedavg"] > 0
    assert "Wilcoxon" in (bench / "results.md").read_text()
    # provenance for the results page: the commit of this code in results.json and in every run, the spatial mode
    from fedseg.bench.bench import code_version
    from benchmarks.core.tables import accuracy_table, caption

    assert results["code_version"] == code_version()
    assert all(json.loads(p.read_text())["code_version"] == code_version() for p in (bench / "runs").glob("*.json"))
    assert {s["spatial_mode"] for s in results["spatial"].values()} == {"resize"}
    assert "images resized to 32 px" in caption(results, "t")
    assert [line.split("|")[1].strip() for line in accuracy_table(results)[2:]] == ["FedAvg", "FedEvi", "local only"]


@pytest.mark.shared_runs("bench_polyp")
def test_per_image_rows_never_reach_the_server(bench):
    for run_dir in (bench / "workspaces").iterdir():
        server = run_dir / "server" / "simulate_job"
        ids = {r["id"] for site in SITES for r in json.loads(
            next((run_dir / site).rglob("per_image_global.json")).read_text())["rows"]}
        for name in ("report.json", "privacy_audit.jsonl"):
            text = (server / name).read_text()
            assert "per_image" not in text and '"rows"' not in text
            assert not any(i in text for i in ids), f"a per-image id leaked into {name}"
        report = json.loads((server / "report.json").read_text())
        for site_metrics in report["final"]["global"].values():
            assert set(site_metrics) == {"dice", "hd95", "assd"}
        audit = [json.loads(line) for line in (server / "privacy_audit.jsonl").read_text().splitlines()]
        evaluate = [e for e in audit if e.get("task") == "evaluate"]
        assert evaluate, "the audit recorded no evaluate results"


@pytest.mark.shared_runs("bench_polyp")
def test_rerun_skips_finished_runs(bench, capsys):
    runs = sorted((bench / "runs").glob("*.json"))
    assert len(runs) == 6  # (fedavg, fedevi, local) x 2 seeds
    before = {p: p.stat().st_mtime_ns for p in runs}
    workspaces = {p: p.stat().st_mtime_ns for p in (bench / "workspaces").iterdir()}
    capsys.readouterr()
    main(_bench_argv(bench))  # starts no simulator: every run is finished
    out = capsys.readouterr().out
    assert out.count("skipped") == 6 and "done" not in out.split("# fedseg bench")[0]
    assert {p: p.stat().st_mtime_ns for p in runs} == before
    assert {p: p.stat().st_mtime_ns for p in (bench / "workspaces").iterdir()} == workspaces


@pytest.mark.shared_runs("bench_polyp")
def test_refresh_rereads_method_runs_from_their_workspaces(bench, capsys):
    """A stored run made when the tables had fewer metrics (hd95 dropped here by hand) gets them back from
    its workspace with ``--refresh``; nothing is re-trained and the reference runs are kept as stored."""
    stale_path = bench / "runs" / "method-fedavg-seed0.json"
    original = json.loads(stale_path.read_text())
    stale = json.loads(stale_path.read_text())
    for site in SITES:
        del stale["final"]["global"][site]["hd95"]
    stale["per_image"]["global"] = {}
    stale_path.write_text(json.dumps(stale))
    local_runs = {p: p.stat().st_mtime_ns for p in (bench / "runs").glob("reference-local-*.json")}
    workspaces = {p: p.stat().st_mtime_ns for p in (bench / "workspaces").iterdir()}
    capsys.readouterr()
    main(_bench_argv(bench) + ["--refresh"])  # re-reads workspaces, starts no simulator
    out = capsys.readouterr().out
    assert out.count("re-read from its workspace") == 4 and out.count("finished earlier") == 2
    assert "done" not in out.split("# fedseg bench")[0]
    refreshed = json.loads(stale_path.read_text())
    report = json.loads(Path(original["report_path"]).read_text())
    for site in SITES:
        assert refreshed["final"]["global"][site]["hd95"] == pytest.approx(report["final"]["global"][site]["hd95"])
        assert refreshed["per_image"]["global"][site] == _site_rows(bench, "fedavg", 0, site)
    # the same code re-reads the same record, timing and command included (NaN-safe comparison)
    assert json.dumps(refreshed, sort_keys=True) == json.dumps(original, sort_keys=True)
    assert {p: p.stat().st_mtime_ns for p in (bench / "runs").glob("reference-local-*.json")} == local_runs
    assert {p: p.stat().st_mtime_ns for p in (bench / "workspaces").iterdir()} == workspaces


@pytest.mark.shared_runs("bench_polyp")
def test_run_seed_reproduces_and_changes_the_model(shared_runs):
    """``fedseg run --seed 1 --set ...`` with the bench's data and budget gives bit-identical global weights to
    the bench's FedAvg seed-1 run (a separate simulator job); seed 0 gives different ones."""
    root = shared_runs("bench_polyp")
    bench, ws = root / "bench", root / "run_seed1"
    report = json.loads(next(ws.rglob("report.json")).read_text())
    assert report["config"]["train_config"]["seed"] == 1 and report["config"]["train_config"]["batch_size"] == 2

    def weights(root: Path):
        ckpt = torch.load(next(root.rglob("FL_global_model.pt")), map_location="cpu", weights_only=True)
        assert ckpt["train_config"]["seed"] in (0, 1)  # the controller stores the job's train_config
        return ckpt["model"]

    mine = weights(ws)
    same_seed = weights(bench / "workspaces" / "method-fedavg-seed1")
    other_seed = weights(bench / "workspaces" / "method-fedavg-seed0")
    assert all(torch.equal(mine[k], same_seed[k]) for k in mine)
    assert any(not torch.equal(mine[k], other_seed[k]) for k in mine)
    bench_run = json.loads((bench / "runs" / "method-fedavg-seed1.json").read_text())
    # same weights, same test images: the same test metrics
    assert report["final"]["global"] == json.loads(Path(bench_run["report_path"]).read_text())["final"]["global"]


@pytest.mark.shared_runs("bench_fedefm")
def test_fedefm_bench_on_foundation_silos_with_pooled_reference(shared_runs):
    """Classification end to end: FedEFM (1 round) on the built-in X-ray silos and the pooled (centralised)
    reference; accuracy tables, val_accuracy per round, McNemar of pooled vs FedEFM from the site files."""
    from fedseg.bench.stats import mcnemar_exact

    out = shared_runs("bench_fedefm")
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "classification" and results["baseline"] == "fedefm"
    assert set(results["approaches"]) == {"fedefm", "pooled"}
    for name in ("fedefm", "pooled"):
        assert 0 <= results["approaches"][name]["summary"]["mean"]["accuracy"]["mean"] <= 1
    assert len(results["methods"]["fedefm"]["val_accuracy_per_round"]) == 1
    pooled_run = json.loads((out / "runs" / "reference-pooled-seed0.json").read_text())
    assert pooled_run["train_config"]["task"] == "classification" and len(pooled_run["val_accuracy_per_round"]) == 1
    x, y = [], []
    for site in SITES:
        mine = pooled_run["per_image"]["global"][site]
        theirs = _site_rows(out, "fedefm", 0, site)
        assert [r["id"] for r in mine] == [r["id"] for r in theirs] and mine
        x += [r["correct"] for r in mine]
        y += [r["correct"] for r in theirs]
    assert results["comparisons"]["pooled"]["metrics"]["correct"]["all"] == mcnemar_exact(x, y)
    text = (out / "results.md").read_text()
    assert "## Accuracy" in text and "McNemar" in text and "Dice" not in text
    assert (out / "plots" / "accuracy_per_site.png").is_file() and (out / "plots" / "val_accuracy_rounds.png").is_file()
