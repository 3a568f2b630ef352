"""Real CPU training jobs for the one-line integrations (tests/test_integrations.py, tests/test_integrations_e2e.py).

The same four loops (:data:`PLANS`) run under each integration: a plain PyTorch loop under
``training.watch``, a Lightning ``Trainer`` with ``GpuExporterCallback`` and a Hugging Face
``Trainer`` with its ``GpuExporterCallback``; the framework loops (:data:`FRAMEWORK_PLANS`) run under
Lightning and Transformers only. Each phase is a wall-clock time box around real work in the place
where that framework does it (the dataset's ``__getitem__``, a custom autograd function in the
model's forward and backward, a torchmetrics metric / validation / ``compute_metrics``, a Python
metric inside ``training_step`` or ``compute_loss``, a callback of the job's own, a checkpoint
write), and the loop keeps its own timers around that work. The integrations never see those
timers; the tests compare what they reported with them.

With ``$GPU_SIM_DEVICE_DIR`` set, the job runs on an ops-mode simulated GPU
(``gpu_exporter.simulate.device.OpsDevice``, started when the integration's run starts): busy
exactly while the job is inside torch operators. The compute time boxes do real matmuls, so they
make it busy; waiting for data, Python metrics and slow storage leave it idle. The job marks what
its CPU does in each time box (``device.marked``), so the device's own account (``truth()``: busy
seconds, CPU seconds per mark) is ground truth apart from anything the integration reported. Run
one job per process::

    python tests/integration_loops.py watch input_bound http://127.0.0.1:9445 GPU-x 4 /tmp/own.json

The last argument receives, every 2 s and at the end, ``{"own": seconds per phase, "truth": the
device's account or null, "reported": the run's phase seconds since the device started}`` as JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cause_loops import f1_macro

FEATURES, CLASSES, HIDDEN = 32, 4, 64
MATMUL = 192
"""The compute time boxes multiply two MATMUL x MATMUL matrices over and over (about 0.4 ms each on one
thread), so the ops device is busy through them but for the few microseconds between two operators."""
INTEGRATIONS = ("watch", "lightning", "transformers")

# loop -> (batch size, seconds per step in data, compute (forward + backward), metrics, checkpoint)
PLANS: dict[str, tuple[int, float, float, float, float]] = {
    "input_bound": (16, 0.3, 0.05, 0.0, 0.0),
    "metrics_heavy": (16, 0.005, 0.05, 0.3, 0.0),
    "checkpoint_heavy": (16, 0.005, 0.05, 0.0, 0.3),
    "healthy": (16, 0.003, 0.25, 0.0, 0.0),
}
FRAMEWORK_PLANS: dict[str, tuple[int, float, float, float, float]] = {
    # a macro F1 in Python inside training_step (Lightning) / compute_loss (Transformers), every step
    "step_metric": (16, 0.005, 0.05, 0.15, 0.0),
    # a callback of the job's own updates a torchmetrics metric that computes in Python, every step
    "callback_metric": (16, 0.005, 0.05, 0.15, 0.0),
    # a callback of the job's own saves the model with torch.save, every step (slow storage), then works on the file
    # (hashes it: AFTER_SAVE) in the same hook: checkpoint as a whole
    "callback_save": (16, 0.005, 0.05, 0.0, 0.05),
}
AFTER_SAVE = 0.1
"""Seconds the saving callback spends on the file after torch.save (hashing it again and again): more than the
save itself, so a library that counted only the save as checkpoint would call the job metrics- or callback-bound."""
"""Loops of the framework integrations only (a step with code of the job's own in it)."""
ALL_PLANS = {**PLANS, **FRAMEWORK_PLANS}

OWN: dict[str, float] = {"data": 0.0, "compute": 0.0, "metrics": 0.0, "checkpoint": 0.0}
"""The job's own timers: seconds of each phase's work since the integration's run started."""
DEVICE: list[Any] = []
"""The ops-mode simulated GPU the job runs on (one, from :func:`reset_own`), when $GPU_SIM_DEVICE_DIR is set."""
RUN: list[Any] = []
"""The integration's run (a ``gpu_exporter.training.Run``) and its phase seconds when the device started: what it
counted since then goes into the output file too, over the same window as the device's account."""
UUID: list[str] = []
OUT: list[Path] = []
_last_report = [0.0]


def reset_own(run: Any) -> None:
    """The integration's ``run`` has started: zero the own timers and start the simulated GPU (once)."""
    for key in OWN:
        OWN[key] = 0.0
    if UUID and not DEVICE and os.environ.get("GPU_SIM_DEVICE_DIR"):
        from gpu_exporter.simulate.device import OpsDevice

        DEVICE.append(OpsDevice(UUID[0]))
        RUN[:] = [run, run.phase_seconds()]  # the same instant as the device's start
        DEVICE[0].start()
    else:
        RUN[:] = [run, run.phase_seconds()]


def report(final: bool = False) -> None:
    """Write the own timers, the device's account and what the integration counted so far (every 2 s, at the end)."""
    now = time.monotonic()
    if not OUT or not (final or now - _last_report[0] > 2.0):
        return
    _last_report[0] = now
    counted = RUN[0].phase_seconds() if RUN else {}
    body = json.dumps({"own": OWN, "truth": DEVICE[0].truth() if DEVICE else None,
                       "reported": {k: v - RUN[1].get(k, 0.0) for k, v in counted.items()} if RUN else None})
    tmp = OUT[0].with_suffix(".tmp")
    tmp.write_text(body)
    tmp.replace(OUT[0])


def time_box(seconds: float, work: Callable[[], object], phase: str | None = None, busy: bool = False) -> None:
    """Do ``work`` at least once and again until ``seconds`` have passed; add to OWN[phase].

    ``busy``: keep working to the end (a compute box: the device stays busy), else sleep out the last
    2 ms. The device's truth marks the box as ``phase``.
    """
    start = time.perf_counter()
    deadline = start + seconds
    with DEVICE[0].marked(phase) if DEVICE and phase else contextlib.nullcontext():
        work()
        while time.perf_counter() + (0.0 if busy else 0.002) < deadline:
            work()
        if not busy:
            time.sleep(max(0.0, deadline - time.perf_counter()))
    if phase is not None:
        OWN[phase] += time.perf_counter() - start


def parts(loop: str) -> dict[str, Any]:
    """The torch pieces of loop ``loop``: dataset, model, metric, slow checkpoint state (torch imported here)."""
    import torch
    import torchmetrics
    from torch.utils.data import Dataset

    batch, data_s, compute_s, metrics_s, checkpoint_s = ALL_PLANS[loop]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    weights = torch.randn(MATMUL, MATMUL)

    class Busy(torch.autograd.Function):
        """Identity whose forward and backward each do real matmul work for half the compute time box."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            time_box(compute_s / 2, lambda: weights @ weights, "compute", busy=True)
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time_box(compute_s / 2, lambda: weights @ weights, "compute", busy=True)
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

    samples = list(torch.randn(64, FEATURES))
    batches = [(torch.randn(batch, FEATURES), torch.arange(batch) % CLASSES) for _ in range(4)]
    """Batches made in advance, before the device starts: loading one runs no torch operator. On the ops device every
    operator is GPU work, CPU tensors too, so a stall inside one during ``next(loader)`` (a wait for the CPU, a
    page-in, a garbage collection in the dispatch mode) made the device busy in the data phase, outside the loop's
    own timer (the time box only)."""

    class Batches(Dataset[Any]):
        """Random samples; ``per_item`` True: one sample per index (HF), else one batch per index."""

        def __init__(self, per_item: bool, phase: str | None = "data") -> None:
            self.per_item, self.phase = per_item, phase

        def __len__(self) -> int:
            return 100_000

        def __getitem__(self, index: int) -> Any:
            if self.per_item:  # a sample made in advance, as the batches are
                time_box(data_s / batch, lambda: None, self.phase)
                return {"x": samples[index % len(samples)], "labels": index % CLASSES}
            time_box(data_s, lambda: None, self.phase)
            return batches[index % len(batches)]

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

    def python_f1(logits: Any, target: Any) -> None:
        """A macro F1 in plain Python for ``metrics_s`` (inside a step, where no integration can see it)."""
        predicted, actual = logits.argmax(1).tolist(), target.tolist()
        time_box(metrics_s, lambda: f1_macro(predicted * 8, actual * 8), "metrics")

    class SlowState:
        """Pickles slowly, like a checkpoint to slow storage (torch.save of it takes ``checkpoint_s``)."""

        def __reduce__(self) -> tuple[Any, ...]:
            time_box(checkpoint_s, lambda: None, "checkpoint")
            return (dict, ())

    return {"torch": torch, "Net": Net, "Batches": Batches, "SlowF1": SlowF1, "SlowState": SlowState,
            "python_f1": python_f1, "plan": ALL_PLANS[loop]}


@contextlib.contextmanager
def own_timer(phase: str) -> Iterator[None]:
    """The loop's own timer (and the device's mark) around a whole piece of work; time boxes inside count once."""
    start, before = time.perf_counter(), OWN[phase]
    with DEVICE[0].marked(phase) if DEVICE else contextlib.nullcontext():
        try:
            yield
        finally:
            OWN[phase] = before + time.perf_counter() - start


def timed_save(torch: Any, state: dict[str, Any], path: Path) -> None:
    """``torch.save(state, path)`` with the loop's own timer around the whole save."""
    with own_timer("checkpoint"):
        torch.save(state, path)


