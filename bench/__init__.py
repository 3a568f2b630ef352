"""Side-by-side benchmarks of gpu-exporter against nvitop-exporter on the same simulated node.

Run ``python -m bench --quick`` (a minute or two) or ``python -m bench --full``; both rewrite
docs/benchmarks.md (or ``--output``) with the machine, every figure and the command used.
"""

from __future__ import annotations
