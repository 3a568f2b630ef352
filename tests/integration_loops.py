"""Real CPU training jobs for the one-line integrations (tests/test_integrations.py, bench/integrations.py).

The same four loops run under each integration: a plain PyTorch loop under ``training.watch``, a
Lightning ``Trainer`` with ``GpuExporterCallback`` and a Hugging Face ``Trainer`` with its
``GpuExporterCallback``. Each phase is a wall-clock time box around real work in the place where
that framework does it (the dataset's ``__getitem__``, a custom autograd function in the model's
forward and backward, a torchmetrics metric / validation / ``compute_metrics``, a checkpoint
write), and the loop keeps its own timers around that work. The integrations never see those
timers; the test compares what they reported with them. Run one job per process::

    python tests/integration_loops.py watch input_bound http://127.0.0.1:9445 GPU-x 4 /tmp/own.json

The last argument receives the job's own timers (seconds per phase) as JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cause_loops import f1_macro

FEATURES, CLASSES, HIDDEN = 32, 4, 64
INTEGRATIONS = ("watch", "lightning", "transformers")

# loop -> (batch size, seconds per step in data, compute (forward + backward), metrics, checkpoint)
PLANS: dict[str, tuple[int, float, float, float, float]] = {
    "input_bound": (16, 0.3, 0.05, 0.0, 0.0),
    "metrics_heavy": (16, 0.005, 0.05, 0.3, 0.0),
    "checkpoint_heavy": (16, 0.005, 0.05, 0.0, 0.3),
    "healthy": (16, 0.003, 0.25, 0.0, 0.0),
}

OWN: dict[str, float] = {"data": 0.0, "compute": 0.0, "metrics": 0.0, "checkpoint": 0.0}
"""The job's own timers: seconds of each phase's work since the integration's run started."""


def reset_own() -> None:
    for key in OWN:
        OWN[key] = 0.0


def time_box(seconds: float, work: Callable[[], object], phase: str | None = None) -> None:
    """Do ``work`` at least once and again until ``seconds`` have passed, sleep out the rest; add to OWN[phase]."""
    start = time.perf_counter()
    deadline = start + seconds
    work()
    while time.perf_counter() + 0.002 < deadline:
        work()
    time.sleep(max(0.0, deadline - time.perf_counter()))
    if phase is not None:
        OWN[phase] += time.perf_counter() - start


