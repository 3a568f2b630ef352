"""Build the project's image with podman and run containers from it, for tests/test_container.py.

No Docker engine and no image registry are reachable here, so the image is built with podman on a
Debian bookworm base that ``scripts/container-base.sh`` makes with debootstrap (once per machine:
the base stays in podman's store and is reused). The build command itself comes from
``scripts/release.py`` (one definition for the release and the tests).

Every container runs with ``--network host`` and binds 127.0.0.1 on a free port, so tests running
side by side do not collide and no traffic leaves the loopback interface.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import release  # scripts/release.py (on sys.path through conftest.py): the podman build command

REPO = Path(__file__).resolve().parents[1]

IMAGE_TAG = f"localhost/{release.IMAGE_NAME}:{release.package_version()}"


def podman_problem() -> str | None:
    """Why podman cannot run at all here (then the container tests skip), or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (bash tests/run.sh installs it with apt)"
    info = subprocess.run(release.podman_command("info", "--format", "{{.Host.OCIRuntime.Name}}"),
                          capture_output=True, text=True, timeout=120)
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()[-300:]}"
    return None


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``podman <args>`` (with the global options of release.podman_command) and capture its output."""
    result = subprocess.run(release.podman_command(*args), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ... exited {result.returncode}: "
                           f"{(result.stdout + result.stderr)[-3000:]}")
    return result


def base_image() -> str:
    """The Debian base image (made by scripts/container-base.sh unless already in podman's store)."""
    result = subprocess.run(["bash", str(REPO / "scripts" / "container-base.sh")], capture_output=True,
                            text=True, timeout=1200)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/container-base.sh failed: {result.stderr[-3000:]}")
    return result.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Image:
    """The built image: its tag, the base it was built on, and how long the build took."""

    tag: str
    base: str
    build_seconds: float

    def inspect(self) -> dict[str, Any]:
        data: list[dict[str, Any]] = json.loads(podman("image", "inspect", self.tag).stdout)
        return data[0]


def build_image(base: str, tag: str = IMAGE_TAG) -> Image:
    """Build the Dockerfile on ``base`` exactly as scripts/release.py does (layers cached by podman)."""
    started = time.monotonic()
    command = release.build_command(tag, release.package_version(), base)
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"podman build failed: {(result.stdout + result.stderr)[-4000:]}")
    return Image(tag, base, time.monotonic() - started)


@dataclass(frozen=True)
class Container:
    """A running container (removed when its context manager exits)."""

    name: str

    def inspect(self) -> dict[str, Any]:
        data: list[dict[str, Any]] = json.loads(podman("container", "inspect", self.name).stdout)
        return data[0]

    def exec(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *argv, timeout=timeout, check=False)

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return (result.stdout + result.stderr)[-4000:]

    def running(self) -> bool:
        return bool(self.inspect()["State"]["Running"])


@contextlib.contextmanager
def container(image: str, args: Sequence[str] = (), options: Sequence[str] = (),
              prefix: str = "gpu-exporter-test") -> Iterator[Container]:
    """``podman run -d --network host <options> <image> <args>``; the container is removed afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    podman("run", "--detach", "--name", name, "--network", "host", *release.run_limits(), *options, image, *args)
    try:
        yield Container(name)
    finally:
        podman("rm", "--force", "--time", "2", name, check=False)
