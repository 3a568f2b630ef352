"""The training library on its own: the ``gpu-utilization-exporter-training`` wheel of scripts/release.py.

Problem: a training job needs ``gpu_exporter.training`` (standard library only) and nothing of the
exporter's dependencies (prometheus_client, nvidia-ml-py, PyYAML). The release builds a second
wheel from the same source holding just the library. These tests check the wheel's contents and
metadata, then install it with ``pip --no-index`` (so a single declared dependency would fail the
install) into a fresh virtual environment, run an instrumented loop there in isolated mode (no
PYTHONPATH, no working directory on sys.path: only what the wheel installed), and check that a
real exporter process (simulated GPUs) received its phases.
"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import release

from testbed import http_get, run_exporter

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "exporter"
JOB = REPO / "examples" / "user-job" / "train.py"


@pytest.fixture
def wheels(release_wheels: dict[str, Path]) -> dict[str, Path]:
    """The release's wheels (built once per session: conftest.py)."""
    return release_wheels


def test_release_builds_the_library_alone_with_the_package_version_and_no_dependencies(
        wheels: dict[str, Path]) -> None:
    version = release.package_version()
    assert set(wheels) == {"gpu_utilization_exporter", "gpu_utilization_exporter_training"}
    training = wheels["gpu_utilization_exporter_training"]
    assert training.name == f"gpu_utilization_exporter_training-{version}-py3-none-any.whl"
    with zipfile.ZipFile(training) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"gpu_utilization_exporter_training-{version}.dist-info/METADATA").decode()
    package = {n for n in names if not n.startswith("gpu_utilization_exporter_training-")}
    expected = {str(p.relative_to(SOURCE)) for pattern in release.TRAINING_FILES for p in SOURCE.glob(pattern)}
    hook_name, hook_line = release.startup_hook()
    assert package == expected | {hook_name}  # the library's files, every one of them, the startup hook, nothing else
    assert hook_name == "gpu_exporter_training_auto.pth"
    with zipfile.ZipFile(training) as whl:  # at the wheel's root: site-packages, where site runs .pth files
        assert whl.read(hook_name).decode() == hook_line and hook_line.startswith("import os; ")
    package -= {hook_name}
    assert "gpu_exporter/training/__init__.py" in package and "gpu_exporter/cli.py" not in package
    assert "Name: gpu-utilization-exporter-training" in metadata and f"Version: {version}" in metadata
    assert "Requires-Dist" not in metadata
    # the same source: each file byte for byte
    with zipfile.ZipFile(training) as whl:
        for name in sorted(package):
            assert whl.read(name) == (SOURCE / name).read_bytes(), name
    with zipfile.ZipFile(wheels["gpu_utilization_exporter"]) as whl:
        assert "gpu_exporter/training/run.py" in whl.namelist() and "gpu_exporter/cli.py" in whl.namelist()
        assert whl.read(hook_name).decode() == hook_line  # the exporter's wheel installs the same hook


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_pushes_an_instrumented_loop_to_a_real_exporter(
        wheels: dict[str, Path], tmp_path: Path) -> None:
    env_dir = tmp_path / "job-venv"
    venv.create(env_dir, with_pip=True)  # pip from the standard library's bundled wheel: no index
    python = env_dir / "bin" / "python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "--disable-pip-version-check",
                              str(wheels["gpu_utilization_exporter_training"])],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    probe = subprocess.run([str(python), "-I", "-c", "import importlib.util as u, gpu_exporter.training as t; "
                            "print(t.__file__); print([m for m in ('prometheus_client', 'pynvml', 'yaml', 'torch') "
                            "if u.find_spec(m)])"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    location, heavy = probe.stdout.strip().splitlines()
    assert Path(location).is_relative_to(env_dir) and heavy == "[]", probe.stdout
    # The zero-code startup hook (gpu_exporter.training.auto): installed at site-packages' root; unset, a fresh
    # interpreter imports nothing of the library; set, only the hook's module (torch absent: nothing to time).
    assert list(env_dir.glob("lib/python*/site-packages/gpu_exporter_training_auto.pth"))
    loaded = "import sys; print(sorted(m for m in sys.modules if m.startswith('gpu_exporter')))"
    for switch, expected in ((None, "[]"), ("1", "['gpu_exporter', 'gpu_exporter.training', "
                                                "'gpu_exporter.training.auto', 'gpu_exporter.training.protocol']")):
        hook_env = {"PATH": "/usr/bin:/bin", **({"GPU_EXPORTER_AUTO": switch} if switch else {})}
        started = subprocess.run([str(python), "-I", "-c", loaded], env=hook_env, capture_output=True, text=True,
                                 timeout=60, cwd=tmp_path)
        assert started.returncode == 0 and not started.stderr and started.stdout.strip() == expected, (
            switch, started.stdout, started.stderr)

    uuid = "GPU-9ef2e72b-a881-44eb-cb9c-2ef2828e52b8"  # demo-training's GPU that follows a training job
    with run_exporter(["--simulate", "demo-training"]) as url:
        job = subprocess.run([str(python), "-I", str(JOB), "--run", "standalone", "--seconds", "4",
                              "--push-interval", "0.5", "--data-ms", "40", "--compute-ms", "10"],
                             env={"GPU_EXPORTER_URL": url, "CUDA_VISIBLE_DEVICES": uuid, "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert job.returncode == 0, job.stdout + job.stderr
        metrics = http_get(url + "/metrics")  # run.close() pushed the final snapshot before the job exited

    def value(name: str, phase: str = "") -> float:
        labels = rf'(?=[^}}]*run="standalone")(?=[^}}]*uuid="{uuid}")'
        if phase:
            labels += rf'(?=[^}}]*phase="{phase}")'
        found = re.findall(rf"^{name}{{{labels}[^}}]*}} (\S+)$", metrics, flags=re.M)
        assert len(found) == 1, (name, phase, found)
        return float(found[0])

    data, compute = value("gpu_training_phase_seconds_total", "data"), value("gpu_training_phase_seconds_total",
                                                                          "compute")
    steps = value("gpu_training_steps_total")
    assert steps >= 10 and value("gpu_training_samples_total") == 32 * steps
    # each step waits 40 ms for its batch and spins 10 ms: the loop is input-bound
    assert data > 0.5 * (data + compute) and compute >= 0.01 * steps, (data, compute, steps)


def test_the_job_script_needs_only_the_library() -> None:
    """examples/user-job/train.py imports nothing beyond the standard library and gpu_exporter.training."""
    imports = set(re.findall(r"^(?:from|import) ([\w.]+)", JOB.read_text(), flags=re.M))
    foreign = {m for m in imports if m.split(".")[0] not in sys.stdlib_module_names | {"__future__"}}
    assert foreign == {"gpu_exporter"}, foreign