def parts(loop: str) -> dict[str, Any]:
    """The torch pieces of loop ``loop``: dataset, model, metric, slow checkpoint state (torch imported here)."""
    import torch
    import torchmetrics
    from torch.utils.data import Dataset

    batch, data_s, compute_s, metrics_s, checkpoint_s = PLANS[loop]

    class Busy(torch.autograd.Function):
        """Identity whose forward and backward each do real matmul work for half the compute time box."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            time_box(compute_s / 2, lambda: x @ x.T, "compute")
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time_box(compute_s / 2, lambda: grad @ grad.T, "compute")
            return grad

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, CLASSES)

        def forward(self, x: Any, labels: Any = None) -> Any:
            h = torch.relu(self.a(x))
            if self.training and torch.is_grad_enabled():
                h = Busy.apply(h)  # type: ignore[no-untyped-call]
            return self.b(h)

    class Batches(Dataset[Any]):
        """Random samples; ``per_item`` True: one sample per index (HF), else one batch per index."""

        def __init__(self, per_item: bool, phase: str | None = "data") -> None:
            self.per_item, self.phase = per_item, phase

        def __len__(self) -> int:
            return 100_000

        def __getitem__(self, index: int) -> Any:
            if self.per_item:
                time_box(data_s / batch, lambda: None, self.phase)
                return {"x": torch.randn(FEATURES), "labels": index % CLASSES}
            time_box(data_s, lambda: None, self.phase)
            return torch.randn(batch, FEATURES), torch.arange(batch) % CLASSES

    class SlowF1(torchmetrics.Metric):
        """Macro F1 over the recent steps, computed in Python for ``metrics_s`` per update."""

        def __init__(self) -> None:
            super().__init__()
            self.history: list[tuple[list[int], list[int]]] = []
            self.add_state("score", default=torch.tensor(0.0), dist_reduce_fx="mean")

        def update(self, logits: Any, target: Any) -> None:
            self.history = [*self.history[-7:], (logits.argmax(1).tolist(), target.tolist())]
            time_box(metrics_s, lambda: f1_macro([p for h in self.history for p in h[0]],
                                                 [a for h in self.history for a in h[1]]), "metrics")

        def compute(self) -> Any:
            return self.score

    class SlowState:
        """Pickles slowly, like a checkpoint to slow storage (torch.save of it takes ``checkpoint_s``)."""

        def __reduce__(self) -> tuple[Any, ...]:
            time_box(checkpoint_s, lambda: None, "checkpoint")
            return (dict, ())

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return {"torch": torch, "Net": Net, "Batches": Batches, "SlowF1": SlowF1, "SlowState": SlowState,
            "plan": PLANS[loop]}


def run_watch(loop: str, url: str, uuid: str, seconds: float, name: str) -> None:
    """A plain loop, unchanged but for the ``training.watch`` line."""
    from gpu_exporter import training
    from torch.utils.data import DataLoader

    p = parts(loop)
    torch, (_, _, _, metrics_s, checkpoint_s) = p["torch"], p["plan"]
    model, f1 = p["Net"](), p["SlowF1"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(p["Batches"](per_item=False), batch_size=None)
    checkpoint = Path(tempfile.mkdtemp()) / "model.pt"
    watcher = training.watch(model, optimizer, loader, name=name, url=url, uuid=uuid, push_interval=0.5,
                             metrics=[f1])
    reset_own()
    end = time.monotonic() + seconds
    for x, y in loader:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits, y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if metrics_s:
            f1.update(logits.detach(), y)
        if checkpoint_s:  # the loop's own timer: the whole save
            start, before = time.perf_counter(), OWN["checkpoint"]
            torch.save({"model": model.state_dict(), "state": p["SlowState"]()}, checkpoint)
            OWN["checkpoint"] = before + time.perf_counter() - start
        if time.monotonic() > end:
            break
    watcher.close()


def run_lightning(loop: str, url: str, uuid: str, seconds: float, name: str, package: str = "lightning") -> None:
    """A LightningModule trained by ``Trainer(callbacks=[GpuExporterCallback(...)])``."""
    import importlib

    from torch.utils.data import DataLoader

    pl = importlib.import_module("pytorch_lightning" if package == "pytorch_lightning" else "lightning.pytorch")
    from gpu_exporter.training import lightning as gl

    p = parts(loop)
    torch, (_, _, _, metrics_s, checkpoint_s) = p["torch"], p["plan"]
    callback_class = gl.PytorchLightningCallback if package == "pytorch_lightning" else gl.LightningCallback

    class Module(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net, self.f1 = p["Net"](), p["SlowF1"]()
            self.val_start = self.metrics_before = self.end = 0.0

        def on_train_start(self) -> None:
            reset_own()
            self.end = time.monotonic() + seconds

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            if time.monotonic() > self.end:
                self.trainer.should_stop = True

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.f1.update(self.net(x), y)

        def on_validation_start(self) -> None:
            self.val_start, self.metrics_before = time.perf_counter(), OWN["metrics"]

        def on_validation_end(self) -> None:  # the loop's own timer of validation (SlowF1's own within it)
            OWN["metrics"] = self.metrics_before + time.perf_counter() - self.val_start

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["slow_storage"] = p["SlowState"]()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = DataLoader(p["Batches"](per_item=False), batch_size=None)
    val = DataLoader(p["Batches"](per_item=False, phase=None), batch_size=None)  # inside validation's own timer
    folder = tempfile.mkdtemp()
    callbacks: list[Any] = [callback_class(name, url=url, uuid=uuid, push_interval=0.5)]
    class TimedCheckpoint(pl.callbacks.ModelCheckpoint):  # type: ignore[misc,name-defined]
        """The loop's own timer of checkpointing: the whole save (state, slow storage, pruning the old file)."""

        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            start, before = time.perf_counter(), OWN["checkpoint"]
            super().on_train_batch_end(*args, **kwargs)
            OWN["checkpoint"] = before + time.perf_counter() - start

    if checkpoint_s:
        callbacks.append(TimedCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=1))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=bool(checkpoint_s),
                         num_sanity_val_steps=0, callbacks=callbacks, default_root_dir=folder,
                         limit_val_batches=1 if metrics_s else 0, val_check_interval=1 if metrics_s else None,
                         check_val_every_n_epoch=None if metrics_s else 1, max_steps=100_000)
    trainer.fit(Module(), loader, val if metrics_s else None)


