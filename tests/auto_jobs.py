"""Real CPU training jobs that know nothing of gpu_exporter; zero-code activation times them (test_training_auto.py).

Nothing here imports the library. Each job keeps its own timers around the work of each phase and
writes them as JSON at the end; the test starts it with ``GPU_EXPORTER_AUTO=1`` (or through
``python -m gpu_exporter.training.launch``) and compares what the exporter received with them::

    python tests/auto_jobs.py plain /tmp/own.json 4
    python tests/auto_jobs.py lightning /tmp/own.json 4

* ``plain``: a DataLoader whose ``__getitem__`` sleeps (data), a forward that multiplies matrices
  through ``optimizer.step`` (compute), a ``torch.save`` into a slow file every 8 steps (checkpoint),
  and a sleep between steps that is no phase (other);
* ``lightning``: the same data and compute in a ``LightningModule``, and a Python metric inside
  ``training_step`` (metrics, by the Lightning callback's rule).
"""

from __future__ import annotations

import io
import json
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

OWN = {"data": 0.0, "compute": 0.0, "metrics": 0.0, "checkpoint": 0.0}
FEATURES, CLASSES = 32, 4
DATA_S, COMPUTE_S, METRIC_S, OTHER_S = 0.004, 0.05, 0.03, 0.01
"""Per sample (data) and per step: the job's time boxes."""


class SlowDataset(Dataset[Any]):
    """Each sample takes DATA_S to "decode"."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        t = time.perf_counter()
        time.sleep(DATA_S)
        x = torch.randn(FEATURES)
        OWN["data"] += time.perf_counter() - t
        return x, i % CLASSES


class SlowFile(io.BytesIO):
    """A checkpoint target on slow storage."""

    def write(self, b: Any) -> int:
        time.sleep(0.003)
        return super().write(b)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    a = torch.randn(64, 64)
    while time.perf_counter() < end:
        torch.mm(a, a)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        busy(COMPUTE_S)
        out: torch.Tensor = self.net(x)
        return out


def plain(seconds: float) -> None:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=8)
    start = time.perf_counter()
    for step, (x, y) in enumerate(loader, 1):
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        OWN["compute"] += time.perf_counter() - t
        optimizer.zero_grad()
        time.sleep(OTHER_S)
        if step % 8 == 0:
            t = time.perf_counter()
            torch.save(model.state_dict(), SlowFile())
            OWN["checkpoint"] += time.perf_counter() - t
        if time.perf_counter() - start > seconds:
            break


def lightning(seconds: float) -> None:
    import lightning.pytorch as pl

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = Net()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.model(x)
            return out

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            t = time.perf_counter()
            logits = self(x)
            OWN["compute"] += time.perf_counter() - t
            t = time.perf_counter()
            time.sleep(METRIC_S)  # a metric computed in Python
            OWN["metrics"] += time.perf_counter() - t
            loss: torch.Tensor = torch.nn.functional.cross_entropy(logits, y)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Stop(pl.Callback):  # the job's own: train for `seconds` and start its timers with training
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            for key in OWN:
                OWN[key] = 0.0
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if time.perf_counter() - self.start > seconds:
                trainer.should_stop = True

    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, callbacks=[Stop()])
    trainer.fit(Classifier(), DataLoader(SlowDataset(), batch_size=8))


def main() -> None:
    kind, out, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    torch.set_num_threads(1)
    {"plain": plain, "lightning": lightning}[kind](seconds)
    with open(out, "w") as fh:
        json.dump(OWN, fh)


if __name__ == "__main__":
    main()
