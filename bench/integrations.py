"""Throughput cost of the one-line integrations on a small CPU model (docs/benchmarks.md, "Integrations").

The same training job runs without (A) and with (B) the integration, alternated ``pairs`` times:
a plain loop (B: ``training.watch``), a Lightning ``Trainer`` (B: ``GpuExporterCallback``) and a
Hugging Face ``Trainer`` (B: its ``GpuExporterCallback``). The model is a small MLP (256-512-512-10,
batch 64, one torch thread; ``--model tiny`` shrinks it to leave mostly the hooks' own cost), the
batches are in memory, so the step is short and any cost of the hooks shows. Each repetition is
timed over its steps after the first ``WARMUP`` (framework setup and the integration's one-off
start excluded), in CPU seconds of the whole process (``time.process_time``: the training thread,
the pusher and anything else the integration adds), which a crowded machine disturbs less than
wall time; wall time is reported beside it. The pusher points at a closed port with an hour-long
interval, so no I/O happens while measuring. Paired repetitions (A and B back to back, in
alternating order) cancel the slow drift of a shared machine: the result is the median of the
per-pair differences of the mean step time, with the spread of those differences, and the fastest
B against the fastest A (the least disturbed repetitions). Run::

    PYTHONPATH=exporter python -m bench.integrations --pairs 30 --steps 300 --update-docs

``--update-docs`` replaces the section between the ``bench.integrations`` markers in
docs/benchmarks.md (appends it when missing); the rest of that file is ``python -m bench``'s.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import doc_regions
from testbed import closed_url

CLASSES = 10
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
SIZES = {"small": (256, 512, 64), "tiny": (4, 8, 8)}
"""--model: (features, hidden units, batch). ``tiny`` leaves almost only the framework and the hooks,
so their extra microseconds per step show with less noise; ``small`` is the model the cost is judged on."""
WARMUP = 50
MODEL = ["small"]
"""Steps run before the timed ones: allocator and autograd caches, and the integration's one-off
start (the pusher thread, its first push, finding the GPU), which is no cost per step."""


@dataclass(frozen=True)
class Cost:
    """Mean CPU time per step (µs) of each repetition without (a) and with (b) the integration, paired;
    ``a_wall``/``b_wall`` the same in wall-clock time."""

    integration: str
    steps: int
    a: list[float]
    b: list[float]
    a_wall: list[float]
    b_wall: list[float]

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
    def wall_cost_percent(self) -> float:
        """Median per-pair difference of the wall-clock step time, in percent of the median step."""
        diffs = [b - a for a, b in zip(self.a_wall, self.b_wall, strict=True)]
        return statistics.median(diffs) / statistics.median(self.a_wall) * 100

    @property
    def spread_percent(self) -> tuple[float, float]:
        """Interquartile range of the per-pair differences, in percent of the step."""
        q = statistics.quantiles(self.diffs, n=4)
        return q[0] / self.step_us * 100, q[2] / self.step_us * 100


def _options() -> dict[str, Any]:
    return {"url": closed_url(), "uuid": "", "push_interval": 3600.0, "timeout": 0.2}


def _parts() -> tuple[Any, Any, list[Any]]:
    import torch
    from torch import nn

    features, hidden, batch = SIZES[MODEL[0]]

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, CLASSES))
    batches = [(torch.randn(batch, features), torch.randint(0, CLASSES, (batch,))) for _ in range(16)]
    return torch, model, batches


Timing = tuple[float, float]
"""(CPU, wall) microseconds per step."""


def _per_step(start: Timing, end: Timing, steps: int) -> Timing:
    return (end[0] - start[0]) / steps * 1e6, (end[1] - start[1]) / steps * 1e6


def _now() -> Timing:
    return time.process_time(), time.perf_counter()


def plain(steps: int, instrumented: bool) -> Timing:
    """Mean step time (µs) of a plain loop over ``steps`` batches, under ``training.watch`` if asked."""
    from gpu_exporter import training
    from torch.utils.data import DataLoader

    torch, model, batches = _parts()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data: Any = batches * ((WARMUP + steps) // len(batches) + 1)
    loader: Any = DataLoader(data[:WARMUP + steps], batch_size=None)
    watcher = training.watch(model, optimizer, loader, name="bench-watch", **_options()) if instrumented else None
    start = _now()
    for i, (x, y) in enumerate(loader):
        if i == WARMUP:
            start = _now()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    end = _now()
    if watcher is not None:
        watcher.close()
    return _per_step(start, end, steps)


def lightning(steps: int, instrumented: bool) -> Timing:
    """Mean step time (µs) of ``Trainer.fit`` from on_train_start to on_train_end."""
    import lightning.pytorch as pl
    from gpu_exporter.training.lightning import LightningCallback
    from torch.utils.data import DataLoader

    torch, model, batches = _parts()
    span: list[Timing] = []

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx in (WARMUP - 1, WARMUP + steps - 1):
                span.append(_now())

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = [LightningCallback("bench-lightning", **_options())] if instrumented else []
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=WARMUP + steps, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks,
                         default_root_dir=tempfile.mkdtemp())
    epoch: Any = batches * ((WARMUP + steps) // len(batches) + 1)
    trainer.fit(Module(), DataLoader(epoch, batch_size=None))
    return _per_step(span[0], span[1], steps)


def transformers(steps: int, instrumented: bool) -> Timing:
    """Mean step time (µs) of ``Trainer.train`` from on_train_begin to on_train_end."""
    from gpu_exporter.training.transformers import GpuExporterCallback
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    torch, model, batches = _parts()
    span: list[Timing] = []

    base: Any = torch.nn.Module

    class Wrapped(base):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: Any, labels: Any) -> Any:
            return {"loss": torch.nn.functional.cross_entropy(self.net(x), labels)}

    class Span(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step in (WARMUP, WARMUP + steps):
                span.append(_now())

    samples = [{"x": x[i], "labels": y[i]} for x, y in batches for i in range(len(x))]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=len(batches[0][0]),
                             max_steps=WARMUP + steps,
                             report_to="none", disable_tqdm=True, logging_strategy="no", save_strategy="no",
                             use_cpu=True, dataloader_num_workers=0, learning_rate=0.01)
    callbacks: list[Any] = [Span()]
    if instrumented:
        callbacks.insert(0, GpuExporterCallback("bench-transformers", **_options()))
    trainer = Trainer(model=Wrapped(), args=args, train_dataset=samples, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # no per-run summary on stdout
    trainer.train()
    return _per_step(span[0], span[1], steps)


JOBS: dict[str, Callable[[int, bool], Timing]] = {"watch": plain, "lightning": lightning,
                                                  "transformers": transformers}


def measure(integration: str, pairs: int, steps: int) -> Cost:
    job = JOBS[integration]
    job(16, False)  # warm-up: imports
    job(16, True)
    results: dict[bool, list[Timing]] = {False: [], True: []}
    for i in range(pairs):  # alternate which goes first, so neither always runs on a warmer machine
        for instrumented in ((False, True) if i % 2 == 0 else (True, False)):
            results[instrumented].append(job(steps, instrumented))
    a, b = results[False], results[True]
    return Cost(integration, steps, [t[0] for t in a], [t[0] for t in b], [t[1] for t in a], [t[1] for t in b])


def table(costs: Sequence[Cost], model: str) -> list[str]:
    """The markdown table of one model's costs."""
    rows = [f"Model `{model}` {SIZES[model]} (features, hidden units, batch):", "",
            "| integration | steps per repetition | pairs | CPU µs per step without | extra CPU µs per step | "
            "CPU cost (median of pairs) | interquartile range of the pairs | fastest with / fastest without | "
            "wall-clock cost (median of pairs) |", "|---|---|---|---|---|---|---|---|---|"]
    for c in costs:
        low, high = c.spread_percent
        rows.append(f"| {c.integration} | {c.steps} | {len(c.a)} | {c.step_us:.0f} | {c.cost_us:.1f} | "
                    f"{c.cost_percent:+.2f}% | {low:+.2f}% to {high:+.2f}% | {c.best_cost_percent:+.2f}% | "
                    f"{c.wall_cost_percent:+.2f}% |")
    return [*rows, ""]


