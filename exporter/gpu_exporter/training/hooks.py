"""Time a plain PyTorch loop nobody will edit: ``training.watch(model, optimizer, loader)``.

The problem: most training loops are never instrumented by hand, so their GPUs show as "not
instrumented". This module puts the phase timers into the objects the loop already uses,
through PyTorch's own hooks, and leaves the loop body as it is::

    watcher = training.watch(model, optimizer, loader, name="resnet50")
    for x, y in loader:                      # unchanged loop
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    watcher.close()

The rule (docs/training.md, "training.watch"):

* ``data``: time inside ``next()`` on an iterator of ``loader`` (the instance's class is swapped
  for a subclass whose ``__iter__`` wraps the iterator; the class comes back on ``close()``);
* ``compute``: a training forward of ``model`` (grad enabled, ``model.training``) through the
  loss and backward to the end of ``optimizer.step`` (the model's ``forward`` is wrapped on the
  instance; ``optimizer.step`` has step pre- and post-hooks); an evaluation forward (``no_grad``
  or ``eval()``) is compute for its own duration only. Without an optimizer, a training forward's
  compute lasts until the next batch is fetched;
* ``metrics``: calls of the objects given as ``metrics=`` (their ``update``/``compute``/``forward``,
  e.g. torchmetrics metrics), and any ``with watcher.run.phase("metrics")`` block;
* ``checkpoint``: ``torch.save`` called from the training thread while watched;
* ``other``: the rest (moving batches, the loss function, zero_grad, logging).
* A step ends at each ``optimizer.step`` (with the samples of the batches fetched since the last
  one); without an optimizer, at each batch.

The building blocks are shared with the framework callbacks and zero-code activation (docs/training.md, "Writing
an integration"); :class:`PhaseStack` (``training.phase_stack``) and the timed iterator (:class:`TimedIterator`,
:class:`LoaderTimer`: ``training.loaders``) are re-exported here. Importing this module imports nothing heavy;
torch is imported by :func:`watch` only.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

from .identity import default_run_name, resolve_run_id
from .loaders import LoaderTimer as LoaderTimer  # re-exported: a building block (docs/training.md)
from .loaders import TimedIterator as TimedIterator
from .phase_stack import PhaseStack as PhaseStack
from .protocol import CHECKPOINT, COMPUTE, DATA, METRICS, to_label
from .run import Phase, Run
from .session import start, watch_distributed

METRIC_METHODS = ("update", "compute", "forward")
"""Methods of a ``metrics=`` object whose calls count as phase ``metrics``."""


def default_name(script: str | None = None) -> str:
    """A run name from the script's file name (``sys.argv[0]``); ``"training"`` without one.

    >>> default_name("/jobs/my train.py"), default_name("")
    ('my_train', 'training')
    """
    if script is None:
        script = sys.argv[0] if sys.argv else ""
    return to_label(Path(script).stem) or "training"


def batch_len(batch: Any) -> int:
    """Samples in ``batch``: the first dimension of its first tensor (in tuples, lists and dicts).

    >>> class T:
    ...     shape = (32, 3)
    >>> batch_len((T(), T())), batch_len({"input_ids": T()}), batch_len("text")
    (32, 32, 0)
    """
    shape = getattr(first_of(batch, lambda b: getattr(b, "shape", None) is not None, 3), "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else 0


def first_of(value: Any, found: Callable[[Any], bool], levels: int) -> Any:
    """``value`` if ``found(value)``, else the first such object down the first items of its tuples, lists and
    dicts (the values), ``levels`` objects deep at most; None if there is none.

    >>> first_of({"a": [7, 1]}, lambda x: x == 7, 3), first_of([[7]], lambda x: x == 7, 2)
    (7, None)
    """
    for _ in range(levels):
        if found(value):
            return value
        if not isinstance(value, (tuple, list, dict)) or not value:
            return None
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    return None


def time_forward(modules: Iterable[Any], stack: PhaseStack, phase: Phase) -> Callable[[], None]:
    """A call of any of ``modules`` (torch modules) counts as ``phase``: forward pre- and post-hooks; returns undo.

    The post-hook is ``always_call``, so a forward that raises still ends the phase. Hooks go on
    these modules only (not every submodule): a module with hooks leaves torch's fast call path.
    """
    undo = []
    for module in modules:
        undo.append(module.register_forward_pre_hook(lambda *_: stack.push(phase), prepend=True).remove)
        undo.append(module.register_forward_hook(lambda *_: stack.pop(), always_call=True).remove)
    return functools.partial(undo_all, undo)


def model_parts(model: Any) -> list[Any]:
    """The modules whose calls are the model's forward: ``model`` and its direct children, less torchmetrics.

    A framework step calls the model (Hugging Face) or a few of its children (a LightningModule's
    ``training_step`` calls ``self.net(x)``); deeper submodules run inside those.
    """
    if not hasattr(model, "register_forward_pre_hook"):
        return []
    return [m for m in (model, *model.children()) if not is_torchmetric(m)]


def time_optimizer_step(optimizer: Any, stack: PhaseStack, phase: Phase, *,
                        pre: bool = True) -> tuple[Callable[[], None], Callable[[], None]]:
    """``step`` of each torch optimizer in ``optimizer`` (one or a list) counts as ``phase``; returns (open, undo).

    With ``pre``, a step pre-hook opens the phase; without, the caller opens it with ``open()`` (Lightning
    runs its closure, ``training_step`` and backward included, inside ``optimizer.step`` and says when
    the update itself begins with ``on_before_optimizer_step``). The post-hook closes what was opened.
    """
    state = [False]

    def open_step(*_: Any) -> None:
        if not state[0]:
            state[0] = True
            stack.push(phase)

    def close_step(*_: Any) -> None:
        if state[0]:
            state[0] = False
            stack.pop()

    handles: list[Callable[[], None]] = [functools.partial(state.__setitem__, 0, False)]  # undone last
    for opt in _as_list(optimizer):
        if pre:
            handles.append(opt.register_step_pre_hook(open_step).remove)
        handles.append(opt.register_step_post_hook(close_step).remove)
    return open_step, functools.partial(undo_all, handles)


def torchmetrics_in(objects: Iterable[Any]) -> list[Any]:
    """The torchmetrics metrics in ``objects``: torch modules (all their submodules) and, for other objects
    (callbacks), their attributes that are metrics, modules, or lists, tuples and dicts of them.

    >>> torchmetrics_in([object(), [1, 2], {"a": None}])
    []
    """
    found: dict[int, Any] = {}

    def visit(value: Any, depth: int) -> None:
        if is_torchmetric(value):
            found.setdefault(id(value), value)
        elif hasattr(value, "modules") and hasattr(value, "register_forward_pre_hook"):
            for m in value.modules():
                if is_torchmetric(m):
                    found.setdefault(id(m), m)
        elif depth and isinstance(value, (list, tuple, dict)):
            for v in list(value.values() if isinstance(value, dict) else value):
                visit(v, depth - 1)

    for obj in objects:
        visit(obj, 1)
        if not hasattr(obj, "register_forward_pre_hook") and hasattr(obj, "__dict__"):
            for v in list(vars(obj).values()):
                visit(v, 1)
    return list(found.values())


def time_overridden(obj: Any, names: Iterable[str], base: type | None, timer: AbstractContextManager[Any]
                    ) -> Callable[[], None]:
    """Time calls of the hooks ``names`` that ``obj``'s class overrides (:func:`overridden`); returns undo."""
    own = overridden(obj, names, base)
    return MethodTimer(obj, timer, own).undo if own else do_nothing


