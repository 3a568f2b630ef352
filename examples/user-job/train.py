"""A training job's loop with the standalone library, and nothing else: the stand-in for YOUR script.

It imports only ``gpu_exporter.training`` (the ``gpu-utilization-exporter-training`` wheel, standard
library only) and fakes the work: each step waits ``--data-ms`` for its batch (a slow loader) and
spins ``--compute-ms`` on the CPU (the model). With the defaults the job is input-bound (remedy M1),
so the exporter's ``gpu-exporter diagnose`` names phase "data". In your own script the same four
calls wrap your real loader and step (docs/training.md):

    run = training.start("my-run")            # GPU_EXPORTER_URL and the GPU UUID from the environment
    for batch in run.data(loader): ...        # time blocked in next(loader) is phase "data"
        with run.phase("compute"): ...
        run.step(samples=len(batch))
    run.close()
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

from gpu_exporter import training


def slow_loader(data_ms: float) -> Iterator[int]:
    """Batches that take ``data_ms`` each to arrive."""
    batch = 0
    while True:
        time.sleep(data_ms / 1000)
        batch += 1
        yield batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="user-job", help="run name (label run)")
    parser.add_argument("--seconds", type=float, default=3600, help="stop after this long")
    parser.add_argument("--data-ms", type=float, default=40, help="wait per batch (the loader)")
    parser.add_argument("--compute-ms", type=float, default=10, help="CPU spin per step (the model)")
    parser.add_argument("--push-interval", type=float, default=5, help="seconds between pushes")
    args = parser.parse_args()
    run = training.start(args.run, push_interval=args.push_interval)
    end = time.monotonic() + args.seconds
    for _batch in run.data(slow_loader(args.data_ms)):
        with run.phase("compute"):
            spin_until = time.perf_counter() + args.compute_ms / 1000
            while time.perf_counter() < spin_until:
                pass
        run.step(samples=32)
        if time.monotonic() >= end:
            break
    run.close()


if __name__ == "__main__":
    main()
