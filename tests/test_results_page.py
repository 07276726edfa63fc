"""The results page is a render of the committed run records (no training here).

* every table and figure of ``docs/benchmarks.md`` and the README's "Results at a glance" equals its render from
  ``benchmarks/results/``; a changed number or a table without its record is caught;
* the records stay within their size budget and name no folder of the machine that made them;
* no absolute path of a build machine in the package, the benchmarks, the docs or the README.
"""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def _module(name):
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # page.py and figures.py import reproduce by name: the same copy
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reproduce():
    return _module("reproduce")


@pytest.fixture(scope="module")
def page():
    return _module("page")


@pytest.fixture(scope="module")
def records():
    return _module("records")


#: the results pages: the overview, the README's glance and one page per question under docs/results/
PAGES = [REPO / "docs" / "benchmarks.md", REPO / "README.md", *sorted((REPO / "docs" / "results").glob("*.md"))]


def test_the_page_and_the_readme_equal_their_render_from_the_records(reproduce, page):
    problems = page.check_pages(PAGES, reproduce.DEFAULT_ROOT, reproduce.RUNS, reproduce.TABLES)
    assert problems == [], "\n".join(problems)


def test_every_registered_table_and_figure_renders_from_the_records(reproduce):
    from figures import FIGURES

    on_page = "".join(p.read_text() for p in PAGES)
    for table_id in reproduce.TABLES:
        reproduce.render(table_id)  # raises where a record is missing or stale
        assert f'<a id="{table_id}"></a>' in on_page, f"table {table_id} is registered but on no page"
    for figure_id in FIGURES:
        assert f"figures/{figure_id}.svg" in on_page, f"figure {figure_id} is registered but on no page"


