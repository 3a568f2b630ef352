"""Training loops on the asynchronous simulated GPU (gpu_exporter.simulate.device.AsyncDevice), for the cause tests.

Each loop is shaped like a real CUDA loop: it queues its kernels in ``compute`` (launching returns at
once, the device runs them on its own clock), and the CPU waits for them wherever the code syncs: a
``loss.item()`` in ``metrics``, a ``.cpu()`` before a Python metric, ``state_dict()`` copied to the
CPU before a checkpoint, an emulated NCCL all-reduce. The library sees a CUDA device through the
``torch.cuda`` subset that gpu_exporter.simulate.torch_cuda installs, so its default (GPU-truthful)
phases run. The simulated GPU of the exporter reads the device's busy intervals through the channel
(a scenario GPU with ``device: true``): it is busy because the loop gave it work, never because the
loop said ``compute``.

The loop also marks what its CPU really does (``device.doing``), so the device knows, exactly, how
long it sat idle during each, which is the truth the tests compare the library's phases with
(:func:`truth_shares`). Run one loop per process::

    GPU_SIM_DEVICE_DIR=/tmp/ch python tests/async_loops.py input_item http://127.0.0.1:9445 30 [/tmp/out.json]

The output file gets ``{"truth": shares, "library": shares, "synchronize_calls": n}`` at the end.
A loop of the DDP pair reads ``RANK``/``WORLD_SIZE``, ``ASYNC_LOOP_GROUP`` (the emulated NCCL group) and
``ASYNC_LOOP_WAIT_BUSY`` (1, the default: the collective's wait for the slowest rank is busy, as NCCL's
spinning kernel; 0: idle).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cause_loops import f1_macro

STANDARD = ("data", "compute", "metrics", "checkpoint", "communication", "other")


@dataclass(frozen=True)
class Plan:
    """Seconds per step: ``data`` CPU wait for the batch (slow storage), ``kernels`` GPU time queued in compute
    (``launches`` kernels, each costing ``launch_cpu`` seconds of CPU to issue), ``metric`` Python after a
    ``.cpu()``, ``checkpoint`` seconds writing a state_dict copied to the CPU, ``allreduce`` the emulated
    NCCL transfer. ``wobble`` alternates the data wait with another every few seconds (hysteresis)."""

    data: float
    kernels: float
    launches: int = 4
    launch_cpu: float = 0.0
    metric: float = 0.0
    checkpoint: float = 0.0
    allreduce: float = 0.0
    wobble: tuple[float, float] | None = None
    lagged_item: bool = False
    """``.item()`` on the previous step's loss (the usual way to log it): the GPU always has this step queued."""


PLANS: dict[str, Plan] = {
    # M1: the GPU idles while the CPU waits for data; loss.item() in metrics waits for the kernels (not metrics).
    "input_item": Plan(data=0.11, kernels=0.04),
    # healthy: GPU-bound, with a per-step loss.item() (of the previous step's loss, so this step stays queued).
    "healthy_item": Plan(data=0.003, kernels=0.5, launches=8, lagged_item=True),
    # M2 for real: predictions .cpu(), then a Python F1 score while the GPU idles (target level: info).
    "metrics_cpu": Plan(data=0.005, kernels=0.08, metric=0.09),
    # M1 and M2 together, below 30%.
    "mixed": Plan(data=0.12, kernels=0.04, metric=0.06),
    # M3: hundreds of tiny kernels; issuing each costs more CPU than the GPU needs to run it.
    "launch_bound": Plan(data=0.003, kernels=0.02, launches=250, launch_cpu=0.0006),
    # CK: state_dict() copied to the CPU (waits for the kernels, then copies), then written to disk.
    "checkpoint_copy": Plan(data=0.005, kernels=0.03, checkpoint=0.17),
    # M1 whose GPU swings around the 30% line (data 0.09 s / 0.14 s, switching every 3.5 s).
    "hover30": Plan(data=0.09, kernels=0.045, wobble=(3.5, 0.14)),
    # A 2-rank DDP job: rank 1 loads its data slowly (the straggler, M1); rank 0 waits for it in the all-reduce.
    "ddp_fast": Plan(data=0.005, kernels=0.06, allreduce=0.004),
    "ddp_slow": Plan(data=0.2, kernels=0.06, allreduce=0.004),
}


