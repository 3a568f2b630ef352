"""The real-GPU check: the same training loops as the cause tests, on a real CUDA GPU, judged by the exporter.

On a machine with an NVIDIA GPU, ``python -m bench.real_gpu`` (from a checkout, with torch built for CUDA)
starts ``gpu-exporter`` on the real driver and runs, one after the other on GPU 0, these loops, each
instrumented with ``gpu_exporter.training``:

==============  ======================================================================  =====================
variant         per step                                                                expected
==============  ======================================================================  =====================
``input-bound`` the README's loop: CPU decoding in ``data`` (0.11 s), kernels queued    input-bound (M1)
                in ``compute`` (0.04 s of GPU time), ``loss.item()`` in ``metrics``
``healthy``     GPU-bound: 0.3 s of kernels on a batch already on the GPU, a            healthy
                ``loss.item()`` every step
``batch-of-2``  batch 2 through a small, deep MLP and a foreach-less Adam: many tiny    batch too small (M3)
                kernels, each cheaper to run than to issue
``lightning``   ``Trainer(callbacks=[GpuExporterCallback(...)])``; ``training_step``    metrics-bound (M2)
                computes a macro F1 in Python (0.1 s) on ``.cpu()`` predictions
``ddp``         2 processes on the one GPU (NCCL if it accepts two ranks on one         rank 0: straggler
                device, else gloo), ``DistributedDataParallel``; rank 1 decodes its     (ST); rank 1:
                batches slowly (0.2 s), rank 0 waits for it in the gradient all-reduce  input-bound (M1)
==============  ======================================================================  =====================

Each variant runs twice in one process: first with the library's defaults (GPU-truthful phases: a CUDA event
at every phase change, never a synchronize) for ``--seconds``, then as run ``<variant>-sync`` with
``sync_every=1`` (the diagnostic: synchronize at every phase change) for ``--sync-seconds``. For each run the
check records the phase shares the exporter got (``gpu-exporter diagnose --url ... --run NAME --window W``), the
diagnose verdict, the GPU's utilization from the exporter's busy counter (``gpu_busy_seconds_total`` over the
window) beside nvidia-smi's ``utilization.gpu`` sampled every second in the same window, and how often
``torch.cuda.synchronize`` was called during the run (the loop wraps it with a counter; ``library`` counts the
calls from gpu_exporter's own code). The loop itself adds its whole-run phases by both clocks (GPU-truthful
and the CPU's). Lightning is skipped when it is not installed. Everything goes to ``--output`` (JSON) and,
with ``--markdown``, to a table for docs/real-gpu.md. Exit status: 0 when every default run got its expected
verdict and the library never synchronized on the default path, 1 otherwise, 2 without nvidia-smi.

``--simulate`` (what CI runs, tests/test_real_gpu_bench.py) runs the same loops and the same library code
paths with no GPU, all variants at once: the exporter on bench/real_gpu.yaml, whose GPUs are ``device: true``
(busy exactly while the loop's own simulated device works, read through ``$GPU_SIM_DEVICE_DIR``). The plain
loops and DDP run on an asynchronous simulated GPU (``gpu_exporter.simulate.device.AsyncDevice`` with
``gpu_exporter.simulate.torch_cuda.install``, so the library takes its CUDA path: events, synchronize): the
loop hands the device its GPU work (``launch``, ``.item()``), and DDP runs real ``DistributedDataParallel``
over gloo on the CPU. Lightning runs on an ops-mode device (busy while the job is inside torch operators)
with the same ``torch.cuda`` stand-in installed, so the library's events run there too. No verdict comes
from what a loop reports about itself; the simulated devices also report their own truth (idle seconds per
thing the CPU did), which the output shows beside the library's phases.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = Path(__file__).with_name("real_gpu.yaml")
VARIANTS = ("input-bound", "healthy", "batch-of-2", "lightning", "ddp")
EXPECTED: dict[str, dict[str, str]] = {
    "input-bound": {"0": "input_bound"},
    "healthy": {"0": "healthy"},
    "batch-of-2": {"0": "batch_too_small"},
    "lightning": {"0": "metrics_bound"},
    "ddp": {"0": "straggler", "1": "input_bound"},
}
SIM_UUID = "GPU-bench-{variant}"
"""The simulated GPU of each variant in --simulate (bench/real_gpu.yaml)."""
CLASSES = 16
STANDARD = ("data", "compute", "metrics", "checkpoint", "communication", "other")
SETTLE = 2.0
"""Seconds after a run's first snapshot before its window starts."""


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
        for _ in range(plan.launches):
            if plan.launch_cpu:
                time.sleep(plan.launch_cpu)  # issuing a kernel: CPU time that is not GPU time
            self.async_device.launch(plan.kernels / plan.launches)

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