def test_a_changed_number_and_a_table_without_record_are_caught(reproduce, page, tmp_path):
    text = (REPO / "docs" / "benchmarks.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| FedAvg |"))
    changed = row.replace("0.", "0.9", 1)
    bad = tmp_path / "benchmarks.md"
    bad.write_text(text.replace(row, changed, 1) + "\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    for figure in (REPO / "docs" / "figures").glob("*.svg"):  # the figures beside the page
        (tmp_path / "figures").mkdir(exist_ok=True)
        (tmp_path / "figures" / figure.name).write_bytes(figure.read_bytes())
    problems = page.check_page(bad, reproduce.DEFAULT_ROOT, reproduce.RUNS, reproduce.TABLES)
    assert any("differs from its render" in p and changed[:40] in p for p in problems), problems
    assert any("a table without its record" in p for p in problems), problems
    # a figure drawn from other numbers than the records' (its data digest differs)
    svg = next((tmp_path / "figures").glob("*.svg"))
    from figures import read_digest

    digest = read_digest(svg)
    assert digest and len(digest) == 64
    svg.write_text(svg.read_text().replace(digest, "0" * 64))
    assert any(f"figure {svg}" in p and "differs" in p for p in page.check_page(
        bad, reproduce.DEFAULT_ROOT, reproduce.RUNS, reproduce.TABLES))


def test_records_fit_their_budget_and_name_no_machine_folder(records):
    assert records.folder_size_mb() < records.SIZE_BUDGET_MB
    found = {}
    for path in records.RECORDS_ROOT.rglob("*"):
        if path.is_file():
            assert path.suffix == ".json", f"{path}: records are JSON only (no weights, images or logs)"
            paths = sorted(set(records.absolute_paths(json.loads(path.read_text()))))
            if paths:
                found[str(path.relative_to(REPO))] = paths[:3]
    assert found == {}


def test_recording_an_output_writes_its_root_as_a_token_and_refuses_outside_paths(records, tmp_path):
    out_root, dest = tmp_path / "out", tmp_path / "records"
    bench = out_root / "bench"
    (bench / "runs").mkdir(parents=True)
    (bench / "workspaces").mkdir()
    (bench / "results.json").write_text(json.dumps({"command": f"fedseg bench --out {bench}", "url": "https://x.org/a/b"}))
    (bench / "runs" / "a.json").write_text(json.dumps({"workspace": str(bench / "workspaces" / "a"), "n": 1}))
    written = records.record_output(bench / "results.json", out_root, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in written) == ["bench/results.json", "bench/runs/a.json"]
    assert json.loads((dest / "bench" / "results.json").read_text())["command"] == "fedseg bench --out {root}/bench"
    assert json.loads((dest / "bench" / "runs" / "a.json").read_text()) == {"workspace": "{root}/bench/workspaces/a", "n": 1}
    assert not (dest / "bench" / "workspaces").exists()
    # a run the output no longer has leaves the record too
    (dest / "bench" / "runs" / "gone.json").write_text("{}")
    records.record_output(bench / "results.json", out_root, dest)
    assert not (dest / "bench" / "runs" / "gone.json").exists()
    # a path outside the output root would stay in the record: refused, naming it
    (bench / "runs" / "a.json").write_text(json.dumps({"data": "/srv/hospital/images/1.png"}))
    with pytest.raises(ValueError, match="/srv/hospital/images/1.png"):
        records.record_output(bench / "results.json", out_root, dest)
    with pytest.raises(ValueError, match="not under the output root"):
        records.record_output(bench / "results.json", tmp_path / "elsewhere", dest)


#: absolute paths of the machines the suite was built on; a user's machine has none of them
BUILD_MACHINE = re.compile(r"(?<![\w.])(/work/(?:main|shared|bench_out|bench_tree)|/root/|\.\./shared/)")


def test_no_build_machine_path_in_the_product():
    hits = []
    for folder in ("custom", "benchmarks", "docs", "jobs", "bundles"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".md", ".json", ".yaml", ".yml", ".sh", ".txt") and path.is_file():
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if BUILD_MACHINE.search(line):
                        hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    for number, line in enumerate((REPO / "README.md").read_text().splitlines(), 1):
        if BUILD_MACHINE.search(line):
            hits.append(f"README.md:{number}: {line.strip()[:100]}")
    assert hits == [], "\n".join(hits)


def test_a_forest_point_is_the_per_seed_difference_and_the_wilcoxon_test_of_its_records(reproduce):
    """Against numpy / scipy on the run records themselves: FedEvi against FedAvg on built-in polyp."""
    import numpy as np
    from figures import forest_points
    from scipy.stats import wilcoxon

    (point,) = forest_points([("fedevi-protocol-base", "fedevi", "FedEvi")], reproduce.DEFAULT_ROOT, reproduce.RUNS)
    folder = reproduce.DEFAULT_ROOT / "fedevi_protocol" / "base" / "runs"
    runs = {(r["label"], r["seed"]): r for r in (json.loads(p.read_text()) for p in folder.glob("*.json"))}
    sites = sorted(runs[("fedavg", 0)]["final"]["global"])
    diffs, x, y = [], [], []
    for seed in (0, 1, 2):
        a, b = runs[("fedevi", seed)], runs[("fedavg", seed)]
        diffs.append(np.mean([a["final"]["global"][s]["dice"] for s in sites])
                     - np.mean([b["final"]["global"][s]["dice"] for s in sites]))
        for site in sites:
            ours = {i["id"]: i["dice"] for i in a["per_image"]["global"][site]}
            theirs = {i["id"]: i["dice"] for i in b["per_image"]["global"][site]}
            x += [ours[k] for k in sorted(ours)]
            y += [theirs[k] for k in sorted(ours)]
    assert point["mean"] == pytest.approx(np.mean(diffs), abs=1e-12)
    assert point["std"] == pytest.approx(np.std(diffs, ddof=1), abs=1e-12)
    assert point["ahead"] == sum(d > 0 for d in diffs)
    assert point["p"] == pytest.approx(wilcoxon(x, y).pvalue, rel=1e-9)
