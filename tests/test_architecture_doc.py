"""docs/architecture.md names only what exists: every file, folder and module path, every dotted name
(``verdict.ladder.judge``, ``catalog.GPU_BUSY_SECONDS_TOTAL.name``), every recorded series.

- The package tree (the code block under "## Packages"): each entry is resolved in the folder of the
  entry it is indented under, and so is each file name its description gives (``thresholds.py``).
- Everywhere else (tables, prose, the data-flow block): a path (``commands/report.py``,
  ``prometheus/templates/*.rules.yml.in``) exists under the repository, the package or one of its
  folders; a file name (``status_page.js``) likewise; a dotted name that starts with a module
  imports and has each attribute; ``Class.attr`` names a class of the verdict, catalog or
  thresholds modules with that attribute or field; a recorded series name (``run:gpu_*:*``) is
  catalogued.
- The checks can fail: they run on a planted page.
- The same for the Python source's docstrings and comments (exporter/gpu_exporter, monitoring/): a path
  into this repository they give (``monitoring/remedies.py``, ``tests/test_evidence.py``) exists.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from gpu_exporter import catalog

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "exporter" / "gpu_exporter"
BASES = (ROOT, ROOT / "exporter", PACKAGE, PACKAGE / "verdict", PACKAGE / "commands", ROOT / "monitoring",
         ROOT / "docs", ROOT / "tests")
"""Where a path or file name outside the package tree may be rooted."""
MODULE_ROOTS = {"gpu_exporter": "gpu_exporter", "monitoring": "monitoring", "verdict": "gpu_exporter.verdict",
                "commands": "gpu_exporter.commands", "catalog": "gpu_exporter.catalog",
                "thresholds": "gpu_exporter.thresholds", "training": "gpu_exporter.training",
                "collectors": "gpu_exporter.collectors", "simulate": "gpu_exporter.simulate"}
"""The first part of a dotted name -> the module it stands for."""
CLASS_MODULES = ("gpu_exporter.catalog", "gpu_exporter.thresholds", "gpu_exporter.verdict.causes",
                 "gpu_exporter.verdict.kinds", "gpu_exporter.verdict.signals", "gpu_exporter.verdict.hints",
                 "gpu_exporter.verdict.ladder", "gpu_exporter.verdict.views", "gpu_exporter.verdict.levels",
                 "gpu_exporter.verdict.samples")

PATH = re.compile(r"(?<![\w/.\\-])[A-Za-z][\w.*-]*(?:/[\w.*-]+)*/(?:[\w.*-]+)?")
FILE = re.compile(r"(?<![\w/.\\-])[A-Za-z][\w-]*(?:\.[\w-]+)*\.(?:py|yml|yaml|js|html|md|in|json)(?![\w/])")
DOTTED = re.compile(r"(?<![\w./])([a-z_]+(?:\.[A-Za-z_]\w*)+)(?![\w/(])")
CLASS_ATTR = re.compile(r"(?<![\w./])([A-Z]\w*)\.([a-z_]\w*)(?![\w.(])")
RECORDED = re.compile(r"(?<![\w:])[a-z]+:gpu_[a-z0-9_]+:(?:[a-z0-9_]+|\*)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
ENTRY = re.compile(r"^( *)((?:[\w./-]+)(?:, [\w./-]+)*)(?:  +(.*))?$")
"""A package-tree line: indentation, the entries (``a.py, b.py`` or ``folder/``), two spaces, the description."""


def _exists(relative: str, bases: tuple[Path, ...]) -> bool:
    relative = relative.rstrip("/")
    for base in bases:
        if "*" in relative:
            if any(base.glob(relative)):
                return True
        elif (base / relative).exists() or (base / f"{relative}.py").exists():
            return True
    return False


def tree_problems(block: str, root: Path) -> list[str]:
    """Entries of a package tree (and the file names their descriptions give) that do not exist under ``root``."""
    problems: list[str] = []
    stack: list[tuple[int, Path]] = [(-1, root)]
    for line in block.splitlines():
        m = ENTRY.match(line)
        if not line.strip() or m is None or (m.group(3) is None and not m.group(2).endswith("/")):
            continue  # a description's continuation
        indent = len(m.group(1))
        while stack[-1][0] >= indent:
            stack.pop()
        folder = stack[-1][1]
        for name in m.group(2).split(", "):
            if not (folder / name.rstrip("/")).exists():
                problems.append(f"{folder.relative_to(root) / name}")
            elif name.endswith("/"):
                stack.append((indent, folder / name.rstrip("/")))
        for name in FILE.findall(m.group(3) or ""):
            if not (folder / name).exists():
                problems.append(f"{folder.relative_to(root) / name} (in the description of {m.group(2)})")
    return problems


def _module_attr(dotted: str) -> bool:
    first, *rest = dotted.split(".")
    parts = MODULE_ROOTS[first].split(".") + rest
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _class_attr(cls_name: str, attr: str) -> bool:
    for name in CLASS_MODULES:
        module: ModuleType = importlib.import_module(name)
        cls = getattr(module, cls_name, None)
        if isinstance(cls, type):
            fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
            return hasattr(cls, attr) or attr in fields
    return False


def text_problems(text: str, bases: tuple[Path, ...]) -> list[str]:
    """Paths, file names, dotted names, Class.attr and recorded series of ``text`` that do not exist."""
    paths = [p.rstrip(".") for p in PATH.findall(text)]  # not a sentence's full stop
    problems = [f"path {p}" for p in paths if not _exists(p, bases)]
    problems += [f"file {f}" for f in FILE.findall(text) if "/" not in f and not _exists(f, bases)]
    problems += [f"name {d}" for d in DOTTED.findall(text) if d.split(".")[0] in MODULE_ROOTS and not _module_attr(d)]
    problems += [f"name {c}.{a}" for c, a in CLASS_ATTR.findall(text) if not _class_attr(c, a)]
    names = catalog.names()
    problems += [f"series {r}" for r in RECORDED.findall(text)
                 if not (r in names or (r.endswith("*") and any(n.startswith(r[:-1]) for n in names)))]
    return problems


def doc_problems(doc: str, root: Path, bases: tuple[Path, ...]) -> list[str]:
    packages = doc.split("## Packages", 1)[1]
    tree = FENCE.search(packages)
    assert tree is not None, "docs/architecture.md has no package tree under ## Packages"
    rest = doc.replace(tree.group(0), "")
    return tree_problems(tree.group(0).strip("`\n"), root) + text_problems(rest, bases)


def test_architecture_doc_names_only_what_exists() -> None:
    problems = doc_problems(DOC.read_text(), ROOT, BASES)
    assert not problems, "docs/architecture.md names what does not exist:\n  " + "\n  ".join(problems)


def test_the_checks_find_planted_mistakes() -> None:
    page = """# Architecture