BEGIN, END = "<!-- bench.integrations: begin -->", "<!-- bench.integrations: end -->"
"""The markers around the section that ``--update-docs`` owns in docs/benchmarks.md."""


def verdict(costs: dict[str, list[Cost]]) -> list[str]:
    """One line per integration: its own cost per step (tiny model) against the small model's step."""
    if "tiny" not in costs or "small" not in costs:
        return []
    small = {c.integration: c for c in costs["small"]}
    lines = []
    for c in costs["tiny"]:
        if c.integration in small:
            step = small[c.integration].step_us
            lines.append(f"- {c.integration}: {c.cost_us:.1f} µs per step of its own (tiny model), "
                         f"{c.cost_us / step * 100:.2f}% of the small model's {step:.0f} µs step; under 1% for "
                         f"steps longer than {c.cost_us * 100 / 1000:.1f} ms.")
    return [*lines, ""]


def section(tables: Sequence[str], command: str, summary: Sequence[str] = ()) -> str:
    """The "Integrations" section of docs/benchmarks.md."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return "\n".join([
        BEGIN, "## Integrations", "",
        f"Generated by `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC} (load average {load}); "
        "`python -m bench` does not run it and keeps this marked section when it rewrites the file. "
        "The throughput cost of `training.watch`, the Lightning callback and "
        "the Transformers callback (docs/training.md): the same job without and with the integration, "
        "paired repetitions, CPU time of the whole process per step after 50 warm-up steps (bench/integrations.py "
        "says why). The `tiny` model leaves mostly the framework and the hooks, so its extra microseconds are "
        "the integration's own cost with the least noise; the cost relative to a real step is that figure "
        "over the step time. On the `small` model the difference is of the order of the machine's noise "
        "(see the interquartile ranges).", "",
        *summary, *tables, END, ""])


def update_docs(text: str, new: str) -> str:
    """``text`` with its marked region replaced by ``new`` (appended when there is none), every other line as it
    was (bench.doc_regions)."""
    return doc_regions.update(text, new)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.integrations", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=15, help="A/B pairs per integration (default 15)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per repetition (default 300)")
    parser.add_argument("--only", choices=sorted(JOBS), action="append", help="one integration (repeatable)")
    parser.add_argument("--model", choices=sorted(SIZES), action="append",
                        help="small: MLP 256-512-512-10, batch 64; tiny: 4-8-8-10, batch 8 (default: both)")
    parser.add_argument("--update-docs", action="store_true",
                        help=f"replace the Integrations section of {DOC.relative_to(DOC.parents[1])}")
    args = parser.parse_args(argv)
    if args.pairs < 2 or args.steps < 16:
        parser.error("--pairs must be at least 2 and --steps at least 16")
    logging.getLogger("gpu_exporter.training").setLevel(logging.CRITICAL)  # the closed port, by design
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tables: list[str] = []
    costs: dict[str, list[Cost]] = {}
    for model in args.model or ["small", "tiny"]:
        MODEL[0] = model
        costs[model] = [measure(name, args.pairs, args.steps) for name in (args.only or list(JOBS))]
        tables += table(costs[model], model)
    command = "PYTHONPATH=exporter python -m bench.integrations " + " ".join(sys.argv[1:] if argv is None else argv)
    text = section(tables, command.strip(), verdict(costs))
    print(text)
    if args.update_docs:
        DOC.write_text(update_docs(DOC.read_text(), text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