def loop_main(args: argparse.Namespace) -> int:
    """A loop process: the variant's default run, then its sync_every=1 run; its own account to ``--out``."""
    variant = args.loop
    runs = [(variant, 0, args.seconds), (f"{variant}-sync", 1, args.sync_seconds)]
    uuid = SIM_UUID.format(variant=variant) if args.simulate else None
    gpu = Gpu(args.simulate, uuid, ops=variant == "lightning")
    try:
        if variant == "lightning":
            out = lightning_loop(gpu, args.url, uuid, runs)
        elif variant == "ddp":
            out = ddp_loop(args.rank, gpu, args.url, uuid, runs, args.backend, args.port)
        else:
            out = plain_loop(variant, gpu, args.url, uuid, runs)
    finally:
        gpu.close()
    Path(args.out).write_text(json.dumps(out))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # all is written: skip torch's teardown (seconds on a loaded machine)


# --- the check: exporter, loops, diagnose, nvidia-smi -----------------------------------------------------


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "exporter") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def exporter_busy(url: str) -> dict[str, float]:
    """uuid -> ``gpu_busy_seconds_total``, from one scrape of the exporter."""
    from gpu_exporter import catalog
    from prometheus_client.parser import text_string_to_metric_families

    busy: dict[str, float] = {}
    for family in text_string_to_metric_families(_get(url + "/metrics")):
        for s in family.samples:
            if s.name == catalog.GPU_BUSY_SECONDS_TOTAL.name and "uuid" in s.labels:
                busy[s.labels["uuid"]] = s.value
    return busy


