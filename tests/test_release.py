"""scripts/release.py: the image tar and the chart package carry one version, or nothing is built."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import helm_python as helm
import pytest
import release
import yaml
from containers import base_image, podman_problem

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "release.py"


def test_a_chart_with_another_app_version_stops_the_release(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(release.CHART, chart, symlinks=True)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["appVersion"] = "9.9.9"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    out = tmp_path / "dist"
    result = subprocess.run([sys.executable, str(SCRIPT), "--chart", str(chart), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "appVersion is '9.9.9'" in line and f"version is {release.package_version()!r}" in line
    assert not out.exists()  # nothing built


def test_the_repository_chart_matches_the_package_version() -> None:
    assert release.chart_versions()[1] == release.package_version()


@pytest.mark.slow
@pytest.mark.container
def test_release_builds_the_image_tar_and_the_chart_package(tmp_path: Path) -> None:
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    base = base_image()
    out = tmp_path / "dist"
    assert release.main(["--out", str(out), "--base-image", base]) == 0
    version = release.package_version()
    image_tar = out / f"gpu-utilization-exporter-{version}-image.tar"
    with tarfile.open(image_tar) as tar:
        (manifest,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest["Config"]))  # type: ignore[arg-type]
    assert manifest["RepoTags"] == [f"localhost/gpu-utilization-exporter:{version}"]
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.base.name"] == base
    assert config["config"]["Healthcheck"]["Test"][0] == "CMD"
    chart_version = release.chart_versions()[0]
    with helm.Chart.load(out / f"gpu-utilization-exporter-{chart_version}.tgz") as packaged:
        assert packaged.metadata["appVersion"] == version
    # the wheels: the exporter and the training library alone (tests/test_training_standalone.py installs it)
    for distribution in ("gpu_utilization_exporter", "gpu_utilization_exporter_training"):
        assert (out / f"{distribution}-{version}-py3-none-any.whl").is_file(), distribution


def _build_dirs() -> dict[str, list[tuple[str, int]] | None]:
    """What the checkout's build/ folders hold now (a user's own `pip install .` may have left them)."""
    return {str(d): sorted((str(p), p.stat().st_mtime_ns) for p in d.rglob("*")) if d.exists() else None
            for d in (REPO / "build", REPO / "exporter" / "build")}


def test_wheels_only_builds_the_two_wheels_without_podman_or_helm(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    before = _build_dirs()
    result = subprocess.run([sys.executable, str(SCRIPT), "--wheels-only", "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    version = release.package_version()
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"gpu_utilization_exporter-{version}-py3-none-any.whl",
                     f"gpu_utilization_exporter_training-{version}-py3-none-any.whl"]
    assert [line.split()[0] for line in result.stdout.splitlines()] == [str(out / n) for n in names]
    assert _build_dirs() == before  # built from copies: the checkout's build/ folders are left as they were


@pytest.mark.slow
def test_wheels_only_works_in_a_fresh_venv_without_the_wheel_package(tmp_path: Path) -> None:
    """A plain `python -m venv` (what README command 1 makes) has an old setuptools and no `wheel`; release.py
    falls back to `pip wheel` there. Costs a venv, PyYAML from pip's cache and two isolated builds (~15 s)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "pyyaml"], check=True, timeout=300)
    has_wheel = subprocess.run([str(py), "-c", "import wheel"], capture_output=True, timeout=60).returncode == 0
    out = tmp_path / "dist"
    result = subprocess.run([str(py), str(SCRIPT), "--wheels-only", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    version = release.package_version()
    assert sorted(p.name for p in out.iterdir()) == [f"gpu_utilization_exporter-{version}-py3-none-any.whl",
                                                     f"gpu_utilization_exporter_training-{version}-py3-none-any.whl"]
    if has_wheel:
        pytest.skip("this Python's venv ships the wheel package: the pip-wheel fallback was not exercised")