def overridden(obj: Any, names: Iterable[str], base: type | None) -> list[str]:
    """The methods of ``names`` that ``obj`` has and its class overrides (differs from ``base``'s; all, without one)."""
    return [n for n in names if callable(getattr(obj, n, None))
            and (base is None or getattr(type(obj), n, None) is not getattr(base, n, None))]


class SaveTimer:
    """While active, ``torch.save`` called from the thread that created this counts as ``phase``.

    ``torch.save`` is wrapped once per process; the wrapper calls straight through for any other
    thread, or when no timer is active.
    """

    _active: ClassVar[list[SaveTimer]] = []
    _original: ClassVar[Callable[..., Any] | None] = None

    def __init__(self, phase: AbstractContextManager[Any], before: Callable[[], None] | None = None) -> None:
        import torch

        self.phase = phase
        self.before = before
        """Called at each save before the phase is entered (:meth:`CallbackTimer.saving`)."""
        self.thread = threading.get_ident()
        if SaveTimer._original is None:
            original = SaveTimer._original = torch.save

            @functools.wraps(original)
            def save(*args: Any, **kwargs: Any) -> Any:
                me = threading.get_ident()
                for timer in SaveTimer._active:
                    if timer.thread == me:
                        if timer.before is not None:
                            timer.before()
                        with timer.phase:
                            return original(*args, **kwargs)
                return original(*args, **kwargs)

            torch.save = save
        SaveTimer._active.append(self)

    def undo(self) -> None:
        if self in SaveTimer._active:
            SaveTimer._active.remove(self)


