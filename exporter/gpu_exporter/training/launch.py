"""``python -m gpu_exporter.training.launch train.py [args...]``: run a script with zero-code timing.

The same as ``GPU_EXPORTER_AUTO=1 python train.py [args...]`` where the startup hook is not installed
(the full exporter package, a checkout): it turns on :mod:`gpu_exporter.training.auto`, sets
``$GPU_EXPORTER_AUTO=1`` for the processes the job starts (where the hook is installed, they are timed
too), and runs the script as ``__main__`` (``runpy``, with ``sys.argv`` and ``sys.path[0]`` as
``python train.py`` sets them). ``-m module`` runs a module instead, like ``python -m``. Under
torchrun: ``torchrun --nproc_per_node=8 -m gpu_exporter.training.launch train.py [args...]``.
Exit status and exceptions are the script's own.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence

from .auto import ENV, enabled, install

USAGE = "usage: python -m gpu_exporter.training.launch (SCRIPT | -m MODULE) [ARGS...]"


def main(argv: Sequence[str] | None = None) -> None:
    """Activate zero-code timing and run the script or module of ``argv`` (default ``sys.argv[1:]``) as ``__main__``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or (args[0] == "-m" and len(args) < 2):
        asked = bool(args) and args[0] in ("-h", "--help")
        print(USAGE + "\nRuns the script with its training phases timed and pushed to $GPU_EXPORTER_URL "
              "(docs/training.md#zero-code-activation).", file=sys.stdout if asked else sys.stderr)
        raise SystemExit(0 if asked else 2)
    if not enabled():
        os.environ[ENV] = "1"
    install()
    if args[0] == "-m":
        sys.argv = args[1:]  # sys.path[0] is the working directory already, as python -m sets it
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = args
    sys.path[:1] = [os.path.dirname(os.path.abspath(args[0]))]  # sys.path[0], as `python SCRIPT` sets it
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
