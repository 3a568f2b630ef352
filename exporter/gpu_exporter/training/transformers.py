"""Hugging Face ``Trainer`` in one line: ``Trainer(..., callbacks=[GpuExporterCallback("my-run")])``.

The problem: a ``Trainer`` job's loop lives inside ``Trainer.train``, so nobody puts phase timers
into it by hand. This ``TrainerCallback`` times the phases from the Trainer's events, the model,
optimizer and train DataLoader it is handed, and the Trainer itself (found once, at
``on_train_begin``, as the caller of the callback). What it calls ``compute`` is GPU work only:

* ``data``: time inside ``next()`` on the train DataLoader's iterator (the same timed iterator as
  ``training.watch``; behind Accelerate's ``DataLoaderShard``, its ``base_dataloader``);
* ``compute``: calls of the model and of its direct children (forward pre- and post-hooks, in
  evaluation too), ``accelerator.backward`` and the torch optimizer's ``step`` (step pre- and
  post-hooks);
* ``metrics``: the rest of ``Trainer.training_step`` (your ``compute_loss`` or ``training_step``
  override: a metric computed in Python, host-side preprocessing), less ``_prepare_inputs``; after
  ``on_step_end`` with ``control.should_evaluate``, from there to ``on_evaluate`` (the logging
  before it, the evaluation loop, ``compute_metrics``), less the model's forwards; calls of
  torchmetrics metrics held by the model or by a callback; the callbacks' ``on_log``,
  ``on_evaluate``, ``on_predict`` and ``on_prediction_step`` hooks (logging and metrics);
* ``checkpoint`` or ``callbacks``: the other callbacks' training hooks (``on_step_begin``, ``on_step_end``, ...:
  :data:`TRAINING_HOOKS`), each timed by name, ``checkpoint`` as a whole when it writes one
  (training/callbacks.py), less what they do that is counted elsewhere;
* ``checkpoint``: with ``control.should_save``, from ``on_step_end`` (or ``on_evaluate``) to
  ``on_save`` (``_save_checkpoint``: model, optimizer, scheduler, RNG and trainer state), the
  callbacks' ``on_save`` hooks, and ``torch.save`` called from the training thread;
* ``other``: the rest: the Trainer's bookkeeping, ``_prepare_inputs`` (the device copy), gradient
  clipping, the scheduler, ``zero_grad``, logging without evaluation.

A step is one optimizer step (``on_step_end``), with the samples of the batches fetched for it.
The run lasts from ``on_train_begin`` to ``on_train_end``; rank = ``args.process_index`` unless
given. Every hook and wrapper is removed at ``on_train_end``. Accelerate needs nothing more: the
Trainer's DataLoader is Accelerate's, and its ``base_dataloader`` is timed. Only this module
imports transformers, when ``GpuExporterCallback`` is first used.
"""

from __future__ import annotations

import sys
from typing import Any

from . import hooks
from .callbacks import FrameworkCallback
from .protocol import CHECKPOINT, COMPUTE, DATA, METRICS
from .run import Phase, Run

TRAINING_HOOKS: tuple[str, ...] = ("on_epoch_begin", "on_epoch_end", "on_step_begin", "on_substep_end",
                                   "on_pre_optimizer_step", "on_optimizer_step", "on_step_end")
"""Hooks of the other callbacks timed one by one by name (module docstring, training/callbacks.py)."""
METRIC_HOOKS: tuple[str, ...] = ("on_log", "on_evaluate", "on_predict", "on_prediction_step")
"""Hooks of the other callbacks timed as ``metrics`` (logging, evaluation results)."""
SAVE_HOOKS: tuple[str, ...] = ("on_save",)
"""Hooks of the other callbacks timed as ``checkpoint``."""


class CallbackMixin(FrameworkCallback):
    """The callback's behaviour; mixed into ``transformers.TrainerCallback`` on first use."""

    def __init__(self, name: str | None = None, *, run: Run | None = None, **options: Any) -> None:
        super().__init__(name, run=run, **options)
        self._samples = 0
        self._phases: dict[str, Phase] = {}

    def _count(self, batch: Any) -> None:
        self._samples += hooks.batch_len(batch)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self._start(args.process_index)
        stack = self._stack
        self._phases = {p: run.phase(p) for p in (COMPUTE, METRICS, CHECKPOINT)}
        compute, metrics = stack.timed(self._phases[COMPUTE]), stack.timed(self._phases[METRICS])
        undo = self._undo
        trainer = _find_trainer()
        callbacks = [c for c in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()) if c is not self]
        model = kwargs.get("model")
        checkpoint = self._time_callbacks(callbacks, TRAINING_HOOKS, self._phases[CHECKPOINT],
                                          [m for m in (model, getattr(model, "module", None)) if m is not None])
        other = stack.timed(run.other_phase)
        loader = kwargs.get("train_dataloader")
        if loader is not None:
            undo.append(hooks.LoaderTimer(loader, run.phase(DATA), self._count).undo)
        undo.append(hooks.SaveTimer(checkpoint).undo)
        undo.append(hooks.time_forward(hooks.model_parts(model), stack, self._phases[COMPUTE]))
        undo.append(hooks.time_optimizer_step(kwargs.get("optimizer"), stack, self._phases[COMPUTE])[1])
        if trainer is not None:
            undo.append(hooks.MethodTimer(trainer, metrics, ("training_step",)).undo)
            for obj, method, timer in ((trainer, "_prepare_inputs", other),
                                       (getattr(trainer, "accelerator", None), "backward", compute)):
                undo.append(hooks.time_overridden(obj, (method,), None, timer))
        timed: tuple[tuple[tuple[str, ...], Any], ...] = ((METRIC_HOOKS, metrics), (SAVE_HOOKS, checkpoint))
        for callback in callbacks:
            for names, timer in timed:
                undo.append(hooks.time_overridden(callback, names, self._base, timer))
        for metric in hooks.torchmetrics_in([m for m in (model, *callbacks) if m is not None]):
            undo.append(hooks.MethodTimer(metric, metrics).undo)
        hooks.enable_distributed(run, model)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._switch(None)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        self.run.step(samples=self._samples)
        self._samples = 0
        self._switch(METRICS if control.should_evaluate else CHECKPOINT if control.should_save else None)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._switch(METRICS if control.should_evaluate else CHECKPOINT if control.should_save else None)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None and self._phases[METRICS].is_open:
            self._switch(CHECKPOINT if control.should_save else None)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._switch(None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()



def _find_trainer(depth: int = 12) -> Any:
    """The ``transformers.Trainer`` whose method called this callback (a ``self`` a few frames up), or None."""
    from transformers import Trainer

    frame: Any = sys._getframe(1)
    while frame is not None and depth:
        if isinstance(candidate := frame.f_locals.get("self"), Trainer):
            return candidate
        frame, depth = frame.f_back, depth - 1
    return None


_class: list[type] = []


def __getattr__(name: str) -> Any:
    """``GpuExporterCallback``: :class:`CallbackMixin` mixed into ``transformers.TrainerCallback`` on first use."""
    if name == "GpuExporterCallback":
        if not _class:
            from transformers import TrainerCallback

            _class.append(type("GpuExporterCallback", (CallbackMixin, TrainerCallback), {
                "__module__": __name__, "_base": TrainerCallback,
                "__doc__": "Times a Hugging Face Trainer's phases; see the module doc."}))
        return _class[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
