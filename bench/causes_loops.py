"""Training jobs of the cause-accuracy bench that the tests' loops lack as they are (bench/causes_accuracy.py).

Each is a test loop run unchanged but for what this module adds:

* ``async PLAN URL SECONDS``: a loop of tests/async_loops.py on its asynchronous simulated GPU (uuid, run name and
  collective group from ``$ASYNC_LOOP_UUID``, ``$ASYNC_LOOP_RUN``, ``$ASYNC_LOOP_GROUP`` as that module reads them;
  kernel shares from ``$GPU_SIM_KERNEL``). Two plans are added: ``cm`` (both ranks spend most of the step in a
  large all-reduce: communication-bound) and ``allocator`` (:class:`ThrashingDevice`: every step's first kernel
  needs memory the caching allocator cannot give from its cache, so it frees the cache, which waits for the
  stream, and retries; ``torch.cuda.memory_stats()`` counts each retry, as PyTorch's ``num_alloc_retries`` does).
* ``integration INTEGRATION LOOP URL UUID SECONDS OUT RUN``: a job of tests/integration_loops.py (``watch``,
  ``lightning``, ``transformers``) under the run name ``RUN`` (that module's own ``main`` derives the name from
  the integration and loop, so two jobs of the same loop with other kernels would share it). One plan is added:
  ``gpu_bound`` (:data:`GPU_BOUND`).

Run as a script (the tests' folder goes on ``sys.path`` here)::

    ASYNC_LOOP_UUID=GPU-x ASYNC_LOOP_RUN=x GPU_SIM_DEVICE_DIR=/tmp/ch python bench/causes_loops.py async cm URL 60
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "tests", REPO / "exporter"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

RETRY_SECONDS = 0.1
"""What one allocator retry costs with the GPU idle: the stream drained (cudaFree synchronizes), the cached blocks
freed and the request malloc'ed again."""


def _async(plan: str, url: str, seconds: float) -> None:
    import async_loops
    from gpu_exporter.simulate import device, torch_cuda

    async_loops.PLANS["cm"] = async_loops.Plan(data=0.005, kernels=0.03, allreduce=0.12)
    async_loops.PLANS["allocator"] = async_loops.Plan(data=0.003, kernels=0.1, launches=4)
    if plan == "allocator":
        base_device, base_install = device.AsyncDevice, torch_cuda.install

        class ThrashingDevice(base_device):  # type: ignore[valid-type,misc]
            """An AsyncDevice whose caching allocator misses once a step, at the step's first kernel."""

            retries = 0
            _fresh = False

            def doing(self, what: str) -> None:
                super().doing(what)
                self._fresh = what == "compute"

            def launch(self, seconds: float, cpu_seconds: float = 0.0, **shares: Any) -> None:
                if self._fresh:
                    self._fresh = False
                    self.free_and_retry(RETRY_SECONDS)
                    self.retries += 1
                super().launch(seconds, cpu_seconds, **shares)

        def install(gpu: Any, **kwargs: Any) -> Any:
            import torch

            undo = base_install(gpu, **kwargs)
            stats = torch.cuda.memory_stats
            torch.cuda.memory_stats = lambda device=None: {**stats(device), "num_alloc_retries": gpu.retries}
            return undo

        device.AsyncDevice = ThrashingDevice  # type: ignore[misc]
        torch_cuda.install = install  # type: ignore[assignment]
    async_loops.train(plan, url, seconds)


GPU_BOUND = (16, 0.003, 1.0, 0.0, 0.0)
"""The ``gpu_bound`` plan of tests/integration_loops.py's jobs (batch, data, compute, metrics, checkpoint seconds):
1 s of compute per step. The tests' ``healthy`` (0.25 s) left its GPU 83-86% busy in a trial on this 2-core machine
at load 12-14 (the step's Python and waits stretch under load): on the 85% target line, not a clear GPU-bound job."""
GPU_BOUND_MATMUL = 384
"""The ``gpu_bound`` jobs' matrices (the module's MATMUL is 192): with 1 s of compute a step, the full run at load
16-20 still left those GPUs 85-89% busy, most of the idle time the Python between two operators of the compute
box; operators 8 times as long leave that gap an eighth as large a share."""


def _integration(integration: str, loop: str, url: str, uuid: str, seconds: str, out: str, run: str) -> None:
    import integration_loops as jobs

    jobs.ALL_PLANS["gpu_bound"] = GPU_BOUND
    if loop == "gpu_bound":
        jobs.MATMUL = GPU_BOUND_MATMUL

    jobs.UUID.append(uuid)
    jobs.OUT.append(Path(out))
    jobs.RUNNERS[integration](loop, url, uuid, float(seconds), run)
    jobs.report(final=True)
    for gpu in jobs.DEVICE:
        gpu.close()


def main(argv: list[str]) -> None:
    kind, *rest = argv
    if kind == "async":
        plan, url, seconds = rest
        _async(plan, url, float(seconds))
    elif kind == "integration":
        _integration(*rest)
    else:
        sys.exit(f"causes_loops: error: unknown kind {kind!r} (async, integration)")


if __name__ == "__main__":
    main(sys.argv[1:])
