"""``benchmarks/ablations/term_sizes.py``: the loss terms' sizes read back from a finished bench's run reports, per
round, site and seed, with the bench's header; and its refusals (a label the bench did not run, runs without terms)."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("term_sizes", REPO / "benchmarks" / "ablations" / "term_sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(root: Path, with_terms: bool = True) -> Path:
    """A finished bench: results.json and two runs of ``fvac`` (seeds 0, 1) whose reports hold two rounds."""
    (root / "runs").mkdir(parents=True)
    (root / "results.json").write_text(json.dumps({"command": "fedseg bench ...", "date": "2026-11-29T10:00:00",
                                                   "seeds": [0, 1], "sites": {"a": {}, "b": {}}}))
    for seed in (0, 1):
        rounds = [{"metrics": {site: {"train_loss": 0.5, **({"fvda_loss_share": 0.001 * (r + 1) + seed,
                                                               "fvda_grad_ratio": 0.02 * (r + 1)} if with_terms else {})}
                               for site in ("b", "a")}} for r in range(2)]
        report = root / f"report-{seed}.json"
        report.write_text(json.dumps({"rounds": rounds}))
        (root / "runs" / f"method-fvac-seed{seed}.json").write_text(json.dumps(
            {"kind": "method", "label": "fvac", "seed": seed, "id": f"method-fvac-seed{seed}",
             "variant_args": {"record_terms": 2}, "report_path": str(report)}))
    return root


def test_terms_are_read_per_round_site_and_seed_with_the_bench_header(tmp_path):
    term_sizes = _module()
    bench = _bench(tmp_path / "bench")
    term_sizes.main(["--bench", str(bench), "--labels", "fvac", "--metrics", "fvda_loss_share", "fvda_grad_ratio",
                     "--out", str(tmp_path / "out")])
    out = json.loads((tmp_path / "out" / "term_sizes.json").read_text())
    assert out["bench"]["command"] == "fedseg bench ..." and out["metrics"] == ["fvda_loss_share", "fvda_grad_ratio"]
    runs = out["runs"]["fvac"]
    assert sorted(runs) == ["0", "1"] and runs["1"]["variant_args"] == {"record_terms": 2}
    assert runs["1"]["rounds"][1]["a"] == {"fvda_loss_share": pytest.approx(1.002), "fvda_grad_ratio": pytest.approx(0.04)}
    assert list(runs["0"]["rounds"][0]) == ["a", "b"]  # sites in a stable order


def test_refusals(tmp_path):
    term_sizes = _module()
    bench = _bench(tmp_path / "bench", with_terms=False)
    with pytest.raises(SystemExit, match="no method run labelled 'moon'"):
        term_sizes.main(["--bench", str(bench), "--labels", "moon", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="record_terms"):
        term_sizes.main(["--bench", str(bench), "--labels", "fvac", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="has not finished"):
        term_sizes.main(["--bench", str(tmp_path / "none"), "--labels", "fvac", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o" / "term_sizes.json").exists()
