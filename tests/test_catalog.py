"""gpu_exporter.catalog is the only place a metric name is written, and it says what the exporter emits.

- The literal-name scan: no string literal in the Python source of exporter/gpu_exporter,
  monitoring/ or bench/ equals or embeds a catalogued name (a family, with or without a
  counter's ``_total``, or a recorded series), except in the catalog itself (catalog.py and
  catalog_records.py). PromQL written in Python counts (``"rate(gpu_busy_seconds_total[5m])"``
  is a literal that embeds one).
  Out of scope: docstrings and other bare string statements (documentation), comments, the
  tests, docs/, and everything that is not Python: the rule templates (prometheus/templates/
  *.in), the generated rules, dashboards and Helm copies (YAML/JSON), status_page.js/html.
  A name assembled at run time from pieces (``f"gpu_memory_{attr}_bytes"``) is not caught.
- No literal holds a name shaped like ours (``gpu_*_seconds`` ...) that the catalog lacks: a typo
  or a family the exporter never emits. Likewise for a recorded series (``level:metric:operation``):
  the catalog holds every series the shipped rules record, the generated ones included, and no other.
- The scans can fail: they are run on planted snippets.
- A real scrape of a simulated exporter (with a training run pushing) has every family in the
  catalog with the same HELP text and type, and docs/metrics.md lists the catalog's type, unit
  and labels.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from gpu_exporter import catalog

ROOT = Path(__file__).resolve().parents[1]
SCANNED = (ROOT / "exporter" / "gpu_exporter", ROOT / "monitoring", ROOT / "bench")
CATALOG_FILES = {ROOT / "exporter" / "gpu_exporter" / name for name in ("catalog.py", "catalog_records.py")}
"""The catalog: the served families and lookups, and the rules' series it re-exports."""


def name_pattern(names: Iterable[str]) -> re.Pattern[str]:
    """A regex that finds any of ``names`` as a whole metric name (not inside a longer one)."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z0-9_:])(?:{alternatives})(?![A-Za-z0-9_])")


def documentation_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are documentation: every bare string statement (docstrings included)."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def literal_names(source: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    """(line, name) for each catalogued name that a non-documentation string literal of ``source`` holds."""
    tree = ast.parse(source)
    docs = documentation_nodes(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found.extend((node.lineno, m.group(0)) for m in pattern.finditer(node.value))
    return sorted(found)


PATTERN = name_pattern(catalog.names())

SNAPSHOT_FIELDS = {"gpu_memory_used_bytes", "gpu_memory_total_bytes"}
"""Fields of a training snapshot's ``context`` (the push protocol's wire format, training/protocol.py)
that share a device family's name. The files that read and write the context may spell them; the
gauges they become are gpu_training_memory_*_bytes."""
SNAPSHOT_FILES = {"exporter/gpu_exporter/training/protocol.py", "exporter/gpu_exporter/training/context.py",
                  "exporter/gpu_exporter/verdict/remedies.py", "bench/fleet_sim.py"}


def test_scan_finds_planted_literals() -> None:
    snippet = '''
"""Module docstring naming gpu_busy_seconds_total is documentation."""
X = "gpu_busy_seconds_total"
Y = f"rate(gpu_busy_seconds_total[{5}m]) > 0"
Z = out.counter("gpu_energy_joules", "help")
W = "avg_over_time(gpu:gpu_utilization:avg5m[1h])"
def f():
    """gpu_info in a docstring is fine."""
    return {"q": "max by (uuid) (gpu_exporter_last_sample_age_seconds)"}
ATTR = 1
"""gpu_power_watts in an attribute docstring is fine."""
# gpu_power_watts in a comment is fine
NOT_A_NAME = ["gpu_process_memory_used_bytes_extra", "xgpu_info", "gpu_busy", "node:gpu_info_x"]
'''
    assert literal_names(snippet, PATTERN) == [
        (3, "gpu_busy_seconds_total"),
        (4, "gpu_busy_seconds_total"),
        (5, "gpu_energy_joules"),
        (6, "gpu:gpu_utilization:avg5m"),
        (9, "gpu_exporter_last_sample_age_seconds"),
    ]


def test_no_metric_name_literal_outside_the_catalog() -> None:
    offenders = []
    for base in SCANNED:
        for path in sorted(base.rglob("*.py")):
            if path in CATALOG_FILES:
                continue
            where = str(path.relative_to(ROOT))
            for line, name in literal_names(path.read_text(), PATTERN):
                if where in SNAPSHOT_FILES and name in SNAPSHOT_FIELDS:
                    continue
                offenders.append(f"{where}:{line}: {name}")
    assert not offenders, ("metric names written as literals; use gpu_exporter.catalog:\n  "
                           + "\n  ".join(offenders))


LOOKS_LIKE_OURS = re.compile(r"(?<![A-Za-z0-9_:./])(?:gpu|process)_[a-z0-9_]+_"
                             r"(?:total|seconds|bytes|ratio|info|watts|celsius|hertz|joules)(?![A-Za-z0-9_])")
"""A literal shaped like one of our metric names (prefix and unit suffix), catalogued or not."""


def uncatalogued(source: str) -> list[tuple[int, str]]:
    """(line, name) of metric-shaped literals that name no catalogued family (a typo, or a family never emitted)."""
    return [(line, name) for line, name in literal_names(source, LOOKS_LIKE_OURS) if name not in catalog.names()]


def test_uncatalogued_scan_finds_planted_names() -> None:
    snippet = 'A = "rate(gpu_busy_second_total[5m])"\nB = "gpu_exporter_poll_interval_seconds"\nC = "gpu_busy"\n'
    assert uncatalogued(snippet) == [(1, "gpu_busy_second_total")]


def test_no_uncatalogued_metric_name() -> None:
    """No literal reads a metric-shaped name the exporter does not emit (gpu_exporter_poll_interval_seconds was one)."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}" for base in SCANNED for path in sorted(base.rglob("*.py"))
                 for line, name in uncatalogued(path.read_text())]
    assert not offenders, "names that are not in gpu_exporter.catalog:\n  " + "\n  ".join(offenders)


