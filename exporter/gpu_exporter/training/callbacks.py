"""The job's own callbacks, timed one by one and named: ``SaveEvery.on_train_batch_end``.

The problem: a Lightning or Hugging Face job does much of its per-step work in callbacks of its own
(a checkpoint it writes and then compresses, hashes or uploads; a progress report; a probe). Counted
as one lump, that time gets the wrong name: a hook that calls ``torch.save`` and then spends 50 ms
on the file was ``checkpoint`` for the save and ``metrics`` for the rest. :class:`CallbackTimer`
wraps each hook a callback overrides (on the instance; ``undo()`` restores it) and:

* times every call of ``<Class>.<hook>`` by its wall time (what it runs inside, a model forward
  or a torchmetrics metric, keeps its own phase);
* counts the hook as phase ``checkpoint`` as a whole when it writes a checkpoint: a save seen during
  the call (``torch.save``, ``trainer.save_checkpoint``, ``save_pretrained``, ``safetensors.torch.save_file``
  or ``save_model`` through the module) switches the rest of the call to ``checkpoint``, and the
  call starts in ``checkpoint`` when the hook's saves so far predict one (it saved on the previous
  call, or its calls between saves so far were always the same number N and this is the N-th);
* counts any other hook as phase :data:`~gpu_exporter.training.protocol.CALLBACK_PHASE` (``callbacks``,
  cause CB), never ``metrics``;
* keeps, per hook, its seconds and whether it saved; the run's snapshot carries the
  :data:`~gpu_exporter.training.protocol.MAX_CALLBACKS` biggest (field ``callbacks``), and the
  exporter exports the biggest one by name.

The cost per hook call is two clock readings and two phase changes (38 µs measured on a loaded 2-core
machine where an empty method call took 2.5 µs), once per hook and step.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from time import perf_counter
from typing import Any

from .hooks import MethodTimer, PhaseStack, overridden, set_on_instance, start_run, timed_call, undo_all
from .protocol import CALLBACK_PHASE, CHECKPOINT, MAX_CALLBACKS, OTHER, to_label
from .run import Phase, Run

SAVE_METHODS = ("save_pretrained",)
"""Methods of a model whose calls write a checkpoint (Hugging Face ``PreTrainedModel.save_pretrained``)."""
SAFETENSORS_FUNCTIONS = ("save_file", "save_model")
"""Functions of ``safetensors.torch`` whose calls through the module write a checkpoint."""


def hook_name(obj: Any, hook: str) -> str:
    """``"SaveEvery.on_train_batch_end"``: the callback's class and the hook, in the label charset.

    >>> class SaveEvery: pass
    >>> hook_name(SaveEvery(), "on_step_end")
    'SaveEvery.on_step_end'
    """
    return to_label(f"{type(obj).__name__}.{hook}")


class _Hook:
    """One hook's account: seconds, calls, calls that saved, and the saves' spacing (for the prediction)."""

    __slots__ = ("calls", "gap", "last_save", "saves", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = self.saves = 0
        self.last_save = -1
        self.gap = 0
        """Calls from one save to the next, while always the same (0: not known, -1: irregular)."""

    def predicts_save(self) -> bool:
        return self.last_save >= 0 and self.calls - self.last_save == (self.gap or 1)  # irregular (-1): never

    def saved(self, call: int) -> None:
        if self.last_save >= 0:
            gap = call - self.last_save
            self.gap = gap if self.gap in (0, gap) else -1
        self.last_save = call
        self.saves += 1


def callbacks_phase(run: Run) -> Phase:
    """The run's ``callbacks`` phase, or ``other`` when the run has no room for another custom phase
    (``max_custom_phases``): the hooks are still timed and named, and training never fails for it.

    >>> from gpu_exporter.training.run import Run
    >>> callbacks_phase(Run("doc", uuid="")).name, callbacks_phase(Run("doc", uuid="", max_custom_phases=0)).name
    ('callbacks', 'other')
    """
    try:
        return run.phase(CALLBACK_PHASE)
    except ValueError:
        return run.other_phase


class CallbackTimer:
    """Time the job's own callback hooks by name (module docstring); ``undo()`` removes every wrapper."""

    def __init__(self, stack: PhaseStack, checkpoint: Phase, callbacks: Phase) -> None:
        self._stack, self._checkpoint, self._callbacks = stack, checkpoint, callbacks
        self.hooks: dict[str, _Hook] = {}
        self._active: list[list[Any]] = []  # [name, saved] of the hook calls running now (nested: innermost last)
        self._undo: list[Callable[[], None]] = []

    def wrap(self, obj: Any, names: Iterable[str], base: type | None) -> None:
        """Time each hook of ``names`` that ``obj``'s class overrides (differs from ``base``'s)."""
        for hook in overridden(obj, names, base):
            self._undo.append(set_on_instance(obj, hook, self._timed(getattr(obj, hook), hook_name(obj, hook))))

    def _timed(self, method: Callable[..., Any], name: str) -> Callable[..., Any]:
        account = self.hooks.setdefault(name, _Hook())
        stack, active = self._stack, self._active

        def timed(*args: Any, **kwargs: Any) -> Any:
            call = [name, False]
            predicted = account.predicts_save()
            start = perf_counter()
            active.append(call)
            stack.push(self._checkpoint if predicted else self._callbacks)
            try:
                return method(*args, **kwargs)
            finally:
                stack.pop()
                active.pop()
                account.seconds += perf_counter() - start
                if call[1]:
                    account.saved(account.calls)
                account.calls += 1

        timed.__wrapped__ = method  # type: ignore[attr-defined]
        return timed

    def saving(self) -> None:
        """A checkpoint is being written (called by the save timers): the hook running now, if any, is a
        checkpoint hook; the rest of its call is ``checkpoint``."""
        active = self._active
        if active and not active[-1][1]:
            active[-1][1] = True
            if self._callbacks.is_open:
                self._stack.switch(self._checkpoint)

    def time_saves(self, objects: Iterable[Any], timer: Any) -> None:
        """Count ``save_pretrained`` of ``objects`` (models) and ``safetensors.torch``'s save functions as a save
        (``timer``: the checkpoint context made with ``before=self.saving``)."""
        for obj in objects:
            if any(callable(getattr(obj, m, None)) for m in SAVE_METHODS):
                self._undo.append(MethodTimer(obj, timer, SAVE_METHODS).undo)
        module = sys.modules.get("safetensors.torch")
        if module is not None:
            for function in SAFETENSORS_FUNCTIONS:
                original = getattr(module, function, None)
                if callable(original):
                    setattr(module, function, timed_call(original, timer))
                    self._undo.append(functools.partial(setattr, module, function, original))

    def snapshot(self) -> list[dict[str, Any]]:
        """The snapshot's ``callbacks`` field: the biggest hooks by seconds (pusher thread; a copy)."""
        hooks = sorted(((h.seconds, name, h.saves) for name, h in list(self.hooks.items()) if h.calls), reverse=True)
        return [{"name": name, "seconds": seconds, "phase": CHECKPOINT if saves else self._callbacks.name}
                for seconds, name, saves in hooks[:MAX_CALLBACKS]]

    def undo(self) -> None:
        undo_all(self._undo)
        self._active.clear()


