"""Real CPU PyTorch training loops with controlled phase shares, for tests/test_causes_e2e.py.

Each loop is instrumented with gpu_exporter.training and spends its step in wall-clock time boxes
around real work: a data loader that waits like slow storage (once per batch), a training step, an
F1 score computed in Python, a checkpoint written with torch.save. The shares are therefore what
PLANS sets, even on a loaded machine. Run one loop per process (no shared GIL)::

    python tests/cause_loops.py metrics40 http://127.0.0.1:9445 /tmp/ckpt.pt 60 [timers.json]

With a fifth argument the loop writes its own timers there (perf_counter around the whole run, from
before ``training.start`` to after ``run.close()``, and around each phase; ``data`` is the wait for
each batch), for tests that check what was recorded (tests/test_report.py).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

FEATURES, CLASSES = 64, 4

# loop -> (batch size, seconds per step in data, compute, metrics, checkpoint)
PLANS: dict[str, tuple[int, float, float, float, float]] = {
    "metrics40": (32, 0.01, 0.105, 0.135, 0.0),
    "mixed": (32, 0.13, 0.04, 0.07, 0.0),
    "checkpoint": (32, 0.01, 0.03, 0.0, 0.21),
    "batch2": (2, 0.02, 0.23, 0.0, 0.0),
    "healthy": (32, 0.005, 0.6, 0.0, 0.0),
    "hover30": (32, 0.12, 0.08, 0.0, 0.0),
}
# loop -> (seconds between switches, data seconds per step after a switch): the loader alternates
# between its PLANS time and this one, so the GPU's utilization swings around the 30% line
# (compute share 0.40 / 0.22: about 39% / 22% busy; 34% / 27% as 5 s means) while the loop stays input-bound.
WOBBLE: dict[str, tuple[float, float]] = {"hover30": (3.5, 0.284)}


def time_box(seconds: float, work: Callable[[], object]) -> None:
    """Do ``work`` at least once and again until ``seconds`` have passed (overrunning by at most one ``work``).

    Never sleeps: a sleep inside a phase would be that phase by the loop's own timers but not by its Python
    stack (tests/test_sampling.py compares the two), and waking up late on a busy machine stretches it."""
    deadline = time.perf_counter() + seconds
    work()
    while time.perf_counter() < deadline:
        work()


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
    """Loop ``name`` of PLANS for ``seconds``, reporting from simulated GPU ``GPU-e2e-<name>``."""
    import torch
    from gpu_exporter import training
    from torch.utils.data import DataLoader, Dataset

    class SlowBatches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
        """Random batches; reading one takes ``wait()`` seconds (one wait per batch)."""

        def __init__(self, size: int, wait: Callable[[], float]) -> None:
            self.size, self.wait = size, wait

        def __len__(self) -> int:
            return 10_000_000

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            time.sleep(self.wait())
            return torch.randn(self.size, FEATURES), torch.arange(self.size) % CLASSES

    torch.set_num_threads(1)
    batch, data_s, compute_s, metrics_s, checkpoint_s = PLANS[name]
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    history: list[tuple[torch.Tensor, torch.Tensor]] = []  # (outputs, labels) of the recent steps, for the metric
    timers = {"data": 0.0, "compute": 0.0, "metrics": 0.0, "checkpoint": 0.0}
    began = time.perf_counter()
    # $CAUSE_LOOP_UUID puts a loop on another simulated GPU ($RANK gives its rank: a run of several ranks).
    run = training.start(name, url=url, uuid=os.environ.get("CAUSE_LOOP_UUID", f"GPU-e2e-{name}"), push_interval=0.5)
    end = time.monotonic() + seconds

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        out = model(x)
        torch.nn.functional.cross_entropy(out, y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        history.append((out, y))  # no tensor work here: the metric reads the predictions in its own phase

    def data_wait() -> float:
        if name not in WOBBLE:
            return data_s
        every, other = WOBBLE[name]
        return other if int(time.monotonic() / every) % 2 else data_s

    def timed(phase: str, seconds: float, work: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        with run.phase(phase):
            time_box(seconds, work)
        timers[phase] += time.perf_counter() - t0

    try:
        mark = time.perf_counter()
        for x, y in run.data(DataLoader(SlowBatches(batch, data_wait), batch_size=None)):
            timers["data"] += time.perf_counter() - mark
            timed("compute", compute_s, functools.partial(step, x, y))
            if metrics_s:
                timed("metrics", metrics_s, lambda: f1_macro([p for o, _ in history[-8:] for p in o.argmax(1).tolist()],
                                                             [a for _, t in history[-8:] for a in t.tolist()]))
            if checkpoint_s:
                timed("checkpoint", checkpoint_s, lambda: torch.save(model.state_dict(), checkpoint))
            del history[:-8]
            run.step(samples=len(y))
            if time.monotonic() > end:
                break
            mark = time.perf_counter()
    finally:
        run.close()
        if timers_path is not None:
            timers_path.write_text(json.dumps({"wall": time.perf_counter() - began, "phases": timers}))


if __name__ == "__main__":
    train(sys.argv[2], sys.argv[1], Path(sys.argv[3]), float(sys.argv[4]),
          Path(sys.argv[5]) if len(sys.argv) > 5 else None)
