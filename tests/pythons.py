"""The Pythons this machine has, for the tests that check the newest one we support (pyenv's versions and PATH)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pythons() -> dict[tuple[int, ...], Path]:
    """Every CPython 3 this machine has (pyenv's versions and python3.X on PATH), by version."""
    found: dict[tuple[int, ...], Path] = {}
    candidates = [*Path.home().glob(".pyenv/versions/3.*/bin/python3"),
                  *(Path(p) / f"python3.{minor}" for p in os.environ.get("PATH", "").split(os.pathsep)
                    for minor in range(10, 20))]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK) and not str(path).startswith(str(REPO / ".venv")):
            out = subprocess.run([str(path), "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True,
                                 text=True, timeout=60)
            if out.returncode == 0:
                found[tuple(int(x) for x in out.stdout.split())] = path
    return found


def newest_python() -> Path | None:
    """The newest CPython 3 this machine has, or None."""
    found = pythons()
    return found[max(found)] if found else None
