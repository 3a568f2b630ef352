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
              prefix: str = "gpu-exporter-test", network: str = "host") -> Iterator[Container]:
    """``podman run -d --network <network> <options> <image> <args>``; the container is removed afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    try:
        podman("run", "--detach", "--name", name, "--network", network, *release.run_limits(), *options, image,
               *args)
        yield Container(name)
    finally:  # also when the runtime refused to start it: podman has created it by then
        podman("rm", "--force", "--time", "2", name, check=False)


# Images of docker-compose.yml that no registry here can give, stood in for by the Debian base with
# Debian's build of the same program mounted where the image keeps it (the versions compose pins are
# Debian's: tests/test_docker_compose.py checks that), plus the data files Debian's build reads from
# /usr/share (upstream embeds them). Their healthchecks call wget, which the official images have
# from busybox: Debian's static busybox is mounted as wget.
STAND_INS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "prom/prometheus": ("/usr/bin/prometheus", "/bin/prometheus", ()),
    "prom/alertmanager": ("/usr/bin/prometheus-alertmanager", "/bin/alertmanager",
                          ("/usr/share/prometheus/alertmanager",)),
}


def stand_in_options(repository: str) -> list[str]:
    """Mounts and entrypoint that make the Debian base stand in for ``repository``'s image."""
    binary, entrypoint, data = STAND_INS[repository]
    options = ["--volume", f"{binary}:{entrypoint}:ro", "--volume", "/bin/busybox:/usr/local/bin/wget:ro",
               "--entrypoint", entrypoint]
    for path in data:
        options += ["--volume", f"{path}:{path}:ro"]
    return options


def compose_order(services: dict[str, Any]) -> list[str]:
    """Service names with every service after the ones it depends on."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise ValueError(f"depends_on cycle: {' -> '.join((*path, name))}")
        if name not in order:
            for dependency in services[name].get("depends_on", {}):
                visit(dependency, (*path, name))
            order.append(name)

    for name in services:
        visit(name, ())
    return order


def compose_run_options(service: dict[str, Any], repo: Path) -> list[str]:
    """``podman run`` options for a compose service's environment, mounts, hardening and healthcheck.

    Bind mounts resolve against ``repo``; named volumes become tmpfs (nothing outlives the test).
    Healthchecks are registered without a timer (no systemd here): the caller runs them.
    """
    options: list[str] = []
    for key, value in service.get("environment", {}).items():
        options += ["--env", f"{key}={value}"]
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        if source.startswith((".", "/")):
            options += ["--volume", ":".join([str((repo / source).resolve()), target, *mode])]
        else:
            options += ["--tmpfs", target]
    for path in service.get("tmpfs", []):
        options += ["--tmpfs", path]
    if service.get("read_only"):
        options.append("--read-only")
    for capability in service.get("cap_drop", []):
        options += ["--cap-drop", capability]
    for option in service.get("security_opt", []):
        options += ["--security-opt", option.removesuffix(":true")]
    check = service.get("healthcheck")
    if check:
        kind, *command = check["test"]
        # podman 4.3 reads a JSON array without the CMD keyword as CMD (with it, it splits on blanks)
        health_cmd = json.dumps(command) if kind == "CMD" else command[0]
        options += ["--health-cmd", health_cmd, "--health-interval", "disable",
                    "--health-timeout", check["timeout"], "--health-retries", str(check["retries"]),
                    "--health-start-period", check["start_period"]]
    return options


def wait_healthy(box: Container, timeout: float) -> None:
    """Run the container's healthcheck every second until it passes (what ``condition: service_healthy``
    waits for); fail with the container's log after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not box.running():
            raise AssertionError(f"{box.name} exited: {box.logs()}")
        result = podman("healthcheck", "run", box.name, check=False, timeout=60)
        if result.returncode == 0:
            return
        last = (result.stdout + result.stderr).strip()
        time.sleep(1)
    raise AssertionError(f"{box.name} not healthy after {timeout:.0f} s ({last}): {box.logs()}")