class FrameworkCallback:
    """What the Lightning and Transformers callbacks share: the run (given, or started and then owned), its
    :class:`PhaseStack`, the undo of every hook and wrapper, and the job's own callbacks timed by name."""

    _base: type | None = None
    """The framework's ``Callback`` class (set when the class is built): a hook a callback leaves as is is not timed."""

    def __init__(self, name: str | None = None, *, run: Run | None = None, **options: Any) -> None:
        super().__init__()
        self.name, self._given_run, self._options = name, run, options
        self.run: Run | None = None
        self._owns_run = False
        self._undo: list[Callable[[], None]] = []
        self._stack: PhaseStack

    def _start(self, rank: Any) -> Run:
        """The run at the framework's start of training (``rank``: its rank unless a run was given)."""
        options = dict(self._options)
        if self._given_run is None:
            options.setdefault("rank", rank)
        run, self._owns_run = start_run(self.name, self._given_run, options)
        self.run, self._stack = run, PhaseStack(run)
        return run

    def _time_callbacks(self, callbacks: list[Any], hooks: Iterable[str], checkpoint: Phase,
                        models: Iterable[Any]) -> AbstractContextManager[Any]:
        """Time ``hooks`` of the job's ``callbacks`` by name (:class:`CallbackTimer`) and the ``save_pretrained`` of
        ``models``; returns the ``checkpoint`` context, which tells the timer of each save."""
        stack = self._stack
        if not callbacks:
            return stack.timed(checkpoint)
        timer = CallbackTimer(stack, checkpoint, callbacks_phase(stack.run))
        timed = stack.timed(checkpoint, timer.saving)
        for callback in callbacks:
            timer.wrap(callback, hooks, self._base)
        timer.time_saves(models, timed)
        self._undo.append(timer.undo)
        stack.run.callback_report = timer.snapshot
        return timed

    def _switch(self, phase: str | None) -> None:
        """Close whatever phase is open and open ``phase`` (None: back to ``other``); nothing before the run starts."""
        if self.run is not None:
            self._stack.base(self.run.phase(phase or OTHER))

    def close(self) -> None:
        """Remove every hook and wrapper, back to ``other``; close the run if this callback started it."""
        undo_all(self._undo)
        self._switch(None)
        if self.run is not None and self._owns_run:
            self.run.close()
