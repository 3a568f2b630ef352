"""``python -m bench``: see bench/run.py."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import gpu_exporter  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # a plain checkout: use its sources
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporter"))

from bench.run import main

sys.exit(main())
