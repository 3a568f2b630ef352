"""The cause loops of the real-GPU check (bench/real_gpu.py): one training loop per variant, instrumented with
``gpu_exporter.training``, on CUDA or on a simulated GPU (:class:`Gpu`). The driver starts each in its own
process (``python -m bench.real_gpu --loop VARIANT``); bench/real_gpu.py's docstring says what each does and
what verdict it expects."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CLASSES = 16


@dataclass(frozen=True)
class Plan:
    """Seconds per step of one variant. ``decode``: CPU decoding of the next batch in ``data`` (0: the batch is
    already on the GPU); ``kernels``: GPU time queued in ``compute`` (on a real GPU the model's depth is
    calibrated to it); ``metric``: a Python metric in the step; ``slow_decode``: rank 1's decoding (ddp).
    On the simulated device the step's kernels go out in ``launches`` launches, each costing ``launch_cpu``
    of CPU time to issue. ``depth`` fixes the real model's hidden layers (0: calibrated)."""

    kind: str
    batch: int
    decode: float
    kernels: float
    metric: float = 0.0
    slow_decode: float = 0.0
    launches: int = 1
    launch_cpu: float = 0.0
    width: int = 4096
    depth: int = 0


PLANS: dict[str, Plan] = {
    "input-bound": Plan("plain", batch=1024, decode=0.11, kernels=0.04),
    "healthy": Plan("plain", batch=4096, decode=0.0, kernels=0.3),
    "batch-of-2": Plan("plain", batch=2, decode=0.0, kernels=0.02, launches=50, launch_cpu=0.003, width=256,
                       depth=8),
    "lightning": Plan("lightning", batch=1024, decode=0.005, kernels=0.05, metric=0.1),
    "ddp": Plan("ddp", batch=1024, decode=0.005, slow_decode=0.2, kernels=0.06),
}


# --- the loops (one process per variant; two for ddp) ------------------------------------------------------


