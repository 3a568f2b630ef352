"""PyTorch Lightning in one line: ``Trainer(callbacks=[GpuExporterCallback("my-run")])``.

The problem: a Lightning job's loop lives inside ``Trainer.fit``, so nobody can put phase timers
into it by hand. This callback times the phases from Lightning's own hooks and objects. What it
calls ``compute`` is GPU work only: the model's forward, backward and the optimizer's update. The
rest of ``training_step`` (a metric computed in Python, logging, host-side preprocessing) is CPU
work in the step that is not GPU work, phase ``metrics`` (remedy M2), never ``compute``:

* ``data``: from ``on_train_epoch_start`` or ``on_train_batch_end`` to the next
  ``on_train_batch_start``: the fetch of the next batch (Lightning creates the DataLoader's
  iterator before any callback hook runs, so the gap is timed) and Lightning's own per-batch
  bookkeeping around it, less any validation or checkpoint in the gap;
* ``compute``: calls of the LightningModule and of its direct children (forward pre- and post-hooks:
  ``self.net(x)``, ``self(x)``, also in validation), ``LightningModule.backward`` (``loss.backward()``,
  ``manual_backward``), and ``on_before_optimizer_step`` to the end of the torch optimizer's ``step``
  (gradient clipping and the update; the closure before it runs ``training_step`` and backward);
* ``metrics``: the rest of ``training_step``; ``self.log`` / ``self.log_dict``; the validation loop
  (``on_validation_start`` to
  ``on_validation_end``, less its forwards); calls of torchmetrics metrics that are submodules of the
  LightningModule or attributes of a callback (update/compute/forward); ``log_metrics`` of the
  trainer's loggers;
* ``checkpoint``: ``trainer.save_checkpoint`` (ModelCheckpoint and your own calls), the checkpoint
  callbacks' batch, epoch and validation-end hooks (choosing, saving, pruning files), and
  ``torch.save`` called from the training thread;
* ``checkpoint`` or ``callbacks``: the per-step hooks of the other callbacks (yours, the progress bar:
  :data:`TRAINING_HOOKS`), each timed by name, ``checkpoint`` as a whole when it writes one
  (training/callbacks.py), less what they do that is counted elsewhere;
* ``other``: the rest: Lightning's loop between the hooks and ``zero_grad``.

The training DataLoader's settings (``num_workers``, ``pin_memory``, ...; the first loader when
there are several) go with the run for concrete remedies, as ``run.data(loader)`` does.

A step is one training batch (``on_train_batch_end``, with that batch's samples). The run lasts
from ``on_train_start`` to ``on_train_end`` (the sanity check before it is not counted), rank =
``trainer.global_rank`` unless given. Every hook and wrapper is removed at ``on_train_end``. Both
package names work: ``GpuExporterCallback`` subclasses the ``Callback`` of the Lightning you
imported (``lightning`` if you imported it or nothing yet and it is installed, else
``pytorch_lightning``); ``LightningCallback`` and ``PytorchLightningCallback`` name one explicitly.
Only this module imports Lightning, and only when one of those names is used.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

from . import context as _context
from . import hooks
from .callbacks import FrameworkCallback
from .protocol import CHECKPOINT, COMPUTE, DATA, METRICS
from .run import Phase, Run

CHECKPOINT_HOOKS = ("on_train_batch_end", "on_train_epoch_end", "on_validation_end")
"""Hooks of ``trainer.checkpoint_callbacks`` (ModelCheckpoint) timed as ``checkpoint``."""
TRAINING_HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_train_epoch_start", "on_train_epoch_end",
                  "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad")
"""Hooks of the other callbacks timed one by one by name (module docstring, training/callbacks.py); their
validation hooks are in the validation's ``metrics``."""
LOG_METHODS = ("log", "log_dict")
"""Methods of the LightningModule timed as ``metrics`` (the job's logging, also from a callback)."""