def test_catalog_names_are_unique_and_well_formed() -> None:
    names = [f.name for f in catalog.FAMILIES]
    assert len(names) == len(set(names))
    for family in catalog.FAMILIES:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", family.name), family.name
        assert family.name.endswith("_total") == (family.kind == catalog.COUNTER), family.name
        assert catalog.family(family.name) is family and catalog.family(family.base) is family
    for series in catalog.RECORDED:
        assert re.fullmatch(r"[a-z]+:[a-z0-9_]+:[a-z0-9_]+", series.name), series.name
        assert catalog.recorded(series.name) is series
    with pytest.raises(KeyError, match="gpu_nope"):
        catalog.family("gpu_nope")


RECORD = re.compile(r"^\s*- record: (\S+)$", re.MULTILINE)


def test_recorded_series_are_the_shipped_recording_rules() -> None:
    """The template's series are the catalog's hand-written ones; the generated rules record the rest, only those."""
    template = set(RECORD.findall((ROOT / "prometheus" / "templates" / "gpu-recording.rules.yml.in").read_text()))
    shipped = {name for path in sorted((ROOT / "prometheus" / "rules").glob("*.rules.yml"))
               for name in RECORD.findall(path.read_text())}
    assert {s.name for s in catalog.RECORDED if not s.generated} == template
    assert {s.name for s in catalog.RECORDED if s.generated} == shipped - template
    assert len(catalog.RECORDED) >= 29  # 17 hand-written, 12 generated (causes, projections, evidence, remedies)


RECORDED_SHAPE = re.compile(r"(?<![A-Za-z0-9_:])[a-z]+:[a-z0-9_]+:[a-z0-9_]+(?![A-Za-z0-9_])")
"""A literal shaped like a recorded series (``level:metric:operation``), catalogued or not."""


def unrecorded(source: str) -> list[tuple[int, str]]:
    """(line, name) of recorded-series-shaped literals that name no catalogued series (a typo, or a series that no
    catalogued rule records)."""
    return [(line, name) for line, name in literal_names(source, RECORDED_SHAPE) if name not in catalog.names()]


def test_unrecorded_scan_finds_planted_names() -> None:
    snippet = ('A = "run:gpu_training_cause:shares"\nB = f"max({\'x\'}) (process:gpu_process_hint:valu{{hint=1}})"\n'
               'C = "run:gpu_training_cause:share"\nD = "https://example.com:9090/a"\nE = "not:a_name"\n'
               '"""run:gpu_training_typo:share in a docstring is documentation."""\n')
    assert unrecorded(snippet) == [(1, "run:gpu_training_cause:shares"), (2, "process:gpu_process_hint:valu")]


def test_no_uncatalogued_recorded_series() -> None:
    """Every recorded-series name a literal holds is in the catalog (where the literal scan above then forbids it)."""
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name}" for base in SCANNED for path in sorted(base.rglob("*.py"))
                 if path not in CATALOG_FILES for line, name in unrecorded(path.read_text())]
    assert not offenders, "recorded series that are not in gpu_exporter.catalog:\n  " + "\n  ".join(offenders)


DOC_ROW = re.compile(r"^\| ((?:gpu|process)_[a-z0-9_]+) \| (gauge|counter) \| ([^|]*) \|([^|]*)\|")


def test_docs_list_the_catalog() -> None:
    """docs/metrics.md has one row per catalogued family, with its type, unit and labels."""
    rows = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = DOC_ROW.match(line)
        if m:
            labels = tuple(part.strip() for part in m.group(4).split(",") if part.strip())
            rows[m.group(1)] = (m.group(2), m.group(3).strip(), labels)
    assert rows == {f.name: (f.kind, f.unit, f.labels) for f in catalog.FAMILIES}


@pytest.mark.slow
def test_scrape_matches_catalog() -> None:
    """Every family a real exporter serves is catalogued with the same HELP text and type."""
    from test_metrics_doc import scrape_text

    text = scrape_text()
    served: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            _, field, name, rest = line.split(" ", 3)
            served.setdefault(name, {})[field] = rest
    assert len(served) > 60  # the simulated node serves nearly every family
    for name, header in served.items():
        family = catalog.family(name)
        assert (family.name, family.kind, family.help) == (name, header["TYPE"], header["HELP"])
