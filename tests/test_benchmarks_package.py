"""``benchmarks/`` is a package: every module imports, imports go one way (no cycle, the core imports no page), every
import of a benchmark module names it by its package path, and each page's registry declares its page."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from test_imports import cycles, import_graph, module_names

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def registry():
    """The gathered registry, imported as the command does (``reproduce.py`` puts this ``benchmarks`` on the path)."""
    spec = importlib.util.spec_from_file_location("reproduce_for_package_test", BENCHMARKS / "reproduce.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return importlib.import_module("benchmarks.registry")


def test_every_module_of_the_package_imports(registry):
    names = sorted(module_names(BENCHMARKS))
    assert "benchmarks.core.render" in names and "benchmarks.gpu.gpu_check" in names
    for name in names:
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve().is_relative_to(BENCHMARKS), f"{name} is not this repository's"


def test_no_import_cycle_and_the_core_imports_no_page():
    graph = import_graph(BENCHMARKS)
    assert cycles(graph) == []
    outward = {m: sorted(t for t in targets if not t.startswith("benchmarks.core"))
               for m, targets in graph.items() if m.startswith("benchmarks.core")}
    assert {m: t for m, t in outward.items() if t} == {}


def test_benchmark_modules_are_imported_by_their_package_path():
    """``import reproduce`` / ``from cost_table import ...`` (a sibling on ``sys.path``) would load a second copy of a
    module, and hide an edge from the cycle check."""
    stems = {path.stem for path in BENCHMARKS.rglob("*.py")} - {"__init__"}
    bare = []
    for path in BENCHMARKS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bare += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in stems]
    assert bare == []


def test_the_detector_sees_a_cycle_through_the_package(tmp_path):
    """The graph is built from ``benchmarks.*`` names: a page registry and the core importing each other is caught."""
    pkg = tmp_path / "benchmarks"
    (pkg / "core").mkdir(parents=True)
    (pkg / "gpu").mkdir()
    for init in (pkg, pkg / "core", pkg / "gpu"):
        (init / "__init__.py").write_text("")
    (pkg / "core" / "render.py").write_text("def f():\n    from benchmarks.gpu.registry import TABLES\n")
    (pkg / "gpu" / "registry.py").write_text("from benchmarks.core.render import f\n")
    assert cycles(import_graph(pkg)) == [["benchmarks.core.render", "benchmarks.gpu.registry"]]


def test_every_page_registry_is_gathered_and_names_its_page(registry):
    folders = sorted(p.parent.name for p in BENCHMARKS.glob("*/registry.py") if p.parent.name != "core")
    assert sorted(m.__name__.split(".")[1] for m in registry.PAGES) == folders
    for module in registry.PAGES:
        assert module.PAGE.endswith(".md") and (REPO / module.PAGE).is_file(), module.__name__
        for table_id, table in module.TABLES.items():
            assert table["page"] == table.get("page", module.PAGE) and (REPO / table["page"]).is_file(), table_id


def test_two_pages_declaring_one_table_are_refused(registry):
    import types

    a = types.SimpleNamespace(__name__="a", PAGE="x.md", RUNS={}, TABLES={"t": {"render": "cost", "title": "T"}})
    b = types.SimpleNamespace(__name__="b", PAGE="y.md", RUNS={}, TABLES={"t": {"render": "cost", "title": "T"}})
    with pytest.raises(ValueError, match=r"b: table id\(s\) \['t'\] declared by another page"):
        registry.gather([a, b])


def test_reproduce_imports_this_package_and_leaves_another_alone(tmp_path):
    """Another distribution's top-level ``benchmarks`` (opacus installs one): ``reproduce.py`` puts this repository
    first on the path, so a fresh process imports this folder; where the other was imported first, it is named and
    left in place (nothing removed from ``sys.modules`` under the code that imported it)."""
    other = tmp_path / "benchmarks"
    other.mkdir()
    (other / "__init__.py").write_text("")
    load = (f"import importlib.util, sys\nspec = importlib.util.spec_from_file_location('r', {str(BENCHMARKS / 'reproduce.py')!r})\n"
            "try:\n    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "except ImportError as e:\n    print('refused:', e)\nprint(sys.modules['benchmarks'].__file__)\n")
    # the other package first on the path (the working folder), as an installed one would be without reproduce.py
    fresh = subprocess.run([sys.executable, "-c", load], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == str(BENCHMARKS / "__init__.py")
    first = subprocess.run([sys.executable, "-c", "import benchmarks\n" + load], cwd=tmp_path, capture_output=True,
                           text=True, check=True)
    refused, kept = first.stdout.strip().splitlines()
    assert refused.startswith("refused: the package 'benchmarks' of this process is") and str(other) in refused
    assert kept == str(other / "__init__.py")