class CallbackMixin(FrameworkCallback):
    """The callback's behaviour, independent of the Lightning package it is mixed into."""

    # Per-batch hooks this callback does not use: Lightning skips a hook that is not callable, so
    # the callback costs no dispatch (a profiler context and a call, several µs each) per batch.
    on_before_zero_grad = on_before_backward = on_after_backward = None
    on_validation_batch_start = on_validation_batch_end = on_test_batch_start = on_test_batch_end = None
    on_predict_batch_start = on_predict_batch_end = None

    def __init__(self, name: str | None = None, *, run: Run | None = None, **options: Any) -> None:
        super().__init__(name, run=run, **options)
        self._compute: Phase
        self._metrics: Phase
        self._data: Phase
        self._open_update: Callable[[], None] = hooks.do_nothing

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        run = self._start(trainer.global_rank)
        stack = self._stack
        self._compute, self._metrics, self._data = run.phase(COMPUTE), run.phase(METRICS), run.phase(DATA)
        compute, metrics, other = (stack.timed(p) for p in (self._compute, self._metrics, run.other_phase))
        undo = self._undo
        own = [c for c in getattr(trainer, "callbacks", ()) if c is not self
               and not any(c is k for k in getattr(trainer, "checkpoint_callbacks", ()))]
        checkpoint = self._time_callbacks(own, TRAINING_HOOKS, run.phase(CHECKPOINT), hooks.model_parts(pl_module))
        undo.append(hooks.MethodTimer(trainer, checkpoint, ("save_checkpoint",)).undo)
        undo.append(hooks.SaveTimer(checkpoint).undo)
        for callback in getattr(trainer, "checkpoint_callbacks", ()):  # their deciding and pruning too
            undo.append(hooks.MethodTimer(callback, checkpoint, CHECKPOINT_HOOKS).undo)
        for metric in hooks.torchmetrics_in([pl_module, *getattr(trainer, "callbacks", ())]):
            undo.append(hooks.MethodTimer(metric, metrics).undo)
        for logger in getattr(trainer, "loggers", ()):
            undo.append(hooks.time_overridden(logger, ("log_metrics",), None, metrics))
        undo.append(hooks.MethodTimer(pl_module, metrics, (*LOG_METHODS, "training_step")).undo)
        undo.append(hooks.MethodTimer(pl_module, compute, ("backward",)).undo)
        undo.append(hooks.time_overridden(pl_module, ("on_before_optimizer_step",), _module_base(pl_module), other))
        undo.append(hooks.time_forward(hooks.model_parts(pl_module), stack, self._compute))
        self._open_update, undone = hooks.time_optimizer_step(getattr(trainer, "optimizers", ()), stack, self._compute,
                                                        pre=False)
        undo.append(undone)
        hooks.enable_distributed(run, getattr(trainer.strategy, "model", None))
        loader = first_loader(getattr(trainer, "train_dataloader", None))
        if loader is not None:
            _context.note_loader(run, loader)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._switch(DATA)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._switch(None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._open_update()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.run is not None:
            self.run.step(samples=hooks.batch_len(batch))
            self._stack.base(self._data)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._switch(None)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None:
            self._stack.push(self._metrics)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None:
            self._stack.pop()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.close()

    def close(self) -> None:
        self._open_update = hooks.do_nothing
        super().close()


def _module_base(pl_module: Any) -> type | None:
    """The ``LightningModule`` class the module derives from (its hooks' defaults)."""
    return next((cls for cls in type(pl_module).__mro__ if cls.__name__ == "LightningModule"), None)


def first_loader(loaders: Any) -> Any:
    """The first DataLoader of what ``trainer.train_dataloader`` holds (a loader, a list or a dict of them).

    >>> class L: num_workers = 2
    >>> type(first_loader({"a": [L()]})).__name__
    'L'
    """
    return hooks.first_of(loaders, lambda x: hasattr(x, "num_workers"), 4)  # nested lists/dicts, a few levels at most


@functools.cache
def callback_class(package: str) -> type:
    """:class:`CallbackMixin` mixed into ``<package>.Callback`` (``lightning.pytorch``, ``pytorch_lightning``); once."""
    base = importlib.import_module(package).Callback
    return type("GpuExporterCallback", (CallbackMixin, base), {
        "__module__": __name__, "_base": base,
        "__doc__": f"Times a Lightning job's phases ({package}.Callback); see module doc."})


def _default_package() -> str:
    """``lightning.pytorch`` unless only ``pytorch_lightning`` is imported or installed."""
    if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules:
        return "pytorch_lightning"
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        return "pytorch_lightning"
    return "lightning.pytorch"


def __getattr__(name: str) -> Any:
    """The callback classes, built on first use for the Lightning package in use."""
    packages = {"LightningCallback": "lightning.pytorch", "PytorchLightningCallback": "pytorch_lightning"}
    if name in packages or name == "GpuExporterCallback":
        return callback_class(packages.get(name) or _default_package())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
