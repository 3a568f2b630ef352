"""The recipe for a user's own training container beside the exporter container (examples/user-job/).

Problem: users run their own training image, not ours. The recipe gives them a Dockerfile that adds
only the standalone library wheel (``gpu-utilization-exporter-training``, built by
scripts/release.py) to their image, and a compose file that puts the job and the exporter on one
user-defined network with ``GPU_EXPORTER_URL=http://exporter:9445`` and the GPU's UUID.

This test follows the recipe with podman (no Docker engine here):

- the wheels come from ``release.build_wheels``; the job image is examples/user-job/Dockerfile,
  unchanged, built with no network at all (so the install needs no package index), on a stand-in
  for ``python:3.12-slim`` (no registry here: the Debian base plus a virtual environment that has
  pip), and it adds well under a megabyte to that base;
- the two services of examples/user-job/compose.yaml run on a new podman network (netavark, names
  from aardvark-dns), with the compose file's environment, hardening and network alias; the GPU
  parts are replaced by simulated GPUs (``--simulate demo-training``; no device reservations, no
  host PID namespace, no published port) and GPU_UUID is the simulated GPU that follows training;
- the job's pushes reach the exporter by its service name, and ``gpu-exporter diagnose`` in the
  exporter container names the job's GPU input-bound with the job's run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import release
import yaml
from compose_spec import PyCompose
from containers import Image, compose_run_options, container, podman, wait_healthy
from gpu_exporter.simulate.scenario import load_scenario

from testbed import wait_until

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "user-job"
PYTHON_STAND_IN = "localhost/gpu-exporter-test-python-pip:bookworm"



def test_recipe_dockerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(RECIPE / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_recipe_compose_file_is_valid_and_asks_for_the_gpu(tmp_path: Path) -> None:
    text = (RECIPE / "compose.yaml").read_text()
    PyCompose.from_yaml(text).validate()
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed: bash tests/run.sh installs Debian's docker-compose"
    no_env_file = tmp_path / "empty.env"  # not a developer's examples/user-job/.env
    no_env_file.write_text("")
    command = [binary, "--env-file", str(no_env_file), "-f", "compose.yaml", "config", "--quiet"]
    env = {k: v for k, v in os.environ.items() if k != "GPU_UUID"}
    missing = subprocess.run(command, cwd=RECIPE, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "set GPU_UUID" in missing.stderr, missing.stderr
    given = subprocess.run(command, cwd=RECIPE, env={**env, "GPU_UUID": "GPU-1"}, capture_output=True, text=True,
                           timeout=120)
    assert given.returncode == 0, given.stderr


def recipe_services(gpu_uuid: str) -> dict[str, Any]:
    """examples/user-job/compose.yaml's services with ${GPU_UUID...} set to ``gpu_uuid``."""
    text = re.sub(r"\$\{GPU_UUID(:\?[^}]*)?\}", gpu_uuid, (RECIPE / "compose.yaml").read_text())
    services: dict[str, Any] = yaml.safe_load(text)["services"]
    return services


def build(context: Path, tag: str, *options: str) -> None:
    """podman build with no network for its RUN steps (OCI isolation: chroot cannot cut the network)."""
    podman("build", "--isolation=oci", "--network=none", *release.run_limits(), "--tag", tag, *options, str(context),
           timeout=600)


def image_size(tag: str) -> int:
    return int(json.loads(podman("image", "inspect", tag).stdout)[0]["Size"])


@contextlib.contextmanager
def network() -> Iterator[str]:
    name = f"gpu-exporter-test-net-{uuid.uuid4().hex[:8]}"
    podman("network", "create", name)
    try:
        yield name
    finally:
        podman("network", "rm", "--force", name, check=False)


