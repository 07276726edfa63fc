"""``benchmarks/ablations/ssa_weights.py``: the weights PathFL's SSA gave each site, read back from a finished
bench's server reports per round, stratum and seed, and rendered beside the sample-count and 1/K weights; its
refusals (a label the bench did not run, runs with SSA off)."""

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.ablations import ssa_weights
from benchmarks.ablations.render import render_ssa_weights

#: (site, training images)
SITES = (("a", 18), ("b", 14), ("c", 20))


def _bench(root: Path, with_ssa: bool = True) -> Path:
    """A finished 3-site bench: results.json (training counts per site) and two seeds of ``pathfl``, two rounds
    each, two strata whose weights differ by seed, round and stratum."""
    (root / "runs").mkdir(parents=True)
    (root / "results.json").write_text(json.dumps({
        "command": "fedseg bench ...", "date": "2026-11-29T10:00:00", "seeds": [0, 1], "sites": [s for s, _ in SITES],
        "data": {s: {"training": n, "validation": 2, "test": 4} for s, n in SITES}}))
    for seed in (0, 1):
        rounds = []
        for r in range(2):
            shift = 0.01 * (seed + r)
            weights = {"enc0": [1 / 3 + shift, 1 / 3, 1 / 3 - shift], "dec0": [0.3, 0.4 - shift, 0.3 + shift]}
            rounds.append({"metrics": {}, **({"ssa_sites": [s for s, _ in SITES], "ssa_weights": weights}
                                              if with_ssa else {})})
        report = root / f"report-{seed}.json"
        report.write_text(json.dumps({"method": "pathfl", "rounds": rounds}))
        (root / "runs" / f"method-pathfl-seed{seed}.json").write_text(json.dumps(
            {"kind": "method", "label": "pathfl", "seed": seed, "id": f"method-pathfl-seed{seed}",
             "variant_args": {}, "report_path": str(report)}))
    return root


def test_weights_are_read_per_round_stratum_and_seed_and_rendered_beside_the_weightings(tmp_path):
    bench = _bench(tmp_path / "bench")
    ssa_weights.main(["--bench", str(bench), "--labels", "pathfl", "--out", str(tmp_path / "out")])
    out = json.loads((tmp_path / "out" / "ssa_weights.json").read_text())
    assert out["bench"]["command"] == "fedseg bench ..." and sorted(out["runs"]["pathfl"]) == ["0", "1"]
    assert out["runs"]["pathfl"]["1"]["rounds"][1]["dec0"]["c"] == pytest.approx(0.32)

    lines = render_ssa_weights("retina-ssa-weights", {"labels": ["pathfl"], "title": "SSA"}, [out])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines
            if line.startswith("| ") and line.split("|")[1].strip() in dict(SITES)}
    # independent: every seed's, round's and stratum's weight of site c, averaged with NumPy
    c = [1 / 3 - 0.01 * (s + r) for s in (0, 1) for r in (0, 1)] + [0.3 + 0.01 * (s + r) for s in (0, 1) for r in (0, 1)]
    assert rows["c"][:3] == ["20", f"{20 / 52:.3f}", "0.333"]
    assert rows["c"][3] == f"{np.mean(c):.3f} ({min(c):.3f} – {max(c):.3f})"


def test_refusals(tmp_path):
    bench = _bench(tmp_path / "bench", with_ssa=False)
    with pytest.raises(SystemExit, match="no method run labelled 'moon'"):
        ssa_weights.main(["--bench", str(bench), "--labels", "moon", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="SSA off"):
        ssa_weights.main(["--bench", str(bench), "--labels", "pathfl", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="has not finished"):
        ssa_weights.main(["--bench", str(tmp_path / "none"), "--labels", "pathfl", "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o" / "ssa_weights.json").exists()
