"""Build the release artifacts with one version: the image as a tar, the Helm chart as a .tgz, and the
wheels of the exporter and of the training library alone.

    python scripts/release.py [--out dist] [--base-image IMAGE] [--chart DIR] [--wheels-only]

The version is pyproject.toml's ``[project].version``. The chart's ``appVersion`` must equal it (the
chart's default image tag is its appVersion), or the script stops with a one-line error before
building anything. Then it

1. builds the image from the Dockerfile with podman (``--format docker`` keeps the HEALTHCHECK) as
   ``gpu-utilization-exporter:<version>``, with ``--build-arg VERSION=<version>``, and saves it
   with ``podman save`` as ``<out>/gpu-utilization-exporter-<version>-image.tar`` (docker-archive:
   ``docker load -i`` and ``podman load -i`` both read it);
2. packages the chart with Helm's Go SDK (helm-python-sdk's ``package``, the same code as
   ``helm package``) into ``<out>/gpu-utilization-exporter-<chart version>.tgz``;
3. builds two wheels from the same source (setuptools' PEP 517 backend: this Python's own, offline,
   when it has ``setuptools>=68`` with ``bdist_wheel``; else ``pip wheel``, which fetches it into an
   isolated build environment from pip's package index, as in a venv of README command 1): the exporter,
   ``<out>/gpu_utilization_exporter-<version>-py3-none-any.whl``, and the training library alone,
   ``<out>/gpu_utilization_exporter_training-<version>-py3-none-any.whl`` (distribution
   ``gpu-utilization-exporter-training``: ``gpu_exporter.training`` and the package's
   ``__init__``, no dependencies), for training jobs that need nothing of the exporter. Install one
   or the other in an environment: the exporter's wheel holds the library too.

``--wheels-only`` builds just the wheels (no podman, no Helm needed).

``--base-image`` is passed as the Dockerfile's ``PYTHON_IMAGE`` (default: the Dockerfile's own,
``python:3.12-slim``; where no registry is reachable, ``bash scripts/container-base.sh`` makes a
Debian one). This module is also the one definition of the podman build command: the container
tests import ``build_command`` and ``podman_command`` from here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the tomli backport, else the copy pip carries (any venv has pip)
    try:
        import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
    except ModuleNotFoundError:
        try:
            from pip._vendor import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]
        except ImportError:
            sys.exit("release.py: reading pyproject.toml needs Python 3.11+ or tomli: "
                     f"{sys.executable} -m pip install tomli")

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpu-utilization-exporter"
IMAGE_NAME = "gpu-utilization-exporter"
TRAINING_DISTRIBUTION = "gpu-utilization-exporter-training"
# The standalone training library: these files of the package, and nothing else.
TRAINING_FILES = ("gpu_exporter/__init__.py", "gpu_exporter/py.typed", "gpu_exporter/training/*.py")
# Where Debian's pip (python3-pip-whl, which the debootstrap base uses) reads its CA bundle.
IMAGE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


class ReleaseError(Exception):
    """A problem that stops the release, said in one line."""


def package_version(pyproject: Path = REPO / "pyproject.toml") -> str:
    """``[project].version`` of pyproject.toml."""
    version = tomllib.loads(pyproject.read_text())["project"]["version"]
    return str(version)


def chart_versions(chart: Path = CHART) -> tuple[str, str]:
    """(version, appVersion) of the chart's Chart.yaml."""
    import yaml  # the exporter's own dependency (pyyaml), installed by README command 1

    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    return str(meta["version"]), str(meta.get("appVersion", ""))


def check_versions(version: str, chart: Path = CHART) -> str:
    """Return the chart version; raise ReleaseError unless the chart's appVersion is ``version``."""
    chart_version, app_version = chart_versions(chart)
    if app_version != version:
        raise ReleaseError(f"{chart / 'Chart.yaml'}: appVersion is {app_version!r} but pyproject.toml's "
                           f"version is {version!r}; set appVersion: \"{version}\" before releasing")
    return chart_version


def podman_command(*args: str) -> list[str]:
    """podman with the global options machines without systemd need: cgroupfs, and runc when installed."""
    podman = shutil.which("podman")
    if podman is None:
        raise ReleaseError("podman is not installed (apt-get install podman)")
    runc = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
    runtime = ["--runtime", runc] if runc else []
    return [podman, "--cgroup-manager=cgroupfs", *runtime, *args]


def run_limits() -> list[str]:
    """``--ulimit`` options a sandbox without systemd accepts: podman's defaults (1048576 open files, the
    host's process limit) exceed what it may set, and runc then fails with 'error setting rlimits'.
    Open files: this process's own limit. Processes: at most 32768, the most that podman 4.3 here could
    set (found by bisection: 32769 fails with 'error setting rlimit type 6')."""
    options = []
    for name, limit, cap in (("nofile", resource.RLIMIT_NOFILE, None), ("nproc", resource.RLIMIT_NPROC, 32768)):
        soft, hard = resource.getrlimit(limit)
        if hard == resource.RLIM_INFINITY and cap is None:
            continue
        hard = min(h for h in (hard, cap) if h is not None and h != resource.RLIM_INFINITY)
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        options += ["--ulimit", f"{name}={soft}:{hard}"]
    return options


