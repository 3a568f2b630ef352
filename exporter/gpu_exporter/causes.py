"""The cause table's old home: everything now lives in :mod:`gpu_exporter.verdict.causes` (re-exported here)."""

from __future__ import annotations

from gpu_exporter.verdict.causes import *  # noqa: F403
from gpu_exporter.verdict.causes import __all__ as __all__