def save_then_work(torch: Any, state: dict[str, Any], path: Path) -> None:
    """The job's own checkpoint hook: :func:`timed_save`, then AFTER_SAVE on the file it wrote (compress, hash, upload:
    here hashing), timed by the loop as checkpoint too."""
    timed_save(torch, state, path)
    time_box(AFTER_SAVE, lambda: hashlib.sha256(path.read_bytes()).hexdigest(), "checkpoint")


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
    reset_own(watcher.run)
    end = time.monotonic() + seconds
    for x, y in loader:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits, y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if metrics_s:
            f1.update(logits.detach(), y)
        if checkpoint_s:  # the loop's own timer: the whole save
            timed_save(torch, {"model": model.state_dict(), "state": p["SlowState"]()}, checkpoint)
        report()
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
    torch = p["torch"]
    validating, checkpointing = loop == "metrics_heavy", loop == "checkpoint_heavy"
    callback_class = gl.PytorchLightningCallback if package == "pytorch_lightning" else gl.LightningCallback

    class Module(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net, self.f1 = p["Net"](), p["SlowF1"]()
            self.val_start = self.metrics_before = self.end = 0.0

        def on_train_start(self) -> None:  # after the callbacks' on_train_start
            reset_own(next(c.run for c in self.trainer.callbacks if isinstance(c, callback_class)))
            self.end = time.monotonic() + seconds

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            logits = self.net(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            if loop == "step_metric":  # a metric in Python, right in the step
                p["python_f1"](logits, y)
            if loop == "callback_metric":  # for the job's own callback
                return {"loss": loss, "logits": logits.detach()}
            return loss

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            report()
            if time.monotonic() > self.end:
                self.trainer.should_stop = True

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.f1.update(self.net(x), y)

        def on_validation_start(self) -> None:
            self.val_start, self.metrics_before = time.perf_counter(), OWN["metrics"]
            if DEVICE:
                DEVICE[0].doing("metrics")

        def on_validation_end(self) -> None:  # the loop's own timer of validation (SlowF1's own within it)
            OWN["metrics"] = self.metrics_before + time.perf_counter() - self.val_start
            if DEVICE:
                DEVICE[0].doing("other")

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["slow_storage"] = p["SlowState"]()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class F1Callback(pl.Callback):  # type: ignore[misc,name-defined]
        """The job's own callback: a training F1 (a torchmetrics metric computing in Python) every step."""

        def __init__(self) -> None:
            self.f1 = p["SlowF1"]()

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.f1.update(outputs["logits"], batch[1])

    class SaveEveryStep(pl.Callback):  # type: ignore[misc,name-defined]
        """The job's own callback: torch.save of the model every step, to slow storage, then work on the file."""

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            save_then_work(torch, {"model": module.state_dict(), "state": p["SlowState"]()}, Path(folder) / "own.pt")

    loader = DataLoader(p["Batches"](per_item=False), batch_size=None)
    val = DataLoader(p["Batches"](per_item=False, phase=None), batch_size=None)  # inside validation's own timer
    folder = tempfile.mkdtemp()
    callbacks: list[Any] = [callback_class(name, url=url, uuid=uuid, push_interval=0.5)]
    callbacks += [F1Callback()] if loop == "callback_metric" else [SaveEveryStep()] if loop == "callback_save" else []

    class TimedCheckpoint(pl.callbacks.ModelCheckpoint):  # type: ignore[misc,name-defined]
        """The loop's own timer of checkpointing: the whole save (state, slow storage, pruning the old file)."""

        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            with own_timer("checkpoint"):
                super().on_train_batch_end(*args, **kwargs)

    if checkpointing:
        callbacks.append(TimedCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=1))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=checkpointing,
                         num_sanity_val_steps=0, callbacks=callbacks, default_root_dir=folder,
                         limit_val_batches=1 if validating else 0, val_check_interval=1 if validating else None,
                         check_val_every_n_epoch=None if validating else 1, max_steps=100_000)
    trainer.fit(Module(), loader, val if validating else None)