def nvidia_smi_sample() -> dict[str, dict[str, float]]:
    """uuid -> utilization (0-1) and memory used (MiB), from nvidia-smi."""
    query = ["nvidia-smi", "--query-gpu=uuid,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
    out = subprocess.run(query, capture_output=True, text=True, check=True, timeout=10).stdout
    gpus: dict[str, dict[str, float]] = {}
    for line in out.strip().splitlines():
        uuid, util, used = (f.strip() for f in line.split(","))
        with contextlib.suppress(ValueError):
            gpus[uuid] = {"utilization": float(util) / 100, "memory_used_mib": float(used)}
    return gpus


def _diagnose(url: str, run: str, window: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpu_exporter", "diagnose", "--url", url, "--window",
                             f"{window:g}", "--run", run, "--output", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def top_cause(causes: list[dict[str, Any]]) -> str:
    """The first of a run's causes in the verdict's order (the allocator first, then the biggest)."""
    if not causes:
        return "no cause"
    return str(min(causes, key=lambda c: (c["code"] != "M4", -c["value"]))["cause"])


def measure(url: str, run: str, window: float, simulate: bool) -> dict[str, Any]:
    """``diagnose --run RUN`` over ``window``; meanwhile every second the exporter's busy counter beside nvidia-smi."""
    proc = _diagnose(url, run, window)
    rows: list[dict[str, Any]] = []
    before, t0 = exporter_busy(url), time.monotonic()
    while proc.poll() is None:
        time.sleep(1.0)
        now, t1 = exporter_busy(url), time.monotonic()
        sample: dict[str, dict[str, float]] = {}
        if not simulate:
            with contextlib.suppress(OSError, subprocess.SubprocessError):  # one missed reading is not a failure
                sample = nvidia_smi_sample()
        rows.append({"t": round(t1, 1), "exporter": {u: round((b - before.get(u, b)) / (t1 - t0), 3)
                                                     for u, b in now.items()},
                     "nvidia_smi": {u: s["utilization"] for u, s in sample.items()}})
        before, t0 = now, t1
    stdout, stderr = proc.communicate()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"diagnose --run {run} failed: {stderr.strip()[-2000:]}")
    doc = json.loads(stdout)
    if len(doc["gpus"]) != 1:
        raise RuntimeError(f"diagnose --run {run}: expected one GPU, got {len(doc['gpus'])}")
    (gpu,) = doc["gpus"]
    uuid = gpu["uuid"]
    smi: list[float] = [r["nvidia_smi"][uuid] for r in rows if uuid in r["nvidia_smi"]]
    return {
        "uuid": uuid, "verdict": gpu["verdict"]["verdict"], "title": gpu["verdict"]["title"],
        "reason": gpu["verdict"]["reason"], "projected_utilization": gpu["verdict"]["projected"],
        "utilization": gpu["utilization"], "memory_used_ratio": gpu["memory_used_ratio"],
        "nvidia_smi_utilization": round(sum(smi) / len(smi), 3) if smi else None,
        "ranks": {r["rank"]: {"shares": {p: round(s, 4) for p, s in r["shares"].items() if s >= 0.0005},
                              "live": r["live"], "cause": top_cause(r["causes"]),
                              "causes": [c["cause"] for c in r["causes"]]}
                  for r in gpu["runs"] if r["run"] == run},
        "per_second": [{"t": r["t"], "exporter": r["exporter"].get(uuid), "nvidia_smi": r["nvidia_smi"].get(uuid)}
                       for r in rows],
    }


def _wait_for_run(url: str, run: str, procs: list[subprocess.Popen[str]], timeout: float) -> None:
    """Until run ``run`` has pushed its first snapshot (torch and CUDA take a while to start)."""
    deadline = time.monotonic() + timeout
    while f'run="{run}"' not in _get(url + "/metrics"):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"run {run} never reported to the exporter")
        time.sleep(0.25)