def time_saves(run: Run) -> SaveTimer:
    """``torch.save`` from this thread counts as ``checkpoint`` of ``run`` until ``undo()``."""
    return SaveTimer(run.phase(CHECKPOINT))


class MethodTimer:
    """Calls of ``obj.<name>`` for each of ``names`` it has count as ``phase``; ``undo()`` restores them.

    The timed method is set on the instance (a normal call looks there first), so other
    instances of the class are untouched.
    """

    def __init__(self, obj: Any, phase: AbstractContextManager[Any], names: Iterable[str] = METRIC_METHODS) -> None:
        self._undo = [set_on_instance(obj, name, timed_call(method, phase)) for name in names
                      if callable(method := getattr(obj, name, None))]
        if not self._undo:
            raise TypeError(f"training.watch: metrics= takes objects with update/compute/forward methods (a "
                            f"torchmetrics metric), not {type(obj).__name__}; time a plain function with "
                            "`with watcher.run.phase('metrics'):`")

    def undo(self) -> None:
        undo_all(self._undo)


def do_nothing() -> None:
    """An undo that has nothing to undo."""


def undo_all(undo: list[Callable[[], None]]) -> None:
    """Call every function of ``undo``, the last added first, leaving the list empty."""
    while undo:
        undo.pop()()


def set_on_instance(obj: Any, name: str, value: Any) -> Callable[[], None]:
    """Set attribute ``name`` on the instance ``obj`` only; returns the undo that puts back what it had (or nothing)."""
    saved = vars(obj).get(name, _MISSING)
    object.__setattr__(obj, name, value)
    if saved is _MISSING:
        return functools.partial(vars(obj).pop, name, None)
    return functools.partial(object.__setattr__, obj, name, saved)


_MISSING = object()