def run_transformers(loop: str, url: str, uuid: str, seconds: float, name: str) -> None:
    """A model trained by a Hugging Face ``Trainer(callbacks=[GpuExporterCallback(...)])``."""
    from gpu_exporter.training.transformers import GpuExporterCallback
    from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator

    p = parts(loop)
    torch, (batch, _, _, metrics_s, checkpoint_s) = p["torch"], p["plan"]
    evaluating, checkpointing = loop == "metrics_heavy", loop == "checkpoint_heavy"
    folder = tempfile.mkdtemp()

    net: Any = p["Net"]

    class Model(net):  # type: ignore[misc]
        def forward(self, x: Any, labels: Any = None) -> Any:
            logits = super().forward(x)
            if labels is None:
                return {"logits": logits}
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Stop(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            reset_own(exporter_callback.run)  # it came first
            self.end = time.monotonic() + seconds

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            report()
            if time.monotonic() > self.end:
                control.should_training_stop = True

    class F1Callback(TrainerCallback):
        """The job's own callback: F1 on a probe batch (a torchmetrics metric computing in Python) every step."""

        def __init__(self) -> None:
            self.f1 = p["SlowF1"]()
            self.probe = torch.randn(batch, FEATURES), torch.arange(batch) % CLASSES

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            with torch.no_grad():
                logits = model(self.probe[0])["logits"]
            self.f1.update(logits, self.probe[1])

    class SaveEveryStep(TrainerCallback):
        """The job's own callback: torch.save of the model every step, to slow storage, then work on the file."""

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            save_then_work(torch, {"model": model.state_dict(), "state": p["SlowState"]()}, Path(folder) / "own.pt")

    class Timed(Trainer):
        """The loop's own timers of evaluation and checkpointing (slow storage: at least checkpoint_s); step_metric:
        a metric in Python inside ``compute_loss``."""

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            if loop == "step_metric":
                p["python_f1"](outputs["logits"], inputs["labels"])
            return (loss, outputs) if return_outputs else loss

        def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            with own_timer("metrics"):
                return super().evaluate(*args, **kwargs)

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            with own_timer("checkpoint"):
                start = time.perf_counter()
                super()._save_checkpoint(model, trial)
                time.sleep(max(0.0, checkpoint_s - (time.perf_counter() - start)))

    def compute_metrics(prediction: Any) -> dict[str, float]:
        logits, labels = prediction
        scores: list[float] = []
        time_box(metrics_s, lambda: scores.append(f1_macro(logits.argmax(1).tolist(), labels.tolist())))
        return {"f1": scores[-1]}

    args = TrainingArguments(
        output_dir=folder, per_device_train_batch_size=batch, per_device_eval_batch_size=batch, max_steps=100_000,
        learning_rate=0.01, report_to="none", disable_tqdm=True, logging_strategy="no", use_cpu=True,
        dataloader_num_workers=0, eval_strategy="steps" if evaluating else "no", eval_steps=1,
        save_strategy="steps" if checkpointing else "no", save_steps=1, save_total_limit=1, save_only_model=False)
    eval_set = [{"x": torch.randn(FEATURES), "labels": i % CLASSES} for i in range(batch)]
    def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:  # making the batch is loading data too
        with own_timer("data"):
            return default_data_collator(samples)

    exporter_callback = GpuExporterCallback(name, url=url, uuid=uuid, push_interval=0.5)
    trainer = Timed(model=Model(), args=args, train_dataset=p["Batches"](per_item=True), data_collator=collate,
                    eval_dataset=eval_set if evaluating else None,
                    compute_metrics=compute_metrics if evaluating else None,
                    callbacks=[exporter_callback, Stop(),
                               *([F1Callback()] if loop == "callback_metric" else []),
                               *([SaveEveryStep()] if loop == "callback_save" else [])])
    trainer.train()


RUNNERS: dict[str, Callable[..., None]] = {"watch": run_watch, "lightning": run_lightning,
                                           "pytorch_lightning": run_lightning, "transformers": run_transformers}


def main(argv: list[str]) -> None:
    integration, loop, url, uuid, seconds, out = argv
    name = f"{integration.replace('_', '-')}-{loop.replace('_', '-')}"
    extra = {"package": "pytorch_lightning"} if integration == "pytorch_lightning" else {}
    UUID.append(uuid)
    OUT.append(Path(out))
    RUNNERS[integration](loop, url, uuid, float(seconds), name, **extra)
    report(final=True)
    for device in DEVICE:
        device.close()


if __name__ == "__main__":
    main(sys.argv[1:])