| x | `exporter/gpu_exporter/catalog.py`, `exporter/gpu_exporter/nope.py`, `prometheus/templates/*.nope` |
| y | `verdict.ladder.judge`, `verdict.ladder.misjudge`, `catalog.GPU_NOPE.name`, `Row.anchor`, `Row.nope` |
| z | `run:gpu_training_cause:share`, `run:gpu_training_cause:shares`, `run:gpu_training_remedy:*` |

## Packages

```
exporter/gpu_exporter/
  catalog.py        every name;  thresholds.py and nothing.py
  verdict/          the domain
    ladder.py         the ladder
    poller.py         renamed away
  commands/         the CLI
                    a description's continuation, report (not an entry)
monitoring/         the generators
  rules.py, nope.py   two
```

status_page.js draws it; nope_page.js does not exist; commands/diagnose_render and commands/render_it.
"""
    assert doc_problems(page, ROOT, BASES) == [
        "exporter/gpu_exporter/nothing.py (in the description of catalog.py)",
        "exporter/gpu_exporter/verdict/poller.py",
        "monitoring/nope.py",
        "path exporter/gpu_exporter/nope.py",
        "path prometheus/templates/*.nope",
        "path commands/render_it",
        "file nope_page.js",
        "name verdict.ladder.misjudge",
        "name catalog.GPU_NOPE.name",
        "name Row.nope",
        "series run:gpu_training_cause:shares",
    ]


REPO_PATH = re.compile(r"(?<![\w/.\\-])((?:exporter|monitoring|prometheus|grafana|helm|docs|tests|bench|scripts|"
                       r"examples|gpu_exporter|collectors|verdict|commands|training|simulate)/[\w./*-]*[\w*])")
"""A path into this repository, as docstrings and comments write it (from the top or from the package)."""


def source_path_problems(source: str) -> list[str]:
    """(line: path) of each repository path in ``source`` that does not exist."""
    return [f"{line}: {m.group(1)}" for line, text in enumerate(source.splitlines(), 1)
            for m in REPO_PATH.finditer(text) if not _exists(m.group(1), (ROOT, ROOT / "exporter", PACKAGE))]


def test_source_comments_name_only_existing_files() -> None:
    """prometheus/tests/remedies.test.yml and tests/test_evidence_rules.py were named and never existed."""
    planted = ('"""See prometheus/tests/remedies.test.yml and monitoring/rules.py."""\n'
               "# tests/test_nope.py, torch/x.py\n")
    assert source_path_problems(planted) == ["1: prometheus/tests/remedies.test.yml", "2: tests/test_nope.py"]
    problems = [f"{path.relative_to(ROOT)}:{problem}" for base in (PACKAGE, ROOT / "monitoring")
                for path in sorted(base.rglob("*.py")) for problem in source_path_problems(path.read_text())]
    assert not problems, "comments and docstrings name files that do not exist:\n  " + "\n  ".join(problems)