def host_ca_bundle() -> Path | None:
    """The CA bundle this machine's pip trusts (PIP_CERT, else pip's ``cert`` setting), when it has one.

    Behind a TLS-intercepting proxy pip needs that bundle inside the build too; the build mounts it
    read-only for its RUN steps only, so it is not in the image.
    """
    cert = os.environ.get("PIP_CERT")
    if not cert:
        try:
            found = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.cert"],
                                   capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        cert = found.stdout.strip() if found.returncode == 0 else ""
    return Path(cert) if cert and Path(cert).is_file() else None


def build_command(tag: str, version: str, base_image: str | None = None, context: Path = REPO) -> list[str]:
    """The podman build command for the image (chroot isolation: no container runtime needed to build).

    pip inside the build reaches the index the way pip here does: the same CA bundle (mounted) and,
    when set, the same ``PIP_INDEX_URL`` (a build argument the build stage declares).
    """
    options = ["build", "--isolation=chroot", "--network=host", "--format", "docker",
               "--build-arg", f"VERSION={version}", "--tag", tag]
    if base_image:
        options += ["--build-arg", f"PYTHON_IMAGE={base_image}"]
    ca = host_ca_bundle()
    if ca is not None:
        options += ["--volume", f"{ca}:{IMAGE_CA_BUNDLE}:ro"]
    if os.environ.get("PIP_INDEX_URL", "").startswith(("http://", "https://")):
        options += ["--build-arg", f"PIP_INDEX_URL={os.environ['PIP_INDEX_URL']}"]
    return podman_command(*options, "--file", str(context / "Dockerfile"), str(context))


def run(command: Sequence[str], what: str, timeout: float = 1800) -> None:
    """Run ``command``; on failure raise ReleaseError with its last output lines."""
    result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-15:]
        raise ReleaseError(f"{what} failed (exit {result.returncode}): " + " | ".join(tail))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


BUILD_REQUIREMENT = "setuptools>=68"
"""The build backend both pyproject.tomls name (``[build-system] requires``)."""
LOCAL_BACKEND_CHECK = """
import sys
try:
    import setuptools
except ImportError:
    sys.exit("no setuptools")
if int(setuptools.__version__.split(".")[0]) < 68:
    sys.exit(f"setuptools {setuptools.__version__}, older than 68")
try:
    import setuptools.command.bdist_wheel
except ImportError:
    try:
        import wheel.bdist_wheel
    except ImportError:
        sys.exit(f"setuptools {setuptools.__version__} without the wheel package")
"""
"""Exits with the reason when this Python cannot build a wheel offline with its own setuptools."""


def local_backend() -> str | None:
    """None when this Python's setuptools builds wheels (``setuptools>=68`` with ``bdist_wheel``); else why not.

    A venv of README command 1 has none on Python 3.12+ and setuptools 65 without ``wheel`` on 3.10/3.11.
    """
    check = subprocess.run([sys.executable, "-c", LOCAL_BACKEND_CHECK], capture_output=True, text=True, timeout=120)
    return None if check.returncode == 0 else (check.stderr.strip().splitlines() or ["no usable setuptools"])[-1]


