"""Real two-rank DDP jobs on the CPU (gloo), instrumented with gpu_exporter.training, for tests/test_distributed_e2e.py.

One process per job spawns its two ranks (torch.multiprocessing, TCP rendezvous on 127.0.0.1). Each
rank reads its batches through a DataLoader whose dataset waits like slow storage, runs one real
DistributedDataParallel step (forward, backward with the gradient all-reduce, optimizer step), a
compute time box of real matrix products, and, in the ``allreduce`` job, all-reduces a large buffer a
fixed number of times per step. Each rank runs on an ops-mode simulated GPU ``GPU-ddp-<job>-<rank>``
(gpu_exporter.simulate.device.OpsDevice): the GPU is busy while the rank is inside torch operators,
idle while it waits for data or in gloo collectives, whatever the library reports::

    GPU_SIM_DEVICE_DIR=/tmp/ch python tests/ddp_loops.py straggler http://127.0.0.1:9445 60
"""

from __future__ import annotations

import sys
import time
from typing import Any

FEATURES, CLASSES, BATCH = 32, 4, 16

# job -> (seconds per batch in data for rank 0, for rank 1; seconds of compute per step; all-reduces of
# ALLREDUCE_FLOATS per step)
PLANS: dict[str, tuple[float, float, float, int]] = {
    "straggler": (0.01, 0.2, 0.04, 0),  # rank 1 loads slowly: rank 0 waits in the all-reduce
    "allreduce": (0.01, 0.01, 0.03, 8),  # both ranks spend most of the step in all-reduces alike: no straggler
}
ALLREDUCE_FLOATS = 1 << 22
"""16 MiB per all-reduce: about 15-20 ms over gloo on loopback."""


def rank_main(rank: int, job: str, url: str, port: int, seconds: float) -> None:
    """Rank ``rank`` of ``job``: train until ``seconds`` have passed, then stop with the other rank."""
    import torch
    import torch.distributed as dist
    from gpu_exporter import training
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    class SlowBatches(Dataset[tuple[Any, Any]]):
        """Random batches; reading one takes ``wait`` seconds."""

        def __init__(self, wait: float) -> None:
            self.wait = wait

        def __len__(self) -> int:
            return 10_000_000

        def __getitem__(self, index: int) -> tuple[Any, Any]:
            time.sleep(self.wait)
            return torch.randn(BATCH, FEATURES), torch.arange(BATCH) % CLASSES

    from gpu_exporter.simulate.device import OpsDevice

    OpsDevice(f"GPU-ddp-{job}-{rank}").start()  # closed at exit
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    waits = PLANS[job]
    run = training.start(job, url=url, uuid=f"GPU-ddp-{job}-{rank}", push_interval=0.5)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES)))
    training.watch_distributed(run, ddp_model=model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    compute = run.phase("compute")
    end = time.monotonic() + seconds
    go = torch.ones(1)
    buffer = torch.ones(ALLREDUCE_FLOATS)
    work = torch.randn(128, 128)
    try:
        for x, y in run.data(DataLoader(SlowBatches(waits[rank]), batch_size=None)):
            with compute:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                deadline = time.perf_counter() + waits[2]  # the rest of a step's GPU work, as a time box
                while time.perf_counter() < deadline:
                    work.copy_(torch.tanh(work @ work))
            for _ in range(waits[3]):
                dist.all_reduce(buffer)  # e.g. a large model's gradients: communication
            run.step(samples=len(y))
            go.fill_(1.0 if time.monotonic() < end else 0.0)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)  # both ranks stop at the same step
            if go.item() == 0.0:
                break
    finally:
        run.close()
        dist.destroy_process_group()


def main(job: str, url: str, seconds: float) -> None:
    """Spawn the two ranks of ``job`` and wait for them."""
    from torch.multiprocessing.spawn import start_processes

    from testbed import free_port

    start_processes(rank_main, args=(job, url, free_port(), seconds), nprocs=2, join=True,  # type: ignore[no-untyped-call]
                    start_method="spawn")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
