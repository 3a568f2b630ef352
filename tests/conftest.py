"""Shared pytest setup: import paths for the package, the test helpers (tests/), the repository root (the test bed
testbed/, monitoring/) and scripts/ (release.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT / "exporter", ROOT / "tests", ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