def run_transformers(loop: str, url: str, uuid: str, seconds: float, name: str) -> None:
    """A model trained by a Hugging Face ``Trainer(callbacks=[GpuExporterCallback(...)])``."""
    from gpu_exporter.training.transformers import GpuExporterCallback
    from transformers import Trainer, TrainerCallback, TrainingArguments

    p = parts(loop)
    torch, (batch, _, _, metrics_s, checkpoint_s) = p["torch"], p["plan"]

    net: Any = p["Net"]

    class Model(net):  # type: ignore[misc]
        def forward(self, x: Any, labels: Any = None) -> Any:
            logits = super().forward(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Stop(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            reset_own()
            self.end = time.monotonic() + seconds

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if time.monotonic() > self.end:
                control.should_training_stop = True

    class Timed(Trainer):
        """The loop's own timers of evaluation and checkpointing (slow storage: at least checkpoint_s)."""

        def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return super().evaluate(*args, **kwargs)
            finally:
                OWN["metrics"] += time.perf_counter() - start

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            start = time.perf_counter()
            super()._save_checkpoint(model, trial)
            time.sleep(max(0.0, checkpoint_s - (time.perf_counter() - start)))
            OWN["checkpoint"] += time.perf_counter() - start

    def compute_metrics(prediction: Any) -> dict[str, float]:
        logits, labels = prediction
        scores: list[float] = []
        time_box(metrics_s, lambda: scores.append(f1_macro(logits.argmax(1).tolist(), labels.tolist())))
        return {"f1": scores[-1]}

    folder = tempfile.mkdtemp()
    evaluating = bool(metrics_s)
    args = TrainingArguments(
        output_dir=folder, per_device_train_batch_size=batch, per_device_eval_batch_size=batch, max_steps=100_000,
        learning_rate=0.01, report_to="none", disable_tqdm=True, logging_strategy="no", use_cpu=True,
        dataloader_num_workers=0, eval_strategy="steps" if evaluating else "no", eval_steps=1,
        save_strategy="steps" if checkpoint_s else "no", save_steps=1, save_total_limit=1, save_only_model=False)
    eval_set = [{"x": torch.randn(FEATURES), "labels": i % CLASSES} for i in range(batch)]
    trainer = Timed(model=Model(), args=args, train_dataset=p["Batches"](per_item=True),
                    eval_dataset=eval_set if evaluating else None,
                    compute_metrics=compute_metrics if evaluating else None,
                    callbacks=[GpuExporterCallback(name, url=url, uuid=uuid, push_interval=0.5), Stop()])
    trainer.train()


RUNNERS: dict[str, Callable[..., None]] = {"watch": run_watch, "lightning": run_lightning,
                                           "pytorch_lightning": run_lightning, "transformers": run_transformers}


def main(argv: list[str]) -> None:
    integration, loop, url, uuid, seconds, out = argv
    name = f"{integration.replace('_', '-')}-{loop.replace('_', '-')}"
    extra = {"package": "pytorch_lightning"} if integration == "pytorch_lightning" else {}
    RUNNERS[integration](loop, url, uuid, float(seconds), name, **extra)
    Path(out).write_text(json.dumps(OWN))


if __name__ == "__main__":
    main(sys.argv[1:])
