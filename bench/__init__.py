"""Side-by-side benchmarks of gpu-exporter against nvitop-exporter on the same simulated node.

Run ``python -m bench --quick`` (about a minute) or ``python -m bench --full``; both write a
document with the machine, every figure and the command used: to a new temporary file (its path is
printed), to docs/benchmarks.md with ``--update-docs``, or to ``--output FILE``. They need the
``test`` extra (nvitop-exporter, psutil, torch).
"""

from __future__ import annotations