def timed_call(method: Callable[..., Any], phase: AbstractContextManager[Any]) -> Callable[..., Any]:
    """``method`` with each call inside ``phase``."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        with phase:
            return method(*args, **kwargs)
    timed.__wrapped__ = method  # type: ignore[attr-defined]
    return timed


def is_torchmetric(module: Any) -> bool:
    """True for a torchmetrics ``Metric`` (checked by class name, without importing torchmetrics).

    >>> is_torchmetric(object())
    False
    """
    return any(c.__name__ == "Metric" and c.__module__.startswith("torchmetrics") for c in type(module).__mro__)


class StepCounter:
    """The steps and the end of ``compute`` of the ``training.watch`` rule, shared with zero-code activation.

    ``compute`` (open from a training forward through the loss and backward) also opens at an optimizer step
    (:meth:`optimizer_step_begins`) and closes at its end (:meth:`optimizer_step_ends`); each step of the
    first optimizer (given, else the first that steps) is a step of the run, with the samples of the batches
    fetched since the previous one (:meth:`fetched`).

    >>> from gpu_exporter.training.run import Run
    >>> class Batch:
    ...     shape = (8, 3)
    >>> run = Run("doc", uuid=""); steps = StepCounter(run); steps.fetched(Batch())
    >>> steps.optimizer_step_begins(); run.current_phase.name
    'compute'
    >>> steps.optimizer_step_ends("sgd"); run.current_phase.name, run.steps, run.samples
    ('other', 1, 8)
    """

    __slots__ = ("compute", "first_optimizer", "run", "samples")

    def __init__(self, run: Run, first_optimizer: Any = None) -> None:
        self.run = run
        self.compute = run.phase(COMPUTE)
        self.first_optimizer = first_optimizer
        self.samples = 0
        """Samples fetched since the last step."""

    def fetched(self, batch: Any) -> None:
        """A batch was fetched: its samples go to the next step."""
        self.samples += batch_len(batch)

    def iterate(self, it: Iterator[Any]) -> TimedIterator:
        """``it`` (a loader's iterator) with ``next()`` timed as ``data``, its batches' samples counted."""
        return TimedIterator(it, self.run.phase(DATA), self.fetched)

    def step(self) -> None:
        """One step of the run, with the samples fetched since the last one."""
        self.run.step(samples=self.samples)
        self.samples = 0

    def optimizer_step_begins(self) -> None:
        self.compute.open()

    def optimizer_step_ends(self, optimizer: Any) -> None:
        self.compute.close()
        if self.first_optimizer is None:
            self.first_optimizer = optimizer
        if optimizer is self.first_optimizer:
            self.step()


class Watch(AbstractContextManager["Watch"]):
    """The hooks :func:`watch` put on a model, optimizer and loader; ``close()`` removes them all.

    ``run`` is the :class:`Run` they report to (``run.phase("metrics")`` marks more metrics time).
    """

    def __init__(self, run: Run, model: Any, optimizer: Any, loader: Any, metrics: Iterable[Any],
                 checkpoints: bool, owns_run: bool) -> None:
        self.run = run
        self._owns_run = owns_run
        self._undo: list[Callable[[], None]] = []
        try:
            self._hook(model, optimizer, loader, metrics, checkpoints)
        except BaseException:
            self.close()
            raise

    def _hook(self, model: Any, optimizer: Any, loader: Any, metrics: Iterable[Any], checkpoints: bool) -> None:
        import torch

        run = self.run
        optimizers = _as_list(optimizer)
        steps = StepCounter(run, optimizers[0] if optimizers else None)
        compute = steps.compute

        def on_batch(batch: Any) -> None:
            steps.fetched(batch)
            if optimizer is None:  # without an optimizer, each batch is a step
                steps.step()

        if loader is not None:
            self._undo.append(LoaderTimer(loader, run.phase(DATA), on_batch).undo)
        if checkpoints:
            self._undo.append(time_saves(run).undo)
        for obj in metrics:
            self._undo.append(MethodTimer(obj, run.phase(METRICS)).undo)

        if model is not None:
            forward = model.forward

            def timed_forward(*args: Any, **kwargs: Any) -> Any:
                opened = compute.open()
                try:
                    return forward(*args, **kwargs)
                finally:  # a training forward stays open through loss and backward, until optimizer.step
                    if opened and not (torch.is_grad_enabled() and model.training):
                        compute.close()

            self._undo.append(set_on_instance(model, "forward", timed_forward))
            enable_distributed(run, model)

        for opt in optimizers:
            self._undo.append(opt.register_step_pre_hook(lambda *_: steps.optimizer_step_begins()).remove)
            self._undo.append(opt.register_step_post_hook(lambda o, *_: steps.optimizer_step_ends(o)).remove)

    def close(self) -> None:
        """Remove every hook, restore the loader and ``torch.save``, and close the run if watch started it."""
        undo_all(self._undo)
        if self._owns_run:
            self.run.close()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()


def _as_list(optimizer: Any) -> list[Any]:
    """The torch optimizers in ``optimizer`` (one or a list), unwrapped from Accelerate's or Lightning's wrapper."""
    if optimizer is None:
        return []
    return [_unwrap(o) for o in (optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])]


def _unwrap(optimizer: Any) -> Any:
    while not hasattr(optimizer, "_optimizer_step_pre_hooks") and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def enable_distributed(run: Run, model: Any) -> None:
    """With a DistributedDataParallel ``model``, time collectives and its gradient all-reduce as ``communication``
    (``training.watch_distributed``); nothing for another model or when the job is not distributed."""
    if type(model).__name__ == "DistributedDataParallel":
        watch_distributed(run, model)


def start_run(name: str | None, run: Run | None, options: dict[str, Any]) -> tuple[Run, bool]:
    """``run`` if given (not owned), else a new ``training.start(name, **options)``; without a name, the
    script's name and the run id's tail (``train-0123456789ab``: :func:`identity.default_run_name`)."""
    if run is not None:
        if options:
            raise ValueError(f"training.watch: pass either run= or start options, not both ({sorted(options)})")
        return run, False
    if name is None:  # the script's name and the launch's id: never the same for two jobs (docs/training.md)
        run_id = resolve_run_id(options.get("run_id"))[0]
        name = default_run_name(default_name(), run_id)
    return start(name, **options), True


def watch(model: Any = None, optimizer: Any = None, loader: Any = None, *, name: str | None = None,
          run: Run | None = None, metrics: Iterable[Any] = (), checkpoints: bool = True,
          **options: Any) -> Watch:
    """Time a plain PyTorch loop through hooks on ``model``, ``optimizer`` and ``loader``; returns a :class:`Watch`.

    ``name`` and ``options`` go to ``training.start`` (url, uuid, push_interval, ...), or pass an
    open ``run``. ``metrics``: objects whose update/compute/forward calls count as ``metrics``.
    ``checkpoints``: count ``torch.save`` on this thread as ``checkpoint``. Call ``close()`` (or
    use ``with``) when training ends. The rule is in the module docstring and docs/training.md.
    """
    owned_run, owns = start_run(name, run, options)
    return Watch(owned_run, model, optimizer, loader, metrics, checkpoints, owns)
