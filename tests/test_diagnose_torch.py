"""``gpu-exporter diagnose`` on real (CPU) PyTorch training loops instrumented with gpu_exporter.training.

Two loops run side by side (one thread each), each on its own ops-mode simulated GPU
(tests/scenarios/diagnose-torch.yaml, ``device: true``): busy exactly while the loop's thread is inside torch
operators, whatever the loop reports. One has an injected slow data loader, one computes an F1 score in Python
after every step. diagnose must call the first input-bound (M1) and the second metrics-bound (M2).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from cause_loops import f1_macro
from gpu_exporter import training
from gpu_exporter.simulate.device import OpsDevice
from test_query import run_cli
from torch.utils.data import DataLoader, Dataset

from testbed import http_get, run_exporter, wait_until

pytestmark = pytest.mark.slow  # end-to-end: real processes

SCENARIO = Path(__file__).parent / "scenarios" / "diagnose-torch.yaml"
FEATURES, CLASSES = 64, 4


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples, a few made once (making them is CPU work, not the GPU's); ``delay`` seconds per sample stand
    in for reading and decoding from slow storage."""

    def __init__(self, size: int, delay: float) -> None:
        self.size, self.delay = size, delay
        self.samples = [(torch.randn(FEATURES), torch.tensor(i % CLASSES)) for i in range(64)]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return self.samples[index % len(self.samples)]


def train(url: str, name: str, uuid: str, loader_delay: float, metric_repeats: int, stop: threading.Event,
          channel: str) -> None:
    """A small classifier trained until ``stop``; every phase reported through gpu_exporter.training. The thread's
    torch operators make simulated GPU ``uuid`` busy (an ops-mode device writing to ``channel``)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(100_000, loader_delay), batch_size=16)
    device = OpsDevice(uuid, channel).start()  # this thread's operators only
    history: list[tuple[list[int], list[int]]] = []
    run = training.start(name, url=url, uuid=uuid, push_interval=0.2)
    try:
        for x, y in run.data(loader):
            with run.phase("compute"):
                optimizer.zero_grad()
                out = model(x)
                torch.nn.functional.cross_entropy(out, y).backward()  # type: ignore[no-untyped-call]
                optimizer.step()
            with run.phase("metrics"):
                history.append((out.argmax(1).tolist(), y.tolist()))
                recent = history[-metric_repeats:] if metric_repeats else []
                f1_macro([p for h in recent for p in h[0]], [a for h in recent for a in h[1]])
            run.step(samples=len(y))
            if stop.is_set():
                break
    finally:
        run.close()
        device.close()


def test_slow_loader_is_input_bound_and_heavy_metrics_are_metrics_bound() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as channel, \
            run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.2"],
                         env={"GPU_SIM_DEVICE_DIR": channel}) as url:
        stop = threading.Event()
        loops = [threading.Thread(target=train, args=(url, "slow-loader", "GPU-torch-slow-loader", 0.002, 0, stop,
                                                      channel)),
                 threading.Thread(target=train, args=(url, "heavy-metrics", "GPU-torch-heavy-metrics", 0.0, 400, stop,
                                                      channel))]
        for loop in loops:
            loop.start()
        try:
            wait_until(lambda: http_get(url + "/metrics").count("gpu_training_batch_size{") == 2, 20,
                       what="both loops to report")
            time.sleep(2.0)  # let the metrics history grow to its steady size
            result = run_cli("diagnose", "--url", url, "--window", "4", "--output", "json")
        finally:
            stop.set()
            for loop in loops:
                loop.join(timeout=30)
    assert result.returncode == 1, result.stderr
    gpus = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
    slow, heavy = gpus["GPU-torch-slow-loader"], gpus["GPU-torch-heavy-metrics"]
    assert slow["verdict"]["verdict"] == "input_bound", slow
    assert heavy["verdict"]["verdict"] == "metrics_bound", heavy
    assert slow["runs"][0]["run"] == "slow-loader" and slow["runs"][0]["shares"]["data"] > 0.5
    assert heavy["runs"][0]["shares"]["metrics"] > 0.4
    # the simulated GPUs are busy only inside the loops' torch operators, so both are below target
    assert slow["utilization"] < 0.3 and heavy["utilization"] < 0.3
