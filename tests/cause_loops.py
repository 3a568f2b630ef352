"""Real CPU PyTorch training loops with controlled phase shares, for tests/test_report.py,
tests/test_remedies_e2e.py and tests/test_sampling.py.

Each loop is instrumented with gpu_exporter.training and spends its step in wall-clock time boxes
around real work: a data loader that waits like slow storage (once per batch), a training step, an
F1 score computed in Python, a checkpoint written with torch.save. The shares are therefore what
PLANS sets, even on a loaded machine. Run one loop per process (no shared GIL)::

    GPU_SIM_DEVICE_DIR=/tmp/ch python tests/cause_loops.py metrics40 http://127.0.0.1:9445 /tmp/ckpt.pt 60 [timers.json]

With ``$GPU_SIM_DEVICE_DIR`` set the loop runs on an ops-mode simulated GPU (gpu_exporter.simulate.device.OpsDevice,
the scenario's ``device: true`` GPU of the same UUID): busy exactly while the loop is inside torch operators, idle
while it waits for data, computes the F1 score in Python or pickles a checkpoint, whatever the library reports.
The model and batch are sized so that the training step is mostly operator time (about 90% busy in ``compute``),
except ``batch2``'s batch of 2, whose step is mostly Python around small operators (launch-bound, M3).

With a fifth argument the loop writes its own timers there (perf_counter around the whole run, from
before ``training.start`` to after ``run.close()``, and around each phase; ``data`` is the wait for
each batch), for tests that check what was recorded (tests/test_report.py); on a simulated GPU also
``device``, the device's own account of the same span (gpu_exporter.simulate.device.SimDevice.truth:
``wall``, ``busy``, and the GPU's idle seconds in each phase the loop marked).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

FEATURES, HIDDEN, CLASSES, BATCH = 64, 2048, 4, 1024
"""The model (FEATURES -> HIDDEN -> CLASSES) and the batch of every loop but ``batch2``: large enough that a
step's operators, not the Python around them, take its time on an ops-mode GPU."""

# loop -> (batch size, seconds per step in data, compute, metrics, checkpoint)
PLANS: dict[str, tuple[int, float, float, float, float]] = {
    "metrics40": (BATCH, 0.01, 0.105, 0.135, 0.0),
    "mixed": (BATCH, 0.13, 0.04, 0.07, 0.0),
    "checkpoint": (BATCH, 0.01, 0.03, 0.0, 0.21),
    "batch2": (2, 0.02, 0.23, 0.0, 0.0),
    "healthy": (BATCH, 0.005, 0.6, 0.0, 0.0),
    "hover30": (BATCH, 0.12, 0.08, 0.0, 0.0),
}
METRIC_PREDICTIONS = 256
"""The F1 score reads the latest this many predictions (a cost that does not grow with the batch)."""
# loop -> (seconds between switches, data seconds per step after a switch): the loader alternates
# between its PLANS time and this one, so the GPU's utilization swings around the 30% line
# (compute share 0.40 / 0.22: about 35% / 19% busy on an ops-mode GPU) while the loop stays input-bound.
WOBBLE: dict[str, tuple[float, float]] = {"hover30": (3.5, 0.284)}


def time_box(seconds: float, work: Callable[[], object]) -> None:
    """Do ``work`` at least once, and again while doing it once more (as long as the last time) ends nearer
    ``seconds`` than stopping now: the box is off by at most half a ``work`` (a training step of the large model
    takes a good part of a short box).

    Never sleeps: a sleep inside a phase would be that phase by the loop's own timers but not by its Python
    stack (tests/test_sampling.py compares the two), and waking up late on a busy machine stretches it."""
    now = time.perf_counter()
    deadline = now + seconds
    while True:
        t0 = now
        work()
        now = time.perf_counter()
        if now + (now - t0) / 2 >= deadline:
            return