def _wait_listening(port: int, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited with {proc.returncode}: {proc.communicate()[1][-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the exporter did not listen within 30 s")


def choose_backend(requested: str, simulate: bool, workdir: Path) -> tuple[str, str]:
    """(backend, why): NCCL when it runs 2 ranks on the one GPU, else gloo; simulated always gloo (CPU)."""
    if simulate:
        return "gloo", "simulated: gloo on the CPU"
    if requested != "auto":
        return requested, f"--ddp-backend {requested}"
    port = _free_port()
    logs = [workdir / f"nccl-probe-{rank}.log" for rank in (0, 1)]
    procs = []
    for rank, log in enumerate(logs):
        with log.open("w") as f:
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.real_gpu", "--probe-nccl", "--rank", str(rank),
                                           "--port", str(port)], cwd=ROOT, env=_env(), stdout=f,
                                          stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):  # one rank failed: the other waits for it in vain
            deadline = min(deadline, time.monotonic() + 5)
        time.sleep(0.2)
    errors: list[str] = []
    for proc, log in zip(procs, logs, strict=True):
        timed_out = proc.poll() is None
        if timed_out:
            proc.kill()
        proc.wait()
        if proc.returncode != 0:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            lines += ["(no answer in 60 s: stopped)"] if timed_out else []
            errors.append(next((line for line in reversed(lines) if "rror" in line), lines[-1] if lines else "?"))
    if not errors:
        return "nccl", "NCCL ran a 2-rank all-reduce on the one GPU"
    return "gloo", f"NCCL did not run 2 ranks on the one GPU: {errors[0].strip()[:300]}"


def run_variant(variant: str, url: str, args: argparse.Namespace, workdir: Path, backend: str,
                env: dict[str, str]) -> dict[str, Any]:
    """Start the variant's loop process(es), measure its two runs, collect the loops' own accounts."""
    plan = PLANS[variant]
    ranks = (0, 1) if plan.kind == "ddp" else (0,)
    port = _free_port()
    outs = {rank: workdir / f"{variant}-{rank}.json" for rank in ranks}
    logs = {rank: workdir / f"{variant}-{rank}.log" for rank in ranks}
    procs: list[subprocess.Popen[str]] = []
    for rank in ranks:
        cmd = [sys.executable, "-m", "bench.real_gpu", "--loop", variant, "--url", url, "--seconds", str(args.seconds),
               "--sync-seconds", str(args.sync_seconds), "--out", str(outs[rank]), "--rank", str(rank), "--port",
               str(port), "--backend", backend, *(["--simulate"] if args.simulate else [])]
        with logs[rank].open("w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True))
    result: dict[str, Any] = {"kind": plan.kind, "expected": EXPECTED[variant], "timeline": {}}
    launched = time.monotonic()
    try:
        for mode, run, window in (("default", variant, args.window), ("sync_every_1", f"{variant}-sync",
                                                                      args.sync_window)):
            _wait_for_run(url, run, procs, timeout=180)
            result["timeline"][f"{mode}_reported_s"] = round(time.monotonic() - launched, 1)
            time.sleep(SETTLE)
            result[mode] = measure(url, run, window, args.simulate)
            result["timeline"][f"{mode}_measured_s"] = round(time.monotonic() - launched, 1)
        for proc in procs:
            proc.wait(timeout=args.sync_seconds + 120)
        result["timeline"]["exited_s"] = round(time.monotonic() - launched, 1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in zip(ranks, procs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"loop {variant} rank {rank} failed: {logs[rank].read_text()[-3000:]}")
    for rank in ranks:
        own = json.loads(outs[rank].read_text())
        result.setdefault("loop", {})[str(rank)] = {k: v for k, v in own.items() if not k.startswith(variant)}
        for mode, run in (("default", variant), ("sync_every_1", f"{variant}-sync")):
            result[mode]["ranks"].setdefault(str(rank), {"shares": {}, "live": False, "cause": "not seen",
                                                         "causes": []})["own"] = own[run]
    return result


def _verdict(variant: str, mode: dict[str, Any], rank: str) -> str:
    """The variant's verdict: the GPU's for a single-rank loop, the rank's own first cause for DDP."""
    return str(mode["ranks"][rank]["cause"] if PLANS[variant].kind == "ddp" else mode["verdict"])


def _fmt_shares(shares: dict[str, float] | None) -> str:
    if not shares:
        return "-"
    return ", ".join(f"{p} {s * 100:.0f}%" for p, s in sorted(shares.items(), key=lambda kv: -kv[1]) if s >= 0.01)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def rows(results: dict[str, Any]) -> list[dict[str, str]]:
    """One row per variant and rank: what the table shows."""
    out: list[dict[str, str]] = []
    for variant, r in results["variants"].items():
        if "skipped" in r:
            out.append({"variant": variant, "rank": "-", "expected": "-", "default": f"skipped: {r['skipped']}"})
            continue
        for rank, expected in r["expected"].items():
            d, s = r["default"], r["sync_every_1"]
            own_d, own_s = d["ranks"][rank].get("own", {}), s["ranks"][rank].get("own", {})
            syncs = own_d.get("synchronize", {})
            out.append({
                "variant": variant, "rank": rank, "expected": expected,
                "default": _verdict(variant, d, rank), "sync1": _verdict(variant, s, rank),
                "util": _pct(d["utilization"]), "smi": _pct(d["nvidia_smi_utilization"]),
                "util_sync1": _pct(s["utilization"]), "smi_sync1": _pct(s["nvidia_smi_utilization"]),
                "syncs": f"{syncs.get('library', '?')}/{syncs.get('all', '?')}",
                "syncs_sync1": f"{own_s.get('synchronize', {}).get('library', '?')}",
                "shares": _fmt_shares(d["ranks"][rank]["shares"]),
                "shares_sync1": _fmt_shares(s["ranks"][rank]["shares"]),
                "cpu_clock": _fmt_shares(own_d.get("cpu_clock_shares")),
                "truth": _fmt_shares(own_d.get("truth_shares")),
            })
    return out


def print_table(results: dict[str, Any]) -> None:
    table = rows(results)
    print(f"{'variant':<12} {'rank':<4} {'expected':<16} {'default':<16} {'sync_every=1':<16} {'util':>5} "
          f"{'smi':>5} {'sync':>5}  default shares (GPU-truthful)")
    for r in table:
        if "util" not in r:
            print(f"{r['variant']:<12} {r['rank']:<4} {r['default']}")
            continue
        print(f"{r['variant']:<12} {r['rank']:<4} {r['expected']:<16} {r['default']:<16} {r['sync1']:<16} "
              f"{r['util']:>5} {r['smi']:>5} {r['syncs']:>5}  {r['shares']}")
    print()
    print(f"{'variant':<12} {'rank':<4} {'shares with sync_every=1':<44} {'sync':>5}  {'CPU clock (default run)':<44} "
          "device truth (default run)")
    for r in table:
        if "util" in r:
            print(f"{r['variant']:<12} {r['rank']:<4} {r['shares_sync1']:<44} {r['syncs_sync1']:>5}  "
                  f"{r['cpu_clock']:<44} {r['truth']}")
    events = [own["event_record_us"] for r in results["variants"].values() for own in r.get("loop", {}).values()
              if own.get("event_record_us") is not None]
    if events:
        print(f"\ntorch.cuda.Event.record(): {min(events):.1f}-{max(events):.1f} µs per phase change")


def markdown(results: dict[str, Any]) -> str:
    """The results as a markdown table for docs/real-gpu.md."""
    head = ("| variant | rank | expected | default (GPU-truthful) | sync_every=1 | utilization: exporter / nvidia-smi "
            "(sync_every=1) | synchronize on the default path (library/all) | default shares | sync_every=1 shares "
            "| CPU clock shares | device truth |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows(results):
        if "util" not in r:
            lines.append(f"| {r['variant']} | - | - | {r['default']} | | | | | | | |")
            continue
        lines.append(f"| {r['variant']} | {r['rank']} | {r['expected']} | {r['default']} | {r['sync1']} | "
                     f"{r['util']} / {r['smi']} ({r['util_sync1']} / {r['smi_sync1']}) | {r['syncs']} | "
                     f"{r['shares']} | {r['shares_sync1']} | {r['cpu_clock']} | {r['truth']} |")
    return head + "\n".join(lines) + "\n"


def passed(results: dict[str, Any]) -> bool:
    """Every default run got its expected verdict, and the library never synchronized on the default path."""
    ok = True
    for variant, r in results["variants"].items():
        if "skipped" in r:
            continue
        for rank, expected in r["expected"].items():
            own = r["default"]["ranks"][rank].get("own", {})
            ok = ok and _verdict(variant, r["default"], rank) == expected
            ok = ok and own.get("synchronize", {}).get("library", 1) == 0 and bool(own.get("gpu_truthful"))
    return ok


def _lightning_missing() -> str | None:
    if importlib.util.find_spec("lightning") or importlib.util.find_spec("pytorch_lightning"):
        return None
    return "lightning is not installed (pip install lightning)"


def _environment(simulate: bool) -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    with contextlib.suppress(Exception):
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
    for package in ("lightning", "pytorch_lightning"):
        with contextlib.suppress(Exception):
            env[package] = importlib.import_module(package).__version__
    if not simulate:
        with contextlib.suppress(Exception):
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_gpu", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--simulate", action="store_true", help="no GPU: simulated GPUs doing the loops' work (CI)")
    parser.add_argument("--seconds", type=float, default=20.0, help="each variant's default run (default 20)")
    parser.add_argument("--sync-seconds", type=float, default=12.0, help="each variant's sync_every=1 run (default 12)")
    parser.add_argument("--window", type=float, help="diagnose's window in the default run (default: seconds - 8)")
    parser.add_argument("--sync-window", type=float, help="... in the sync_every=1 run (default: sync-seconds - 7)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated (default {','.join(VARIANTS)})")
    parser.add_argument("--ddp-backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="auto: NCCL if it runs 2 ranks on one GPU, else gloo")
    parser.add_argument("--output", type=Path, default=Path("real-gpu-results.json"))
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    parser.add_argument("--logs", type=Path, help="keep the loops' logs here (default: a temporary folder, removed "
                                                  "after a passing check)")
    parser.add_argument("--loop", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--probe-nccl", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="gloo", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_nccl:
        probe_nccl(args.rank, args.port)
        return 0
    if args.loop:
        return loop_main(args)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"error: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    args.window = args.seconds - 8 if args.window is None else args.window
    args.sync_window = args.sync_seconds - 7 if args.sync_window is None else args.sync_window
    if args.window < 2 or args.window + 6 > args.seconds or args.sync_window < 2 or \
            args.sync_window + 6 > args.sync_seconds:
        print("error: each window must be at least 2 s and 6 s shorter than its run (--seconds/--window, "
              "--sync-seconds/--sync-window)", file=sys.stderr)
        return 2
    if not args.simulate and shutil.which("nvidia-smi") is None:
        print("error: nvidia-smi not found: run on a machine with an NVIDIA GPU, or use --simulate", file=sys.stderr)
        return 2
    return check(args, variants)


def check(args: argparse.Namespace, variants: list[str]) -> int:
    started = time.monotonic()
    workdir = args.logs or Path(tempfile.mkdtemp(prefix="real-gpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = _env({"GPU_SIM_DEVICE_DIR": str(workdir / "channel")} if args.simulate else None)
    backend, why = choose_backend(args.ddp_backend, args.simulate, workdir) if "ddp" in variants else ("", "")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "gpu_exporter", "--web.listen-address", f"127.0.0.1:{port}", "--poll-interval",
             "0.2", *(["--simulate", str(SCENARIO)] if args.simulate else [])]
    exporter = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    results: dict[str, Any] = {"mode": "simulated" if args.simulate else "real",
                               "environment": _environment(args.simulate), "seconds": args.seconds,
                               "sync_seconds": args.sync_seconds, "window": args.window,
                               "sync_window": args.sync_window, "variants": {}}
    if backend:
        results["ddp_backend"] = {"backend": backend, "why": why}
    found: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}

    def one(variant: str) -> None:
        try:
            found[variant] = run_variant(variant, url, args, workdir, backend, env)
        except Exception as err:  # one variant's failure is reported, the others still run
            errors[variant] = f"{type(err).__name__}: {err}"

    try:
        _wait_listening(port, exporter)
        todo = []
        for variant in variants:
            missing = _lightning_missing() if variant == "lightning" else None
            if missing:
                found[variant] = {"skipped": missing}
            else:
                todo.append(variant)
        if args.simulate:  # each variant on its own simulated GPU: all at once
            threads = [threading.Thread(target=one, args=(v,)) for v in todo]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:  # one GPU: one after the other
            for variant in todo:
                one(variant)
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    results["variants"] = {v: found[v] for v in variants if v in found}
    results["errors"] = errors
    results["passed"] = not errors and passed(results)
    results["wall_seconds"] = round(time.monotonic() - started, 1)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    if backend:
        print(f"ddp backend: {backend} ({why})")
    print_table(results)
    for variant, error in errors.items():
        print(f"error: {variant}: {error}", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(markdown(results))
    print(f"results: {args.output} ({results['wall_seconds']:.0f} s)")
    if results["passed"] and args.logs is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs: {workdir}")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    try:
        import gpu_exporter  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "exporter"))
    sys.exit(main())