@pytest.mark.slow
@pytest.mark.container
def test_user_job_container_pushes_to_the_exporter_container_on_a_network(
        tmp_path: Path, release_wheels: dict[str, Path], container_image: Image) -> None:
    exporter_image = container_image  # built once per session (conftest.py); skips where podman cannot run
    base = exporter_image.base
    (followed,) = [gpu.uuid for gpu in load_scenario("demo-training").gpus if gpu.follow_training]
    services = recipe_services(followed)
    assert set(services) == {"exporter", "training"}
    exporter_service, job_service = services["exporter"], services["training"]
    assert exporter_service["image"] == f"{release.IMAGE_NAME}:{release.package_version()}"
    assert job_service["environment"]["GPU_EXPORTER_URL"] == "http://exporter:9445"
    assert job_service["environment"]["CUDA_VISIBLE_DEVICES"] == followed
    assert job_service["depends_on"] == {"exporter": {"condition": "service_healthy"}}

    # the job image, as the recipe builds it: the Dockerfile and the script, plus the release's wheel
    context = tmp_path / "context"
    shutil.copytree(RECIPE, context, ignore=shutil.ignore_patterns("*.whl", "compose.yaml", ".gitignore"))
    shutil.copy(release_wheels["gpu_utilization_exporter_training"], context)  # built once per session
    stand_in = tmp_path / "python-stand-in"
    stand_in.mkdir()
    (stand_in / "Containerfile").write_text(f"FROM {base}\nRUN python -m venv /opt/python\n"
                                            "ENV PATH=/opt/python/bin:$PATH\n")
    build(stand_in, PYTHON_STAND_IN)
    job_image = f"localhost/gpu-exporter-test-user-job:{uuid.uuid4().hex[:8]}"
    try:
        build(context, job_image, "--build-arg", f"BASE_IMAGE={PYTHON_STAND_IN}")
        added = image_size(job_image) - image_size(PYTHON_STAND_IN)
        print(f"\n{job_image}: the recipe adds {added / 1e3:.0f} kB to its base")
        assert added < 1e6, f"the job image adds {added / 1e6:.1f} MB: more than the library"
        only_library = podman("run", "--rm", "--network", "none", *release.run_limits(), "--entrypoint", "python",
                              job_image, "-c", "import importlib.util as u, gpu_exporter.training as t; "
                              "print(t.__file__); print([m for m in ('prometheus_client', 'pynvml', 'yaml') "
                              "if u.find_spec(m)])")
        location, heavy = only_library.stdout.strip().splitlines()
        assert location.startswith("/opt/python/lib/") and heavy == "[]", only_library.stdout

        with network() as net:
            run_recipe(exporter_image.tag, exporter_service, job_image, job_service, net)
    finally:
        podman("rmi", "--force", job_image, check=False)


def run_recipe(exporter_image: str, exporter_service: dict[str, Any], job_image: str,
                 job_service: dict[str, Any], net: str) -> None:
    """Both services on ``net``; the exporter answers as ``exporter`` (the compose service name)."""
    window = 8
    exporter_options = [*compose_run_options(exporter_service, REPO), "--network-alias", "exporter",
                        # podman runs HEALTHCHECKs from systemd timers; without systemd the test runs it
                        "--health-interval", "disable"]
    with container(exporter_image, ["--simulate", "demo-training", "--poll-interval", "0.5"], exporter_options,
                   prefix="gpu-exporter-test-exporter", network=net) as exporter:
        wait_healthy(exporter, 120)  # compose: depends_on condition service_healthy
        job_args = [*job_service["command"], "--seconds", "300", "--push-interval", "0.5"]
        with container(job_image, job_args, compose_run_options(job_service, REPO),
                       prefix="gpu-exporter-test-user-job", network=net) as job:
            uuid_label = job_service["environment"]["CUDA_VISIBLE_DEVICES"]

            def trained_seconds() -> float:
                if not job.running():
                    raise RuntimeError(f"job container exited: {job.logs()}")
                result = exporter.exec("python", "-c", "import urllib.request; print(urllib.request.urlopen("
                                       "'http://127.0.0.1:9445/metrics', timeout=10).read().decode())")
                return sum(float(v) for v in re.findall(
                    rf'gpu_training_phase_seconds_total{{phase="(?:data|compute)",[^}}]*'
                    rf'uuid="{uuid_label}"}} (\S+)', result.stdout))

            # the job's own clock: enough reported time to fill the diagnosis window
            wait_until(lambda: trained_seconds() > window, 180, interval=1, what="the job's phase metrics")
            result = exporter.exec("gpu-exporter", "diagnose", "--url", "http://127.0.0.1:9445",
                                   "--window", str(window), "--output", "json")
            assert job.running(), job.logs()
    assert result.returncode == 1, result.stdout + result.stderr  # 1: a GPU is below the target
    gpu = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}[uuid_label]
    assert gpu["verdict"]["verdict"] == "input_bound", gpu
    (run,) = gpu["runs"]
    assert run["run"] == "user-job" and run["shares"]["data"] > 0.5, run
