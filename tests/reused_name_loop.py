"""A short instrumented loop that sleeps in ``data`` and ``compute``, for tests/test_report.py's reused run name.

Standard library only (no torch, so a launch starts in a fraction of a second)::

    python tests/reused_name_loop.py NAME URL UUID SECONDS DATA_SHARE TIMERS.json

It runs ``training.start(NAME)`` on GPU ``UUID`` for about SECONDS (the library's modules loaded before the
timers start, as in a job that imported them long before), each step sleeping ``DATA_SHARE`` of 0.1 s in
``data`` and the rest in ``compute``, then writes its own timers to TIMERS.json: ``wall`` (perf_counter from
before ``training.start`` to after ``run.close()``), ``phases`` (perf_counter around each phase) and the launch's
``run_id``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gpu_exporter import training
from gpu_exporter.training import distributed, pusher, run  # noqa: F401  # loaded before the timers start

STEP = 0.1


def main(name: str, url: str, uuid: str, seconds: float, data_share: float, out: Path) -> None:
    t0 = time.perf_counter()
    job = training.start(name, url=url, uuid=uuid, rank=0, push_interval=0.5)
    own = {"data": 0.0, "compute": 0.0}
    while time.perf_counter() - t0 < seconds:
        for phase, wait in (("data", STEP * data_share), ("compute", STEP * (1 - data_share))):
            with job.phase(phase):
                a = time.perf_counter()
                time.sleep(wait)
                own[phase] += time.perf_counter() - a
        job.step(samples=8)
    job.close()
    wall = time.perf_counter() - t0
    out.write_text(json.dumps({"wall": wall, "phases": own, "run_id": job.run_id}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), Path(sys.argv[6]))
