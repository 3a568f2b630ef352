"""Hugging Face ``Trainer`` in one line: ``Trainer(..., callbacks=[GpuExporterCallback("my-run")])``.

The problem: a ``Trainer`` job's loop lives inside ``Trainer.train``, so nobody puts phase timers
into it by hand. This ``TrainerCallback`` times the phases from the Trainer's events and from
the train DataLoader it is handed:

* ``data``: time inside ``next()`` on the train DataLoader's iterator (the same timed iterator as
  ``training.watch``; behind Accelerate's ``DataLoaderShard``, its ``base_dataloader``);
* ``compute``: ``on_step_begin`` to ``on_step_end`` (forward and backward of every micro-batch of
  the step, gradient clipping, ``optimizer.step``, the scheduler, ``zero_grad``);
* after ``on_step_end``, the Trainer logs, evaluates and saves, in that order, as its ``control``
  flags (set by then) say: with ``should_evaluate``, ``metrics`` runs from ``on_step_end`` to
  ``on_evaluate`` (logging before the evaluation, the evaluation loop, ``compute_metrics``); with
  ``should_save``, ``checkpoint`` runs from there to ``on_save`` (``_save_checkpoint``: model,
  optimizer, scheduler, RNG and trainer state);
* ``other``: the rest (logging without evaluation, other callbacks, the Trainer's bookkeeping).

A step is one optimizer step (``on_step_end``), with the samples of the batches fetched for it.
The run lasts from ``on_train_begin`` to ``on_train_end``; rank = ``args.process_index`` unless
given. Accelerate needs nothing more: the Trainer's DataLoader is Accelerate's, and its
``base_dataloader`` is timed. Only this module imports transformers, when
``GpuExporterCallback`` is first used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .hooks import LoaderTimer, _enable_distributed, batch_len, start_run, to_other
from .run import Phase, Run


class _Hooks:
    """The callback's behaviour; mixed into ``transformers.TrainerCallback`` on first use."""

    def __init__(self, name: str | None = None, *, run: Run | None = None, **options: Any) -> None:
        self.name, self._given_run, self._options = name, run, options
        self.run: Run | None = None
        self._owns_run = False
        self._samples = 0
        self._undo: list[Callable[[], None]] = []
        self._phases: dict[str, Phase] = {}

    def _switch(self, phase: str | None) -> None:
        """Close whatever phase the callback opened and open ``phase`` (None: back to ``other``)."""
        run = self.run
        if run is None:
            return
        to_other(run)
        if phase is not None:
            self._phases[phase].__enter__()

    def _count(self, batch: Any) -> None:
        self._samples += batch_len(batch)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        options = dict(self._options)
        if self._given_run is None:
            options.setdefault("rank", args.process_index)
        run, self._owns_run = start_run(self.name, self._given_run, options)
        self.run = run
        self._phases = {p: run.phase(p) for p in ("compute", "metrics", "checkpoint")}
        loader = kwargs.get("train_dataloader")
        if loader is not None:
            self._undo.append(LoaderTimer(loader, run.phase("data"), self._count).undo)
        _enable_distributed(run, kwargs.get("model"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._switch("compute")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        self.run.step(samples=self._samples)
        self._samples = 0
        self._switch("metrics" if control.should_evaluate else "checkpoint" if control.should_save else None)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._switch("metrics" if control.should_evaluate else "checkpoint" if control.should_save else None)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None and self.run._current is self._phases["metrics"]:
            self._switch("checkpoint" if control.should_save else None)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._switch(None)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Restore the DataLoader; close the run if this callback started it."""
        self._switch(None)
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            fn()
        if self.run is not None and self._owns_run:
            self.run.close()


_class: list[type] = []


def __getattr__(name: str) -> Any:
    """``GpuExporterCallback``: ``_Hooks`` mixed into ``transformers.TrainerCallback``, built on first use."""
    if name == "GpuExporterCallback":
        if not _class:
            from transformers import TrainerCallback

            _class.append(type("GpuExporterCallback", (_Hooks, TrainerCallback), {
                "__module__": __name__, "__doc__": "Times a Hugging Face Trainer's phases; see the module doc."}))
        return _class[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