def f1_macro(predicted: list[int], actual: list[int]) -> float:
    """Macro F1 in plain Python: the per-step metric that keeps a GPU waiting."""
    scores = []
    for c in range(CLASSES):
        tp = sum(p == c and a == c for p, a in zip(predicted, actual, strict=True))
        fp = sum(p == c and a != c for p, a in zip(predicted, actual, strict=True))
        fn = sum(p != c and a == c for p, a in zip(predicted, actual, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / CLASSES


class SyncCounter:
    """Wraps ``torch.cuda.synchronize``: how often it was called, and how often from gpu_exporter's own code."""

    def __init__(self, torch: Any) -> None:
        self.calls = 0
        self.library = 0
        original = torch.cuda.synchronize
        marker = f"{os.sep}gpu_exporter{os.sep}"

        def synchronize(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if marker in sys._getframe(1).f_code.co_filename:
                self.library += 1
            return original(*args, **kwargs)

        torch.cuda.synchronize = synchronize

    def reset(self) -> None:
        self.calls = self.library = 0

    def counts(self) -> dict[str, int]:
        return {"library": self.library, "all": self.calls}


class Gpu:
    """The loop's GPU: cuda:0, or (``simulate``) a simulated device that does the loop's GPU work.

    Simulated: an :class:`~gpu_exporter.simulate.device.AsyncDevice` with ``torch.cuda`` installed over it,
    tensors on the CPU; with ``ops`` also an ops-mode device (busy inside torch operators) for a framework
    loop whose work is real CPU torch. :meth:`mark` tells the device what the CPU does (its truth).
    """

    def __init__(self, simulate: bool, uuid: str | None, ops: bool = False) -> None:
        import torch

        self.torch = torch
        self.simulate = simulate
        self.async_device: Any = None
        self.ops_device: Any = None
        if simulate:
            from gpu_exporter.simulate import torch_cuda
            from gpu_exporter.simulate.device import AsyncDevice, OpsDevice

            torch.set_num_threads(1)
            self.async_device = AsyncDevice(str(uuid))
            torch_cuda.install(self.async_device)
            if ops:
                self.ops_device = OpsDevice(str(uuid)).start()
            self.device = torch.device("cpu")
        else:
            self.device = torch.device("cuda:0")
            torch.cuda.set_device(0)
        self.syncs = SyncCounter(torch)

    @property
    def truth_device(self) -> Any:
        return self.ops_device or self.async_device

    def mark(self, what: str) -> None:
        if self.truth_device is not None:
            self.truth_device.doing(what)

    def decode(self, seconds: float, batch: int, features: int) -> tuple[Any, Any]:
        """A batch decoded on the CPU in ``seconds`` and copied to the GPU. On a real GPU the CPU works (Python)
        for that long; simulated, it sleeps (the variants share CI's few cores) and the device copies."""
        torch = self.torch
        x, y = torch.randn(batch, features), torch.randint(0, CLASSES, (batch,))
        if self.simulate:
            time.sleep(seconds)
            self.async_device.copy(0.0005)
            return x, y
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            pass
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def queue(self, plan: Plan) -> None:
        """Simulated: the step's GPU work, launched asynchronously (a real GPU got it from the model)."""
        if self.async_device is None:
            return
        for _ in range(plan.launches):  # issuing each kernel costs launch_cpu of CPU inside the device's launch,
            self.async_device.launch(plan.kernels / plan.launches, plan.launch_cpu)  # as torch's would on a real GPU

    def item(self, loss: Any) -> float:
        """``loss.item()``: waits for the queued kernels."""
        if self.async_device is not None:
            self.async_device.item()
        return float(loss.item())

    def truth(self, since: float) -> dict[str, float] | None:
        """The simulated device's own account as phase shares: each CPU activity's share of wall time is the
        GPU's idle time during it; ``compute`` is the rest. None on a real GPU."""
        device = self.truth_device
        if device is None:
            return None
        truth = device.truth(since=since)
        wall = truth["wall"]
        shares = {p: round(s / wall, 4) for p, s in truth["idle"].items() if p != "compute" and s / wall >= 0.0005}
        shares["compute"] = round(max(0.0, 1.0 - sum(shares.values())), 4)
        return shares

    def event_record_us(self) -> float | None:
        """Microseconds per ``torch.cuda.Event(enable_timing=True).record()`` on the real GPU (what each phase
        change costs the training thread there); None simulated."""
        if self.simulate:
            return None
        torch = self.torch
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2000)]
        t0 = time.perf_counter()
        for event in events:
            event.record()
        return round((time.perf_counter() - t0) / len(events) * 1e6, 2)

    def close(self) -> None:
        for device in (self.ops_device, self.async_device):
            if device is not None:
                device.close()


def build_model(torch: Any, features: int, width: int, depth: int, device: Any) -> Any:
    layers: list[Any] = [torch.nn.Linear(features, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, CLASSES))
    return torch.nn.Sequential(*layers).to(device)


def sizes(plan: Plan, simulate: bool) -> tuple[int, int, int]:
    """(batch, features, width): the plan's on a real GPU; small CPU ones simulated (an asynchronous device gets
    the step's GPU work from the loop; the ops-mode Lightning loop's is its CPU torch, calibrated)."""
    if simulate:
        return (256 if plan.kind == "lightning" else 32), 64, 256
    return plan.batch, 1024, plan.width


def calibrate(gpu: Gpu, plan: Plan, target: float | None = None) -> int:
    """Hidden layers that make a forward and backward take about ``target`` (default ``plan.kernels``) seconds.

    On a real GPU (timed with synchronize, before the run starts: not counted) or, for the ops-mode Lightning
    loop, on the CPU. A plain simulated loop needs none (its device gets ``plan.kernels`` per step)."""
    if plan.depth:
        return plan.depth
    torch = gpu.torch
    batch, features, width = sizes(plan, gpu.simulate)
    probe_depth = 4
    model = build_model(torch, features, width, probe_depth, gpu.device)
    x = torch.randn(batch, features, device=gpu.device)
    y = torch.randint(0, CLASSES, (batch,), device=gpu.device)
    wait = gpu.torch.cuda.synchronize if not gpu.simulate else (lambda: None)

    def once() -> None:
        torch.nn.functional.cross_entropy(model(x), y).backward()

    for _ in range(3):
        once()
    wait()
    t0, n = time.perf_counter(), 5
    for _ in range(n):
        once()
    wait()
    per_layer = (time.perf_counter() - t0) / n / (probe_depth + 1)
    return max(1, min(400, round((plan.kernels if target is None else target) / per_layer) - 1))


def _shares(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values()) or 1.0
    return {p: round(s / total, 4) for p, s in seconds.items() if s / total >= 0.0005}


def _finish(run: Any, gpu: Gpu, began: float) -> dict[str, Any]:
    """A run's own account at its end: phases by both clocks, synchronize calls, the device's truth."""
    truth = gpu.truth(began)
    gpu_clock = run._gpu is not None
    library = run.phase_seconds(finished=True)
    cpu = run.cpu_phase_seconds()
    steps = run.steps
    if not run.closed:
        run.close()
    return {"library_shares": _shares(library), "cpu_clock_shares": _shares(cpu), "gpu_truthful": gpu_clock,
            "synchronize": gpu.syncs.counts(), "steps": steps, "truth_shares": truth}


def plain_loop(variant: str, gpu: Gpu, url: str, uuid: str | None,
               runs: list[tuple[str, int, float]]) -> dict[str, Any]:
    """The README-shaped loop, once per (run name, sync_every, seconds) of ``runs``."""
    plan = PLANS[variant]
    depth = calibrate(gpu, plan) if not gpu.simulate else 1
    out: dict[str, Any] = {"depth": depth, "event_record_us": gpu.event_record_us()}
    for name, sync_every, seconds in runs:
        out[name] = plain_run(variant, gpu, url, uuid, depth, name, sync_every, seconds)
    return out


def plain_run(variant: str, gpu: Gpu, url: str, uuid: str | None, depth: int, name: str, sync_every: int,
              seconds: float) -> dict[str, Any]:
    """``run.data(batches)``: CPU decoding (or a batch already on the GPU); the step's kernels queued in
    ``compute``; ``loss.item()`` in ``metrics``."""
    from gpu_exporter import training

    torch = gpu.torch
    plan = PLANS[variant]
    batch, features, width = sizes(plan, gpu.simulate)
    model = build_model(torch, features, width, depth, gpu.device)
    if variant == "batch-of-2":  # a parameter at a time: more, smaller kernels
        optimizer: Any = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    resident = (torch.randn(batch, features, device=gpu.device), torch.randint(0, CLASSES, (batch,), device=gpu.device))

    def batches() -> Iterator[tuple[Any, Any]]:
        while True:
            gpu.mark("data")
            yield gpu.decode(plan.decode, batch, features) if plan.decode else resident

    run = training.start(name, url=url, uuid=uuid, push_interval=PUSH[gpu.simulate], sync_every=sync_every)
    began = time.monotonic()
    gpu.syncs.reset()
    compute, metrics = run.phase("compute"), run.phase("metrics")
    end = began + seconds
    try:
        for x, y in run.data(batches()):
            with compute:
                gpu.mark("compute")
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                gpu.queue(plan)
            with metrics:
                gpu.mark("metrics")
                gpu.item(loss)
            gpu.mark("other")
            run.step(samples=len(y))
            if time.monotonic() > end:
                break
    finally:
        result = _finish(run, gpu, began)
    return result


PUSH = {False: 1.0, True: 0.5}
"""Push interval of the loops' runs: real, simulated."""


def lightning_loop(gpu: Gpu, url: str, uuid: str | None, runs: list[tuple[str, int, float]]) -> dict[str, Any]:
    """A LightningModule under ``Trainer(callbacks=[GpuExporterCallback(...)])`` whose ``training_step`` computes
    a Python metric on ``.cpu()`` predictions every step."""
    torch = gpu.torch
    try:
        pl: Any = importlib.import_module("lightning.pytorch")
    except ImportError:
        pl = importlib.import_module("pytorch_lightning")
    from gpu_exporter.training.lightning import GpuExporterCallback
    from torch.utils.data import DataLoader, IterableDataset

    plan = PLANS["lightning"]
    batch, features, width = sizes(plan, gpu.simulate)
    depth = calibrate(gpu, plan)
    out: dict[str, Any] = {"depth": depth}

    class Batches(IterableDataset[tuple[Any, Any]]):
        def __iter__(self) -> Iterator[tuple[Any, Any]]:
            while True:
                gpu.mark("data")
                time.sleep(plan.decode)
                yield torch.randn(batch, features), torch.randint(0, CLASSES, (batch,))

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self, seconds: float) -> None:
            super().__init__()
            self.net = build_model(torch, features, width, depth, "cpu")
            self.seconds = seconds
            self.began = 0.0

        def on_train_start(self) -> None:
            self.began = time.monotonic()
            gpu.syncs.reset()

        def training_step(self, step_batch: Any, batch_idx: int) -> Any:
            gpu.mark("compute")
            x, y = step_batch
            logits = self.net(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            gpu.mark("metrics")
            predicted, actual = logits.argmax(1).cpu().tolist(), y.cpu().tolist()
            deadline = time.perf_counter() + plan.metric
            while time.perf_counter() < deadline:
                f1_macro(predicted, actual)
            gpu.mark("compute")  # backward and the optimizer's step follow
            return loss

        def on_train_batch_end(self, outputs: Any, step_batch: Any, batch_idx: int) -> None:
            gpu.mark("other")
            if time.monotonic() - self.began > self.seconds:
                self.trainer.should_stop = True

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    for name, sync_every, seconds in runs:
        callback = GpuExporterCallback(name, url=url, uuid=uuid, push_interval=PUSH[gpu.simulate],
                                       sync_every=sync_every)
        with tempfile.TemporaryDirectory() as folder:
            trainer = pl.Trainer(accelerator="cpu" if gpu.simulate else "gpu", devices=1, max_epochs=1,
                                 max_steps=1_000_000, logger=False, enable_progress_bar=False,
                                 enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                                 callbacks=[callback], default_root_dir=folder)
            module = Module(seconds)
            trainer.fit(module, DataLoader(Batches(), batch_size=None))
        out[name] = _finish(callback.run, gpu, module.began)
    return out


def ddp_loop(rank: int, gpu: Gpu, url: str, uuid: str | None, runs: list[tuple[str, int, float]], backend: str,
             port: int) -> dict[str, Any]:
    """One rank of a 2-rank ``DistributedDataParallel`` job on the one GPU; rank 1 decodes its batches slowly."""
    import torch.distributed as dist
    from gpu_exporter import training
    from torch.nn.parallel import DistributedDataParallel

    torch = gpu.torch
    plan = PLANS["ddp"]
    batch, features, width = sizes(plan, gpu.simulate)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    depth = [calibrate(gpu, plan) if rank == 0 and not gpu.simulate else 1]
    dist.broadcast_object_list(depth, src=0)  # rank 0 calibrated alone: both share the GPU
    out: dict[str, Any] = {"depth": depth[0], "backend": backend}
    decode = plan.slow_decode if rank == 1 else plan.decode
    flag_device = gpu.device if backend == "nccl" else torch.device("cpu")
    for name, sync_every, seconds in runs:
        module = build_model(torch, features, width, int(depth[0]), gpu.device)
        model = DistributedDataParallel(module, device_ids=None if gpu.simulate else [0])
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        run = training.start(name, url=url, uuid=uuid, rank=rank, world_size=2, push_interval=PUSH[gpu.simulate],
                             sync_every=sync_every)
        training.watch_distributed(run, ddp_model=model)

        def batches() -> Iterator[tuple[Any, Any]]:
            while True:
                gpu.mark("data")
                yield gpu.decode(decode, batch, features)

        began = time.monotonic()
        gpu.syncs.reset()
        compute, metrics = run.phase("compute"), run.phase("metrics")
        go = torch.ones(1, device=flag_device)
        end = began + seconds
        try:
            for x, y in run.data(batches()):
                with compute:
                    gpu.mark("compute")
                    gpu.queue(plan)  # simulated: forward and backward kernels, queued before the all-reduce
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    optimizer.zero_grad()
                    loss.backward()  # DDP's gradient all-reduce: communication (the library's comm hook)
                    optimizer.step()
                with metrics:
                    gpu.mark("metrics")
                    gpu.item(loss)
                gpu.mark("other")
                run.step(samples=len(y))
                go.fill_(1.0 if time.monotonic() < end else 0.0)
                dist.all_reduce(go, op=dist.ReduceOp.MIN)  # both ranks stop at the same step
                if go.item() == 0.0:
                    break
        finally:
            out[name] = _finish(run, gpu, began)
            # The marks cannot see the wait inside backward (DDP's hook, the library's): no truth to show.
            out[name]["truth_shares"] = None
        dist.barrier()
    dist.destroy_process_group()
    return out


def probe_nccl(rank: int, port: int) -> None:
    """Rank ``rank`` of a 2-rank NCCL all-reduce on GPU 0 (exits non-zero when NCCL refuses two ranks on one GPU)."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.ones(4, device="cuda:0")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert x.sum().item() == 8.0
    dist.destroy_process_group()
