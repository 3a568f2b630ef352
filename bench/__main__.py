"""``python -m bench``: see bench/run.py."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import gpu_exporter  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a plain checkout: use its sources
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporter"))

try:
    from bench.run import main
except ModuleNotFoundError as err:  # nvitop-exporter, psutil, torch: the test extra
    sys.exit(f"bench: error: module {err.name!r} is missing: the benchmarks need the test extra "
             "(pip install -e '.[test]', or bash tests/run.sh)")

sys.exit(main())
