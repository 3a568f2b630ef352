"""The import graphs of ``monitoring`` and ``gpu_exporter.training`` go one way (issue 27).

Each package's modules are parsed (``ast``, nothing is imported) and every import of a sibling
module, at module level or inside a function, is an edge of its graph. Two checks per package:

- no cycle: a module that imports a sibling never finds itself imported back, directly or not;
- no lazy sibling import: a function-level ``import`` of a module of the same package hides a cycle
  or a load-order dependency. Optional third-party imports inside functions (``torch``, ``pynvml``)
  are fine, as are ``if TYPE_CHECKING:`` imports, which never run (they are edges all the same).

Importing ``pkg.sub`` runs ``pkg/__init__.py`` first; that is not an edge, only naming the package
itself (``from pkg import name`` where ``name`` is no module) is one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    lazy: bool


def modules(package: Path, name: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of the package (``__init__`` is the package's name)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        out[".".join((name, *parts[:-1])) if parts[-1] == "__init__" else ".".join((name, *parts))] = path
    return out


def edges(package: Path, name: str) -> list[Edge]:
    """Every import of a sibling module, with whether it sits in a function."""
    known = modules(package, name)
    found = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        lazy_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                      for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = [alias.name for alias in node.names]
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            for target in targets:
                if target in known and target != module:
                    found.append(Edge(module, target, node.lineno, id(node) in lazy_nodes))
    return found


def cycles(found: list[Edge]) -> list[list[str]]:
    """The import cycles of the graph, each as the modules around it (first module repeated at the end)."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        graph.setdefault(edge.source, set()).add(edge.target)
    out: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycle = path[path.index(nxt):]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    out.append([*cycle, nxt])
            elif len(path) < len(graph) + 1:
                walk(nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return out


PACKAGES = {
    "monitoring": (ROOT / "monitoring", "monitoring"),
    "training": (ROOT / "exporter" / "gpu_exporter" / "training", "gpu_exporter.training"),
}
TRAINING_LAZY = pytest.mark.xfail(
    reason="gpu_exporter.training loads some siblings on first use, and two footprint tests pin why: the package's "
           "__getattr__ (PEP 562) imports run, session (start, watch_distributed) and hooks (watch), because the "
           "exporter's serve path runs training/__init__.py when it imports training.protocol and must not load "
           "training.run or training.pusher (tests/test_footprint.py); auto.py imports context, hooks, session, "
           "lightning and transformers when the job's torch, Lightning or Transformers is imported, because "
           "GPU_EXPORTER_AUTO=1 at interpreter start loads only auto and protocol "
           "(tests/test_training_auto.py::test_the_startup_hook_imports_nothing_unless_the_variable_is_set). "
           "The package has no cycle (test_no_import_cycle); dropping these needs one of those budgets changed "
           "(issue 27)", strict=True)


@pytest.mark.parametrize("package", [pytest.param("monitoring"), pytest.param("training")])
def test_no_import_cycle(package: str) -> None:
    found = cycles(edges(*PACKAGES[package]))
    assert not found, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("package", [pytest.param("monitoring"), pytest.param("training", marks=TRAINING_LAZY)])
def test_no_lazy_sibling_import(package: str) -> None:
    lazy = [e for e in edges(*PACKAGES[package]) if e.lazy]
    assert not lazy, "function-level imports of sibling modules:\n  " + "\n  ".join(
        f"{e.source}:{e.line} imports {e.target}" for e in lazy)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Planted packages: a cycle through a lazy import, a relative one, and a clean one-way graph."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("from pkg.b import X\n")
    (pkg / "b.py").write_text("import os\nX = 1\ndef f():\n    import torch\n    from pkg import a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import b\nfrom . import d\n")
    (pkg / "sub" / "d.py").write_text("from ..sub import c\n")
    found = edges(pkg, "pkg")
    assert {(e.source, e.target, e.lazy) for e in found} == {
        ("pkg", "pkg.a", False), ("pkg.a", "pkg.b", False), ("pkg.b", "pkg.a", True),
        ("pkg.sub.c", "pkg.b", False), ("pkg.sub.c", "pkg.sub.d", False), ("pkg.sub.d", "pkg.sub.c", False)}
    assert sorted(sorted(c[:-1]) for c in cycles(found)) == [["pkg.a", "pkg.b"], ["pkg.sub.c", "pkg.sub.d"]]
    (pkg / "b.py").write_text("X = 1\n")
    (pkg / "sub" / "d.py").write_text("")
    assert cycles(edges(pkg, "pkg")) == []


TRAINING_LAZY_EDGES = {
    ("gpu_exporter.training", "gpu_exporter.training.run"), ("gpu_exporter.training", "gpu_exporter.training.session"),
    ("gpu_exporter.training", "gpu_exporter.training.hooks"),
    ("gpu_exporter.training.auto", "gpu_exporter.training.context"),
    ("gpu_exporter.training.auto", "gpu_exporter.training.hooks"),
    ("gpu_exporter.training.auto", "gpu_exporter.training.session"),
    ("gpu_exporter.training.auto", "gpu_exporter.training.lightning"),
    ("gpu_exporter.training.auto", "gpu_exporter.training.transformers"),
}
"""The lazy sibling imports TRAINING_LAZY names: the package's ``__getattr__`` and auto's patches, none else."""


def test_training_loads_late_only_where_the_footprint_tests_need_it() -> None:
    """Until test_no_lazy_sibling_import[training] passes, no lazy import joins the ones its xfail explains."""
    lazy = {(e.source, e.target) for e in edges(*PACKAGES["training"]) if e.lazy}
    assert lazy <= TRAINING_LAZY_EDGES, f"new function-level sibling imports: {sorted(lazy - TRAINING_LAZY_EDGES)}"
    package_lazy = {e.line for e in edges(*PACKAGES["training"]) if e.lazy and e.source == "gpu_exporter.training"}
    init = (PACKAGES["training"][0] / "__init__.py").read_text().splitlines()
    getattr_line = next(i for i, line in enumerate(init, 1) if line.startswith("def __getattr__("))
    assert all(line > getattr_line for line in package_lazy) and not any(
        line.startswith("def ") for line in init[getattr_line:]), "the package loads late in __getattr__ only"
