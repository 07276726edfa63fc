"""No import cycles between fedseg's modules: every ``import`` / ``from ... import`` anywhere in a module (top level,
inside functions, under ``TYPE_CHECKING``; absolute or relative) is an edge, and the graph has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "custom" / "fedseg"


def module_names(package: Path) -> Dict[str, Path]:
    """``{"fedseg.fl.report": path, "fedseg.fl": path/__init__.py, ...}`` for every module under ``package``."""
    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph(package: Path) -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports (``from a.b import c`` names ``a.b.c`` where that is a module)."""
    modules = module_names(package)
    graph: Dict[str, Set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here[: len(here) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                # a module importing its own package's __init__ (or itself) is not a cycle between modules
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_detector_finds_every_kind_of_import_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")  # the package's own init: not a cycle
    (pkg / "sub" / "a.py").write_text("def f():\n    from pkg.sub import b\n")  # function-level
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    (pkg / "c.py").write_text("from .sub import d\n")  # relative, names a module
    (pkg / "sub" / "d.py").write_text("import pkg.c\n")
    (pkg / "e.py").write_text("from pkg.sub.a import f\n")  # one way only: no cycle
    assert cycles(import_graph(pkg)) == [["pkg.c", "pkg.sub.d"], ["pkg.sub.a", "pkg.sub.b"]]


def test_fedseg_has_no_import_cycles():
    assert cycles(import_graph(PACKAGE)) == []


def test_every_script_of_the_repository_compiles_on_this_python():
    """Scripts no test imports (the GPU check runs only on a GPU machine) must still parse on the supported Python: an
    f-string nesting its own quotes is valid from Python 3.12 only, and a GPU session would find it too late."""
    repo = PACKAGE.parents[1]
    scripts = [p for folder in ("benchmarks", "jobs", "custom", "tests") for p in (repo / folder).rglob("*.py")]
    assert scripts
    for path in scripts:
        compile(path.read_text(), str(path), "exec")  # raises SyntaxError naming the file and line
