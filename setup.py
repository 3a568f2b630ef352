"""Build hook of both distributions (with pyproject.toml): installs the zero-code startup hook.

``GPU_EXPORTER_AUTO=1`` works through a ``.pth`` file at the root of site-packages (the one line
``gpu_exporter.training.auto.PTH_LINE``, named ``PTH_NAME``). setuptools puts package files under
their package, and ``data_files`` land under the environment's prefix, so ``build_py`` writes the
file at the root of the build (a wheel's purelib): ``pip install .``, the exporter's wheel, the
image, and the training library's wheel (scripts/release.py copies this file into its project).
Both distributions write the same file name, so an environment holding both has one hook (and
``auto.install`` is idempotent besides).
"""

from __future__ import annotations

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
AUTO = ("exporter", "src")
"""Where gpu_exporter/ lies: the repository's exporter/ or the training wheel's staged src/."""


def startup_hook() -> tuple[str, str]:
    """(file name, its one line), read from gpu_exporter/training/auto.py (standard library only)."""
    for folder in AUTO:
        path = HERE / folder / "gpu_exporter" / "training" / "auto.py"
        if path.is_file():
            auto = runpy.run_path(str(path))
            return str(auto["PTH_NAME"]), str(auto["PTH_LINE"])
    raise SystemExit(f"setup.py: no gpu_exporter/training/auto.py under {' or '.join(AUTO)} in {HERE}")


class BuildWithStartupHook(build_py):
    """build_py, then the startup hook at the root of the build."""

    def run(self) -> None:
        super().run()
        name, line = startup_hook()
        target = Path(self.build_lib) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(line)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / startup_hook()[0])]


setup(cmdclass={"build_py": BuildWithStartupHook})
