"""Throughput cost of the one-line integrations on a small CPU model (docs/benchmarks.md, "Integrations").

The same training job runs without (A) and with (B) the integration, alternated ``pairs`` times:
a plain loop (B: ``training.watch``), a Lightning ``Trainer`` (B: ``GpuExporterCallback``) and a
Hugging Face ``Trainer`` (B: its ``GpuExporterCallback``). The model is a small MLP (256-512-512-10,
batch 64, one torch thread), the batches are in memory, so the step is short and any cost of the
hooks shows. Each repetition is timed from the first to the last step (framework setup excluded);
the pusher points at a closed port with an hour-long interval, so no I/O happens while measuring.
Paired repetitions (A and B back to back, in alternating order) cancel the slow drift of a shared
machine: the result is the median of the per-pair differences of the mean step time, with the
spread of those differences, and the fastest B against the fastest A (the least disturbed
repetitions). Run::

    PYTHONPATH=exporter python -m bench.integrations --pairs 15 --steps 300
"""

from __future__ import annotations

import argparse
import logging
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

FEATURES, HIDDEN, CLASSES, BATCH = 256, 512, 10, 64


@dataclass(frozen=True)
class Cost:
    """Mean step time (µs) of each repetition without (a) and with (b) the integration, paired."""

    integration: str
    steps: int
    a: list[float]
    b: list[float]

    @property
    def diffs(self) -> list[float]:
        return [b - a for a, b in zip(self.a, self.b, strict=True)]

    @property
    def step_us(self) -> float:
        return statistics.median(self.a)

    @property
    def cost_us(self) -> float:
        """Median extra microseconds per step."""
        return statistics.median(self.diffs)

    @property
    def cost_percent(self) -> float:
        return self.cost_us / self.step_us * 100

    @property
    def best_cost_percent(self) -> float:
        """Fastest repetition with against fastest without: the cost with the machine's noise mostly gone."""
        return (min(self.b) / min(self.a) - 1) * 100

    @property
    def spread_percent(self) -> tuple[float, float]:
        """Interquartile range of the per-pair differences, in percent of the step."""
        q = statistics.quantiles(self.diffs, n=4)
        return q[0] / self.step_us * 100, q[2] / self.step_us * 100


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _options() -> dict[str, Any]:
    return {"url": _closed_port_url(), "uuid": "", "push_interval": 3600.0, "timeout": 0.2}


def _parts() -> tuple[Any, Any, list[Any]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES))
    batches = [(torch.randn(BATCH, FEATURES), torch.randint(0, CLASSES, (BATCH,))) for _ in range(16)]
    return torch, model, batches


def plain(steps: int, instrumented: bool) -> float:
    """Mean step time (µs) of a plain loop over ``steps`` batches, under ``training.watch`` if asked."""
    from gpu_exporter import training
    from torch.utils.data import DataLoader

    torch, model, batches = _parts()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data: Any = batches * (steps // len(batches) + 1)
    loader: Any = DataLoader(data[:steps], batch_size=None)
    watcher = training.watch(model, optimizer, loader, name="bench-watch", **_options()) if instrumented else None
    start = time.perf_counter()
    for x, y in loader:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    elapsed = time.perf_counter() - start
    if watcher is not None:
        watcher.close()
    return elapsed / steps * 1e6


def lightning(steps: int, instrumented: bool) -> float:
    """Mean step time (µs) of ``Trainer.fit`` from on_train_start to on_train_end."""
    import lightning.pytorch as pl
    from gpu_exporter.training.lightning import LightningCallback
    from torch.utils.data import DataLoader

    torch, model, batches = _parts()
    span: list[float] = []

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def on_train_start(self) -> None:
            span.append(time.perf_counter())

        def on_train_end(self) -> None:
            span.append(time.perf_counter())

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = [LightningCallback("bench-lightning", **_options())] if instrumented else []
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=callbacks, default_root_dir=tempfile.mkdtemp())
    trainer.fit(Module(), DataLoader(batches * (steps // len(batches) + 1), batch_size=None))
    return (span[1] - span[0]) / steps * 1e6


def transformers(steps: int, instrumented: bool) -> float:
    """Mean step time (µs) of ``Trainer.train`` from on_train_begin to on_train_end."""
    from gpu_exporter.training.transformers import GpuExporterCallback
    from transformers import Trainer, TrainerCallback, TrainingArguments

    torch, model, batches = _parts()
    span: list[float] = []

    class Wrapped(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: Any, labels: Any) -> Any:
            return {"loss": torch.nn.functional.cross_entropy(self.net(x), labels)}

    class Span(TrainerCallback):
        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            span.append(time.perf_counter())

        def on_train_end(self, *args: Any, **kwargs: Any) -> None:
            span.append(time.perf_counter())

    samples = [{"x": x[i], "labels": y[i]} for x, y in batches for i in range(BATCH)]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=BATCH, max_steps=steps,
                             report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
                             use_cpu=True, dataloader_num_workers=0, learning_rate=0.01)
    callbacks: list[Any] = [Span()]
    if instrumented:
        callbacks.insert(0, GpuExporterCallback("bench-transformers", **_options()))
    Trainer(model=Wrapped(), args=args, train_dataset=samples, callbacks=callbacks).train()
    return (span[1] - span[0]) / steps * 1e6


JOBS: dict[str, Callable[[int, bool], float]] = {"watch": plain, "lightning": lightning,
                                                  "transformers": transformers}


def measure(integration: str, pairs: int, steps: int) -> Cost:
    job = JOBS[integration]
    job(min(steps, 50), False)  # warm-up: imports, allocator, autograd caches
    job(min(steps, 50), True)
    a: list[float] = []
    b: list[float] = []
    for i in range(pairs):  # alternate which goes first, so neither always runs on a warmer machine
        first, second = (False, True) if i % 2 == 0 else (True, False)
        results = {first: job(steps, first), second: job(steps, second)}
        a.append(results[False])
        b.append(results[True])
    return Cost(integration, steps, a, b)


def markdown(costs: Sequence[Cost], command: str) -> str:
    rows = ["| integration | steps per repetition | pairs | median step without (µs) | median extra per step (µs) | "
            "median cost | interquartile range of the pairs | fastest with / fastest without |",
            "|---|---|---|---|---|---|---|---|"]
    for c in costs:
        low, high = c.spread_percent
        rows.append(f"| {c.integration} | {c.steps} | {len(c.a)} | {c.step_us:.0f} | {c.cost_us:.1f} | "
                    f"{c.cost_percent:+.2f}% | {low:+.2f}% to {high:+.2f}% | {c.best_cost_percent:+.2f}% |")
    return f"Command: `{command}`\n\n" + "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.integrations", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=15, help="A/B pairs per integration (default 15)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per repetition (default 300)")
    parser.add_argument("--only", choices=sorted(JOBS), action="append", help="one integration (repeatable)")
    args = parser.parse_args(argv)
    if args.pairs < 2 or args.steps < 16:
        parser.error("--pairs must be at least 2 and --steps at least 16")
    logging.getLogger("gpu_exporter.training").setLevel(logging.CRITICAL)  # the closed port, by design
    logging.getLogger("transformers").setLevel(logging.ERROR)
    costs = [measure(name, args.pairs, args.steps) for name in (args.only or list(JOBS))]
    command = "PYTHONPATH=exporter python -m bench.integrations " + " ".join(sys.argv[1:] if argv is None else argv)
    print(markdown(costs, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
