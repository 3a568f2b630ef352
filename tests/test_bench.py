"""The quick benchmark runs end to end and writes a complete docs/benchmarks.md into a temp dir.

Figures are checked for presence and form, never for speed (CI machines are shared and noisy);
the only value checked is the exact, in-process accuracy of the busy counter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: real processes

REPO = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?x?$")
RANGE = re.compile(r"^\d+(\.\d+)?-\d+(\.\d+)?$")

# heading -> (data rows, indexes of the columns that must hold a number)
EXPECTED: dict[str, tuple[int, tuple[int, ...]]] = {
    "### Goals": (11, ()),
    "## Machine": (13, ()),
    "## Scrape cost side by side": (6, tuple(range(2, 16))),
    "### Ratios (nvitop-exporter ÷ gpu-exporter; above 1 means gpu-exporter is cheaper)": (3, (1, 2, 3, 4, 5, 6)),
    "## Scrapes right after a poll": (6, (2, 3, 4, 5, 6)),
    "### After a poll: gpu-exporter ÷ nvitop-exporter": (3, (1, 2, 3)),
    "## How cost grows with GPUs and processes": (6, (2, 3, 4)),
    "## Where gpu-exporter's polling time goes": (10, (1, 2)),
    "## Accuracy on a bursty GPU": (6, (2, 3, 4, 5, 6, 7)),
    "## Instrumentation overhead": (6, (2, 4)),
    "### A real training loop": (2, (1, 2, 3, 4, 5)),
    "## Under load": (1, tuple(range(15))),
}


def tables(markdown: str) -> dict[str, list[list[str]]]:
    """Data rows of every markdown table, keyed by the heading above it."""
    found: dict[str, list[list[str]]] = {}
    heading = ""
    for line in markdown.splitlines():
        if line.startswith("#"):
            heading = line.strip()
        elif line.startswith("|") and not re.fullmatch(r"\|(---\|)+", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            found.setdefault(heading, []).append(cells)
    return {h: rows[1:] for h, rows in found.items()}  # drop each header row


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("bench") / "benchmarks.md"
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    result = subprocess.run([sys.executable, "-m", "bench", "--quick", "--output", str(out)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return out.read_text()


def test_document_names_its_command_and_machine(document: str) -> None:
    assert f"python -m bench --quick --output {Path('/')}" in document  # the command, with the temp output
    assert "(quick mode)" in document
    assert "nvitop-exporter | 1.7" in document


def test_every_table_is_there_with_numeric_values(document: str) -> None:
    found = tables(document)
    for heading, (rows, numeric) in EXPECTED.items():
        assert heading in found, f"table under {heading!r} missing; headings: {sorted(found)}"
        assert len(found[heading]) == rows, (heading, found[heading])
        for row in found[heading]:
            assert all(cell and cell.lower() not in ("nan", "inf", "none", "n/a") for cell in row), (heading, row)
            for index in numeric:
                cell = row[index]
                assert NUMBER.match(cell) or RANGE.match(cell), f"{heading}: column {index} of {row} is not a number"


def test_goals_have_a_verdict(document: str) -> None:
    for goal, _, status in tables(document)["### Goals"]:
        assert status in ("met", "**missed**"), (goal, status)


def test_busy_counter_is_within_one_point_of_the_truth(document: str) -> None:
    """Exact and deterministic (hand-driven clock), unlike the timing figures."""
    for row in tables(document)["## Accuracy on a bursty GPU"]:
        if row[1].startswith("busy counter"):
            assert float(row[3]) < 1.0 and float(row[6]) < 1.0, row
        else:
            assert float(row[3]) > 10.0, row  # the instant gauges alias on this pattern