def build_wheel(project: Path, out: Path, isolated: bool = False) -> Path:
    """Build a wheel of ``project`` (a folder with a pyproject.toml) into ``out``.

    With this Python's setuptools, offline, when it can (``isolated`` False); else with
    ``pip wheel``, which fetches the build requirement into an isolated build environment from the
    index pip uses. A failure is a ReleaseError of one line naming the fix.
    """
    out.mkdir(parents=True, exist_ok=True)
    if not isolated:
        code = "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))"
        result = subprocess.run([sys.executable, "-c", code, str(out.resolve())], cwd=project, capture_output=True,
                                text=True, timeout=600)
        if result.returncode != 0:
            raise ReleaseError(f"wheel build of {project.name} failed (exit {result.returncode}): "
                               + _last_error(result.stdout + result.stderr))
        return out / result.stdout.strip().splitlines()[-1]
    before = set(out.glob("*.whl"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                             "-w", str(out.resolve()), str(project.resolve())],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        why = _last_error(result.stdout + result.stderr)
        raise ReleaseError(f"pip could not build the {project.name} wheel ({why}); without a package index, "
                           "install the build requirement into this Python first: "
                           f"{sys.executable} -m pip install '{BUILD_REQUIREMENT}' wheel")
    built = sorted(set(out.glob("*.whl")) - before)
    if len(built) != 1:
        raise ReleaseError(f"pip wheel of {project.name} left {len(built)} new wheels in {out}, expected 1")
    return built[0]


def _last_error(output: str) -> str:
    """The line of a build's output that says what went wrong (a traceback's last line), not the whole output."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:") or "Error:" in line]  # pip's, a traceback's
    return (errors or lines or ["no output"])[-1]


def training_pyproject(version: str, pyproject: Path = REPO / "pyproject.toml") -> str:
    """pyproject.toml of the training library alone: the exporter's name, license and Python, no dependencies."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return (f"""[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{TRAINING_DISTRIBUTION}"
version = "{version}"
description = "The in-job library of gpu-utilization-exporter (gpu_exporter.training), alone: standard library only."
readme = "README.md"
requires-python = "{project['requires-python']}"
license = {{ text = "{project['license']['text']}" }}
dependencies = []

[tool.setuptools]
packages = ["gpu_exporter", "gpu_exporter.training"]
package-dir = {{ "" = "src" }}

[tool.setuptools.package-data]
gpu_exporter = ["py.typed"]
""")


TRAINING_README = """# gpu-utilization-exporter-training

`gpu_exporter.training` of gpu-utilization-exporter on its own: it reports a training job's phase
timings (data, compute, metrics, ...) to the exporter on the job's node, which names the reason its
GPU is underused. Standard library only (torch is used when the job has loaded it). Set
`GPU_EXPORTER_URL` to the exporter and, where the job cannot name its GPU, `CUDA_VISIBLE_DEVICES`
to the GPU's UUID. Do not install it beside the full `gpu-utilization-exporter`, which contains it.
"""


def stage_training(version: str, stage: Path, source: Path = REPO / "exporter") -> Path:
    """A project folder for the training wheel: the library's files copied from ``source``."""
    files = sorted({path for pattern in TRAINING_FILES for path in source.glob(pattern)})
    if not any(path.match("training/__init__.py") for path in files):
        raise ReleaseError(f"{source}: no gpu_exporter/training package to build the training wheel from")
    for path in files:
        target = stage / "src" / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (stage / "pyproject.toml").write_text(training_pyproject(version))
    (stage / "README.md").write_text(TRAINING_README)
    shutil.copyfile(REPO / "setup.py", stage / "setup.py")  # the build hook that installs the startup hook
    return stage


def startup_hook(source: Path = REPO / "exporter") -> tuple[str, str]:
    """The zero-code startup hook both wheels hold (setup.py writes it): (file name, its one line), from
    training/auto.py."""
    import runpy

    auto = runpy.run_path(str(source / "gpu_exporter" / "training" / "auto.py"))  # standard library only
    return str(auto["PTH_NAME"]), str(auto["PTH_LINE"])


def build_wheels(out: Path) -> list[Path]:
    """The exporter's wheel and the training library's wheel, built from copies of the sources (the
    repository gets no build/ or egg-info folders)."""
    version = package_version()
    why = local_backend()
    if why is not None:
        print(f"release: this Python cannot build wheels itself ({why}); pip builds them in an isolated environment "
              f"with {BUILD_REQUIREMENT} from its package index", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="release-wheels-") as tmp:
        exporter = Path(tmp) / "exporter-project"
        exporter.mkdir()
        for name in ("pyproject.toml", "README.md", "setup.py"):
            shutil.copyfile(REPO / name, exporter / name)
        shutil.copytree(REPO / "exporter", exporter / "exporter",
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        training = stage_training(version, Path(tmp) / "training-project")
        isolated = why is not None
        return [build_wheel(exporter, out, isolated), build_wheel(training, out, isolated)]


def release(out: Path, base_image: str | None, chart: Path = CHART) -> list[Path]:
    """Check the versions, build and save the image, package the chart; return the artifacts."""
    version = package_version()
    chart_version = check_versions(version, chart)
    out.mkdir(parents=True, exist_ok=True)
    tag = f"{IMAGE_NAME}:{version}"
    run(build_command(tag, version, base_image), f"podman build of {tag}")
    image_tar = out / f"{IMAGE_NAME}-{version}-image.tar"
    image_tar.unlink(missing_ok=True)
    run(podman_command("save", "--format", "docker-archive", "--output", str(image_tar), tag), f"podman save {tag}")

    import helm_python as helm  # the Helm Go SDK; imported here so that --help works without it

    helm.disable_logging()
    archive = Path(helm.package(chart, destination=out))
    expected = out / f"{chart.name}-{chart_version}.tgz"
    if archive.resolve() != expected.resolve():
        raise ReleaseError(f"helm package wrote {archive}, expected {expected}")
    return [image_tar, archive, *build_wheels(out)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the image tar and the chart package with one version.")
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="folder for the artifacts (default dist/)")
    parser.add_argument("--base-image", help="the Dockerfile's PYTHON_IMAGE (default: the Dockerfile's own)")
    parser.add_argument("--chart", type=Path, default=CHART, help="chart folder (default the repository's)")
    parser.add_argument("--wheels-only", action="store_true",
                        help="build only the exporter's and the training library's wheels")
    args = parser.parse_args(argv)
    try:
        artifacts = build_wheels(args.out) if args.wheels_only else release(args.out, args.base_image, args.chart)
    except ReleaseError as err:
        print(f"release: {err}", file=sys.stderr)
        return 1
    for path in artifacts:
        size = path.stat().st_size
        shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
        print(f"{path}  {shown}  sha256:{sha256(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