def truth_shares(truth: dict[str, Any]) -> dict[str, float]:
    """The device's truth as phase shares: each CPU activity's share of wall time is the GPU's idle time
    during it, ``communication`` is the time the stream spent in collectives (waiting and transferring),
    and ``compute`` is the rest (the GPU busy with the loop's kernels, or idle while the loop issued them)."""
    wall = truth["wall"]
    shares = {p: truth["idle"].get(p, 0.0) / wall for p in STANDARD if p != "compute"}
    shares["communication"] = truth["collective"] / wall
    shares["compute"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def library_shares(phases: dict[str, float]) -> dict[str, float]:
    total = sum(phases.values())
    return {p: phases.get(p, 0.0) / total for p in STANDARD}


def train(name: str, url: str, seconds: float, out: Path | None = None) -> None:
    import torch
    from gpu_exporter import training
    from gpu_exporter.simulate import torch_cuda
    from gpu_exporter.simulate.device import AsyncDevice

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # end the loop, write the output (the tests stop it)
    plan = PLANS[name]
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    uuid = os.environ.get("ASYNC_LOOP_UUID", f"GPU-async-{name}")
    # The emulated NCCL kernel spins (busy) while it waits for the slowest rank, as on real drivers, so a waiting
    # rank's GPU reads busy and its useful work is what the verdict must see; $ASYNC_LOOP_WAIT_BUSY=0 makes it idle.
    gpu = AsyncDevice(uuid, group=os.environ.get("ASYNC_LOOP_GROUP", ""), rank=rank, world=world,
                      wait_busy=os.environ.get("ASYNC_LOOP_WAIT_BUSY", "1") == "1")
    torch_cuda.install(gpu)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    run_name = os.environ.get("ASYNC_LOOP_RUN", name)
    run = training.start(run_name, url=url, uuid=uuid, push_interval=0.5)
    began = time.monotonic()
    data, compute, metrics = run.phase("data"), run.phase("compute"), run.phase("metrics")
    checkpoint, communication = run.phase("checkpoint"), run.phase("communication")
    path = Path(tempfile.gettempdir()) / f"async-loop-{os.getpid()}.pt"
    end = time.monotonic() + seconds
    previous: Any = None
    try:
        while time.monotonic() < end:
            with data:
                gpu.doing("data")
                wait = plan.data
                if plan.wobble is not None and int(time.monotonic() / plan.wobble[0]) % 2:
                    wait = plan.wobble[1]
                time.sleep(wait)  # the batch comes from slow storage
                gpu.copy(0.0005)  # .to("cuda", non_blocking=True)
            with compute:
                gpu.doing("compute")
                for _ in range(plan.launches):
                    gpu.launch(plan.kernels / plan.launches, cpu_seconds=plan.launch_cpu)
            if plan.allreduce:
                with communication:
                    gpu.doing("communication")
                    gpu.all_reduce(plan.allreduce)  # DDP's bucket all-reduce: queued, returns at once
            with metrics:
                gpu.doing("metrics")
                if plan.lagged_item:  # the previous step's loss.item(): waits for that step's kernels only
                    if previous is not None:
                        previous.synchronize()
                    previous = gpu.record()
                else:
                    gpu.item()  # loss.item(): waits for everything queued
                if plan.metric:
                    predicted = torch.randint(0, 4, (256,)).tolist()
                    actual = torch.randint(0, 4, (256,)).tolist()
                    deadline = time.perf_counter() + plan.metric
                    while time.perf_counter() < deadline:
                        f1_macro(predicted, actual)
            if plan.checkpoint:
                with checkpoint:
                    gpu.doing("checkpoint")
                    gpu.item()  # state_dict() .cpu(): waits for the kernels ...
                    gpu.copy(0.002)  # ... and copies the weights
                    deadline = time.perf_counter() + plan.checkpoint
                    while time.perf_counter() < deadline:
                        torch.save(model.state_dict(), path)
            gpu.doing("other")
            run.step(samples=32)
    finally:
        lib = run.phase_seconds()
        truth = gpu.truth(since=began)
        run.close()
        gpu.close()
        path.unlink(missing_ok=True)
        if out is not None:
            out.write_text(json.dumps({"truth": truth_shares(truth), "library": library_shares(lib),
                                       "synchronize_calls": gpu.torch_synchronize_calls}))


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]) if len(sys.argv) > 4 else None)
