"""bench.floor and bench.evidence run end to end, small, and print complete tables (form only, never speed:
the machines that run tests are shared)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real exporters, a bare server and sleeping processes

REPO = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"^\d+(\.\d+)?(e[+-]?\d+)?x?$")


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def _rows(stdout: str) -> list[list[str]]:
    lines = [line for line in stdout.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]]


def test_floor_scrapes_gpu_exporter_and_a_bare_server_side_by_side() -> None:
    result = _bench("bench.floor", "--scenarios", "default,faults", "--scrapes", "3")
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: the goal missed on this machine
    rows = _rows(result.stdout)
    assert [r[0] for r in rows] == ["default", "faults"]
    assert all(NUMBER.match(cell) for r in rows for cell in r[1:]), rows
    assert "Goal: gpu-exporter's p50 within 1.2x of the bare server's" in result.stdout


def test_evidence_bench_measures_the_collector_on_real_processes() -> None:
    # the shortest stages that still give every column (the figures are checked for form only): 1 s each
    result = _bench("bench.evidence", "--nodes", "2x8", "--settle", "1", "--idle", "1", "--scrapes", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(result.stdout)
    assert len(rows) == 3 and {r[1] for r in rows} >= {"evidence off", "every process at every poll"}
    on = [r for r in rows if r[1] != "evidence off"]
    assert all(NUMBER.match(cell) for r in on for cell in r[2:]), rows
    assert all(int(r[-1]) > int(rows[[r[1] for r in rows].index("evidence off")][-1]) for r in on)  # its series
