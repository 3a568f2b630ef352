"""Shared pytest setup: import paths for the package, the test helpers (tests/), the repository root (the test bed
testbed/, monitoring/) and scripts/ (release.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT / "exporter", ROOT / "tests", ROOT, ROOT / "scripts"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

if TYPE_CHECKING:
    from containers import Image


@pytest.fixture(scope="session")
def release_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """scripts/release.py's two wheels (``release.build_wheels``), built once per session for every test that
    installs one; {distribution name: wheel}, e.g. ``gpu_utilization_exporter_training``. Read-only: copy a wheel
    before changing it."""
    import release

    return {path.name.split("-")[0]: path for path in release.build_wheels(tmp_path_factory.mktemp("release-wheels"))}


@pytest.fixture(scope="session")
def container_image() -> Image:
    """The project's image, built with podman once per session (tests/containers.py: the Dockerfile on the Debian
    base, as scripts/release.py builds it) for test_container and test_user_job; skips where podman cannot run."""
    from containers import base_image, build_image, podman_problem

    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    return build_image(base_image())
