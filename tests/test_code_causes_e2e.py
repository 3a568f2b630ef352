"""Host work inside compute, named by function: a real CPU PyTorch loop on an ops-mode simulated GPU, one exporter.

The loop reports its phases with gpu_exporter.training; inside its ``compute`` block it augments each batch on the
host (:func:`augment`: numpy and a Python loop) before the model's forward, backward and step. The simulated GPU
(tests/scenarios/code-causes.yaml, ``device: true``) is busy exactly while the loop's thread is inside torch
operators, so the augmentation leaves it idle inside compute, which the phases alone call compute. The library's
stack sampler (training/sampler.py) counts that time as the job's own code; ``diagnose --url`` must name host work
(HW) with the function and its line, not launch overhead (M3) or no cause.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gpu_exporter import training
from gpu_exporter.simulate.device import OpsDevice
from servers import http_get, run_exporter, wait_until
from test_query import run_cli

pytestmark = pytest.mark.slow  # end-to-end: a real exporter process and a torch loop

SCENARIO = Path(__file__).parent / "scenarios" / "code-causes.yaml"
UUID = "GPU-code-host-work"


def augment(x: torch.Tensor) -> torch.Tensor:
    """A host-side augmentation inside the step: a numpy flip and noise, then a Python pass over the rows."""
    a = np.ascontiguousarray(x.numpy()[:, ::-1]) + np.random.default_rng(0).normal(0, 0.01, x.shape)
    scale = 0.0
    for row in a[:, :160]:
        for value in row:
            scale += float(value) * 1e-9
    return torch.from_numpy(a.astype(np.float32)) * (1.0 + scale)


def train(url: str, stop: threading.Event, channel: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    device = OpsDevice(UUID, channel).start()  # this thread's operators only
    run = training.start("augment-in-step", url=url, uuid=UUID, push_interval=0.2)
    compute, data = run.phase("compute"), run.phase("data")
    try:
        while not stop.is_set():
            with data:
                x, y = torch.randn(256, 64), torch.randint(0, 4, (256,))
            with compute:
                x = augment(x)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
                optimizer.step()
            run.step(samples=len(y))
    finally:
        run.close()
        device.close()


def test_host_work_inside_compute_is_named_by_function() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as channel, \
            run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.2"],
                         env={"GPU_SIM_DEVICE_DIR": channel}) as url:
        stop = threading.Event()
        loop = threading.Thread(target=train, args=(url, stop, channel))
        loop.start()
        try:
            wait_until(lambda: 'gpu_training_host_function_seconds_total{' in http_get(url + "/metrics"), 30,
                       what="the loop's sampled host function")
            time.sleep(2.0)
            result = run_cli("diagnose", "--url", url, "--window", "6", "--output", "json")
        finally:
            stop.set()
            loop.join(timeout=30)
    assert result.returncode == 1, result.stderr
    (gpu,) = json.loads(result.stdout)["gpus"]
    verdict, (run,) = gpu["verdict"], gpu["runs"]
    print(json.dumps(verdict), json.dumps(run["causes"]))  # the text a job gets, in the test's log
    assert verdict["verdict"] == "host_work", (verdict, run)
    line = augment.__code__.co_firstlineno
    assert f"test_code_causes_e2e.py:{line} `augment()` takes" in verdict["reason"], verdict
    assert run["shares"]["compute"] > 0.6  # the phases alone call it compute ...
    assert gpu["utilization"] < 0.85  # ... while the GPU idles below target
    codes = [c["code"] for c in run["causes"]]
    assert codes[0] == "HW" and "M3" not in codes, run["causes"]