def f1_macro(predicted: list[int], actual: list[int]) -> float:
    """Macro F1 in plain Python, the per-step metric that keeps a GPU waiting."""
    scores = []
    for c in range(CLASSES):
        tp = sum(p == c and a == c for p, a in zip(predicted, actual, strict=True))
        fp = sum(p == c and a != c for p, a in zip(predicted, actual, strict=True))
        fn = sum(p != c and a == c for p, a in zip(predicted, actual, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / CLASSES


def train(url: str, name: str, checkpoint: Path, seconds: float, timers_path: Path | None = None) -> None:
    """Loop ``name`` of PLANS for ``seconds``, reporting from simulated GPU ``GPU-e2e-<name>``.

    ``$CAUSE_LOOP_UUID`` puts the loop on another simulated GPU (``$RANK`` gives its rank: a run of several ranks).
    With ``$GPU_SIM_DEVICE_DIR`` set the loop's own ops-mode device makes that GPU busy (``$CAUSE_LOOP_DEVICE``
    names another GPU for it: one that only a sampler speaks for, tests/test_sampling.py)."""
    import torch
    from gpu_exporter import training
    from gpu_exporter.simulate.device import CHANNEL_ENV, OpsDevice
    from torch.utils.data import DataLoader, Dataset

    uuid = os.environ.get("CAUSE_LOOP_UUID", f"GPU-e2e-{name}")
    device = None
    if os.environ.get(CHANNEL_ENV):
        device = OpsDevice(os.environ.get("CAUSE_LOOP_DEVICE", uuid)).start()

    class SlowBatches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
        """A few random batches made once (making them is CPU work, not the GPU's); reading one takes ``wait()``
        seconds (one wait per batch)."""

        def __init__(self, size: int, wait: Callable[[], float]) -> None:
            self.batches = [(torch.randn(size, FEATURES), torch.arange(size) % CLASSES) for _ in range(4)]
            self.wait = wait

        def __len__(self) -> int:
            return 10_000_000

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            time.sleep(self.wait())
            return self.batches[index % len(self.batches)]

    def doing(what: str) -> None:  # the device's own account of what the loop does (its truth's phases)
        if device is not None:
            device.doing(what)

    torch.set_num_threads(1)
    batch, data_s, compute_s, metrics_s, checkpoint_s = PLANS[name]
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def data_wait() -> float:
        if name not in WOBBLE:
            return data_s
        every, other = WOBBLE[name]
        return other if int(time.monotonic() / every) % 2 else data_s

    batches = SlowBatches(batch, data_wait)
    history: list[tuple[torch.Tensor, torch.Tensor]] = []  # (predictions, labels) of the recent steps, for the metric
    timers = {"data": 0.0, "compute": 0.0, "metrics": 0.0, "checkpoint": 0.0}
    began, since = time.perf_counter(), time.monotonic()
    run = training.start(name, url=url, uuid=uuid, push_interval=0.5)
    end = time.monotonic() + seconds

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        out = model(x)
        torch.nn.functional.cross_entropy(out, y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        history.append((out.argmax(1), y))  # predictions made on the device; the metric reads them in its own phase

    def metric() -> float:
        recent = history[-8:]
        return f1_macro([p for o, _ in recent for p in o.tolist()][-METRIC_PREDICTIONS:],
                        [a for _, t in recent for a in t.tolist()][-METRIC_PREDICTIONS:])

    def timed(phase: str, seconds: float, work: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        with run.phase(phase):
            doing(phase)
            time_box(seconds, work)
        doing("other")
        timers[phase] += time.perf_counter() - t0

    try:
        mark = time.perf_counter()
        doing("data")
        for x, y in run.data(DataLoader(batches, batch_size=None)):
            timers["data"] += time.perf_counter() - mark
            timed("compute", compute_s, functools.partial(step, x, y))
            if metrics_s:
                timed("metrics", metrics_s, metric)
            if checkpoint_s:
                timed("checkpoint", checkpoint_s, lambda: torch.save(model.state_dict(), checkpoint))
            del history[:-8]
            run.step(samples=len(y))
            if time.monotonic() > end:
                break
            mark = time.perf_counter()
            doing("data")
    finally:
        run.close()
        until = time.monotonic()
        wall = time.perf_counter() - began
        if device is not None:
            device.close()
        if timers_path is not None:
            own: dict[str, object] = {"wall": wall, "phases": timers}
            if device is not None:
                own["device"] = device.truth(since=since, until=until)
            timers_path.write_text(json.dumps(own))


if __name__ == "__main__":
    train(sys.argv[2], sys.argv[1], Path(sys.argv[3]), float(sys.argv[4]),
          Path(sys.argv[5]) if len(sys.argv) > 5 else None)
