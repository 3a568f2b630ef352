"""Zero-code activation: ``GPU_EXPORTER_AUTO=1`` (or ``python -m gpu_exporter.training.launch``) times any PyTorch job.

The problem: every other way in needs a line in the job (``training.watch``, a callback). A platform
team that runs other people's jobs can set an environment variable on every training pod, but not
edit the code. The training wheel installs a startup hook, ``gpu_exporter_training_auto.pth`` (the
:data:`PTH_LINE`): at interpreter start it reads ``$GPU_EXPORTER_AUTO`` and, only when it is set to
something other than ``0``/``false``/``no``/``off``, imports this module and calls :func:`install`.
Unset, the line costs one dictionary lookup and imports nothing of the library.

:func:`install` imports nothing heavy either. It waits for the job to import torch, Lightning or
Transformers (an import hook on ``sys.meta_path``, or at once if they are imported already) and then:

* **torch** (the ``training.watch`` rule, applied to every object of the job rather than the ones
  passed to ``watch``): ``DataLoader.__iter__`` returns the timed iterator of ``training.watch``
  (time inside ``next()`` is ``data``); a global forward pre-hook opens ``compute`` at the first module
  call outside a phase (a training forward stays open through the loss and backward to the end of
  ``Optimizer.step``, an evaluation forward lasts its own call); global ``Optimizer.step`` pre- and
  post-hooks close it, and each ``step`` of the first optimizer that steps is a step, with the samples
  fetched since the previous one; ``torch.save`` from the training thread is ``checkpoint``
  (``SaveTimer``); torch.distributed collectives are ``communication`` (``training.watch_distributed``,
  also when the process group is initialized after the run started; a ``DistributedDataParallel``
  model's gradient all-reduce too). The run starts at the first ``DataLoader`` iteration or
  optimizer step of the main thread (not in DataLoader workers) and closes at exit. Its name is
  ``$GPU_EXPORTER_RUN_NAME``, else the script's name and the run id's tail, as ``training.watch``.
* **Lightning** (``lightning.pytorch`` and ``pytorch_lightning``) and the **Hugging Face Trainer**:
  ``Trainer.__init__`` adds the package's ``GpuExporterCallback`` unless the job passed one; the
  global torch timers then stand aside (the callback's rule is finer: it knows ``training_step``).

It never breaks a job: every patch is tried on its own, and a failure (an unknown framework
version, a bad setting, an exporter that does not answer) is one log line on the logger
``gpu_exporter.training``, after which the job runs on without that part.

The global forward hooks give way to hooks on the job's models after :data:`NARROW_AFTER` optimizer steps
(``_Job.narrow`` says why).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # this module's top level is the standard library only: setup.py and release.py run it alone
    from .run import Run

ENV = "GPU_EXPORTER_AUTO"
"""The switch: set (to anything but ``0``/``false``/``no``/``off``/empty) to activate the startup hook."""
NAME_ENV = "GPU_EXPORTER_RUN_NAME"
"""The run's name under zero-code activation (default: the script's name and the run id's tail)."""
PTH_NAME = "gpu_exporter_training_auto.pth"
"""The startup hook's file name at the root of site-packages (installed by the training wheel)."""
PTH_LINE = (f"import os; os.environ.get({ENV!r}, '').strip().lower() not in ('', '0', 'false', 'no', 'off') "
            "and __import__('gpu_exporter.training.auto').training.auto.install()\n")
"""The startup hook's one line: ``site`` executes a ``.pth`` line that starts with ``import``."""

log = logging.getLogger("gpu_exporter.training")

_LIGHTNING_TRAINERS = {"lightning.pytorch.trainer.trainer": "lightning.pytorch",
                       "pytorch_lightning.trainer.trainer": "pytorch_lightning"}
"""The modules that define Lightning's ``Trainer``, and the package its callback class comes from."""
_TRANSFORMERS_TRAINER = "transformers.trainer"
_TORCH_OPTIMIZER = "torch.optim.optimizer"
NARROW_AFTER = 2
"""Optimizer steps after which the global forward hooks give way to hooks on the modules that opened ``compute``."""
MAX_OPENERS = 16
_WATCHED = ("torch", _TORCH_OPTIMIZER, _TRANSFORMERS_TRAINER, *_LIGHTNING_TRAINERS)


def enabled(environ: Any = None) -> bool:
    """True when ``$GPU_EXPORTER_AUTO`` asks for activation (the test of :data:`PTH_LINE`).

    >>> enabled({}), enabled({"GPU_EXPORTER_AUTO": "1"}), enabled({"GPU_EXPORTER_AUTO": "off"})
    (False, True, False)
    """
    value = (os.environ if environ is None else environ).get(ENV, "")
    return str(value).strip().lower() not in ("", "0", "false", "no", "off")


def _failed(what: str, err: BaseException) -> None:
    """One log line for a part that could not be set up; the job runs on without it."""
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    log.warning("gpu_exporter.training: zero-code activation: %s failed (%s: %s); the job runs on without it",
                what, type(err).__name__, detail)


class _State:
    """What :func:`install` did in this process."""

    def __init__(self) -> None:
        self.installed = False
        self.done: set[str] = set()
        """The watched modules patched."""
        self.framework = False
        """A framework callback was attached: the global torch timers stand aside."""
        self.failed = False
        """The global torch timers failed once: they stay off."""
        self.job: _Job | None = None
        """The global run of a plain PyTorch job, once started."""
        self.lock = threading.Lock()


class _Job:
    """The global run of a plain PyTorch job and its forward hooks (the rule of the module docstring).

    Steps, samples and the end of ``compute`` are ``training.watch``'s (:class:`~.hooks.StepCounter`); what is
    left here is the global forward hooks' part: which module call opens ``compute``, and their narrowing.
    """

    def __init__(self, run: Run) -> None:
        from .hooks import StepCounter

        self.run = run
        self.thread = threading.get_ident()
        """The thread that started the run: the global timers apply to its calls only."""
        self.steps = StepCounter(run)
        self.compute, self.other = self.steps.compute, run.other_phase
        self.opener: Any = None
        """The module whose evaluation forward opened ``compute`` (closed at its end)."""
        self.openers: list[Any] = []
        """The modules whose calls opened ``compute`` (the job's models), until the hooks are narrowed to them."""
        self.module_hooks: list[Any] = []
        self.narrowed = False
        self.loader_noted = False

    def forward_pre(self, module: Any) -> None:
        if not self.other.is_open or self.run.closed or threading.get_ident() != self.thread:
            return  # inside compute already, or in data / checkpoint / communication (a transform, a save)
        self.compute.open()
        openers = self.openers
        if not self.narrowed and len(openers) < MAX_OPENERS and not any(m is module for m in openers):
            openers.append(module)
        torch = sys.modules["torch"]
        if not (torch.is_grad_enabled() and module.training):
            self.opener = module  # an evaluation forward: compute for its own duration
        elif type(module).__name__ == "DistributedDataParallel" and getattr(module, "_gpu_exporter_run", None) is None:
            from .hooks import enable_distributed

            try:
                enable_distributed(self.run, module)
            except Exception as err:
                _failed("timing the gradient all-reduce", err)

    def forward_post(self, module: Any) -> None:
        if module is self.opener:
            self.opener = None
            self.compute.close()

    def optimizer_step_ends(self, optimizer: Any) -> None:
        self.opener = None
        self.steps.optimizer_step_ends(optimizer)
        if not self.narrowed and self.run.steps >= NARROW_AFTER and self.openers:
            self.narrow()

    def narrow(self) -> None:
        """Replace the global forward hooks with hooks on the modules that opened ``compute`` so far (the job's models).

        A global hook makes every module call of the job take torch's slow path (about 5 µs a call measured on a
        loaded 2-core machine: 5 ms per forward of a thousand modules); on the top modules alone it costs that once
        per forward. A module that first runs after this (a model used only for evaluation later) is not timed.
        """
        self.narrowed = True
        hooks, self.module_hooks = self.module_hooks, []
        for handle in hooks:
            handle.remove()
        for module in self.openers:
            self.module_hooks.append(module.register_forward_pre_hook(_forward_pre))
            self.module_hooks.append(module.register_forward_hook(_forward_post, always_call=True))
        self.openers = []

    def stop(self) -> None:
        """Remove the forward hooks and close the run, ignoring their failures."""
        hooks, self.module_hooks = self.module_hooks, []
        for handle in hooks:
            with contextlib.suppress(Exception):
                handle.remove()
        with contextlib.suppress(Exception):
            self.run.close()


_state = _State()


class _Finder(importlib.abc.MetaPathFinder):
    """Calls :func:`_imported` right after a watched module has run (and before its importer sees it)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _WATCHED or fullname in _state.done:
            return None
        try:
            finders = [f for f in sys.meta_path if f is not self and hasattr(f, "find_spec")]
            spec = next((s for f in finders if (s := f.find_spec(fullname, path, target)) is not None), None)
        except Exception:  # let the import system ask the finders itself (and raise what it raises)
            return None
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module: types.ModuleType) -> None:
            exec_module(module)
            _imported(fullname, module)

        with contextlib.suppress(Exception):  # a loader that takes no attribute: patch at the next chance
            loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


_finder = _Finder()


def install() -> bool:
    """Activate zero-code timing in this process (idempotent); True if it is active.

    Patches what is imported already and hooks the import of the rest. Never raises: a failure is
    one log line.
    """
    if _state.installed:
        return True
    try:
        _state.installed = True
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        for name in _WATCHED:
            if (module := sys.modules.get(name)) is not None:
                _imported(name, module)
    except Exception as err:
        _failed("install", err)
        return False
    return True


def _imported(name: str, module: types.ModuleType) -> None:
    """A watched module has been imported: patch it (once), logging a failure instead of raising it."""
    if name in _state.done:
        return
    _state.done.add(name)
    try:
        _PATCHES[name](module)
    except Exception as err:
        _failed(f"patching {name}", err)


# ---------------------------------------------------------------------------------------------- plain torch


def _patch_optimizer(module: types.ModuleType) -> None:
    """Global ``Optimizer.step`` pre- and post-hooks (cheap: once per optimizer step)."""
    module.register_optimizer_step_pre_hook(functools.partial(_optimizer_step, True))
    module.register_optimizer_step_post_hook(functools.partial(_optimizer_step, False))


def _patch_torch(torch: Any) -> None:
    """``DataLoader.__iter__`` (data) and ``torch.distributed.init_process_group`` (communication)."""
    if _TORCH_OPTIMIZER not in _state.done:  # torch imports it while it initializes: normally done by now
        _imported(_TORCH_OPTIMIZER, sys.modules.get(_TORCH_OPTIMIZER) or __import__(_TORCH_OPTIMIZER))
    from torch.utils.data import DataLoader

    original = DataLoader.__iter__

    def __iter__(self: Any) -> Any:
        it = original(self)
        try:
            job = _active_job(start=True)
            if job is not None:
                from . import context

                if not job.loader_noted:
                    job.loader_noted = True
                    context.note_loader(job.run, self)
                return job.steps.iterate(it)
        except Exception as err:
            _disable(err)
        return it

    __iter__.__wrapped__ = original  # type: ignore[attr-defined]
    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]
    try:
        dist = torch.distributed
        if dist.is_available():
            init = dist.init_process_group

            def init_process_group(*args: Any, **kwargs: Any) -> Any:
                result = init(*args, **kwargs)
                job = _state.job
                if job is not None and not job.run.closed:
                    try:
                        from .session import watch_distributed

                        watch_distributed(job.run)
                    except Exception as err:
                        _failed("timing collectives", err)
                return result

            init_process_group.__wrapped__ = init  # type: ignore[attr-defined]
            dist.init_process_group = init_process_group
            c10d = getattr(dist, "distributed_c10d", None)
            if c10d is not None and getattr(c10d, "init_process_group", None) is init:
                c10d.init_process_group = init_process_group
    except Exception as err:
        _failed("timing collectives", err)


def _in_worker() -> bool:
    """True inside a DataLoader worker process (it never reports)."""
    data = sys.modules.get("torch.utils.data")
    try:
        return data is not None and data.get_worker_info() is not None
    except Exception:
        return False


def _active_job(start: bool) -> _Job | None:
    """The global run when the global timers apply to this call (main thread, no framework callback); with
    ``start``, started on first use."""
    state = _state
    job = state.job
    if job is not None:
        return None if job.run.closed or state.framework or threading.get_ident() != job.thread else job
    if not start or state.framework or state.failed or threading.current_thread() is not threading.main_thread():
        return None
    with state.lock:
        if state.job is None and not state.failed:
            _start_run()
    job = state.job
    return job if job is not None and not job.run.closed else None


def _start_run() -> None:
    """Start the global run: ``training.start`` (pusher, collectives), ``torch.save``, the forward hooks."""
    if _in_worker():
        return
    try:
        from .hooks import start_run, time_saves

        run, _ = start_run(_name(), None, {})
        job = _state.job = _Job(run)
        time_saves(run)
        import torch

        module = torch.nn.modules.module
        job.module_hooks = [module.register_module_forward_pre_hook(_forward_pre),
                            module.register_module_forward_hook(_forward_post, always_call=True)]
        log.info("gpu_exporter.training: zero-code activation: timing run %r", run.name)
    except Exception as err:
        _disable(err)


def _disable(err: BaseException) -> None:
    """The global timers failed: stop them, with one log line."""
    if _state.failed:
        return
    _state.failed = True
    _stop()
    _failed("timing this job", err)


def _stop() -> None:
    """Remove the global forward hooks and close the global run, ignoring their failures."""
    job, _state.job = _state.job, None
    if job is not None:
        job.stop()


def _forward_pre(module: Any, args: Any) -> None:
    job = _state.job
    if job is not None and not _state.framework:
        job.forward_pre(module)


def _forward_post(module: Any, args: Any, output: Any) -> None:
    job = _state.job
    if job is not None:
        job.forward_post(module)


def _optimizer_step(begins: bool, optimizer: Any, args: Any, kwargs: Any) -> None:
    """The global ``Optimizer.step`` pre-hook (``begins``) and post-hook."""
    try:
        job = _active_job(start=begins)
        if job is not None and begins:
            job.steps.optimizer_step_begins()
        elif job is not None:
            job.optimizer_step_ends(optimizer)
    except Exception as err:
        _disable(err)


# ---------------------------------------------------------------------------------------------- frameworks


def _stand_aside() -> None:
    """A framework callback takes over: the global timers stop (a global run already open is closed)."""
    _state.framework = True
    _stop()


def _patch_init(cls: type, before: Callable[[dict[str, Any]], None] | None,
                after: Callable[[Any], None] | None, label: str) -> None:
    """Wrap ``cls.__init__``: ``before(kwargs)`` or ``after(trainer)`` attaches the callback (a failure: one line)."""
    original = cls.__init__  # type: ignore[misc]
    if getattr(original, "__gpu_exporter_auto__", False):
        return

    def attach(step: Callable[[Any], None] | None, arg: Any) -> None:
        try:
            if step is not None:
                step(arg)
        except Exception as err:
            _failed(f"attaching the {label} callback", err)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        attach(before, kwargs)
        original(self, *args, **kwargs)
        attach(after, self)

    __init__.__gpu_exporter_auto__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


def _patch_lightning(module: types.ModuleType, package: str) -> None:
    """``Trainer(callbacks=...)`` gets ``GpuExporterCallback`` of ``package`` unless it has one (Lightning 2's
    ``Trainer`` takes keyword arguments only)."""

    def before(kwargs: dict[str, Any]) -> None:
        from . import lightning

        callback_type = lightning.callback_class(package)
        _stand_aside()
        given = kwargs.get("callbacks")
        callbacks = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        if not any(isinstance(c, lightning.CallbackMixin) for c in callbacks):
            kwargs["callbacks"] = [*callbacks, callback_type(_name())]

    _patch_init(module.Trainer, before, None, "Lightning")


def _patch_transformers(module: types.ModuleType) -> None:
    """A ``Trainer`` gets the Transformers ``GpuExporterCallback`` (``add_callback``) unless it has one."""

    def after(trainer: Any) -> None:
        from . import transformers as integration

        callback_type = integration.GpuExporterCallback
        _stand_aside()
        if not any(isinstance(c, integration.CallbackMixin) for c in trainer.callback_handler.callbacks):
            trainer.add_callback(callback_type(_name()))

    _patch_init(module.Trainer, None, after, "Transformers")


def _name() -> str | None:
    return os.environ.get(NAME_ENV, "").strip() or None


_PATCHES: dict[str, Callable[[types.ModuleType], None]] = {
    _TORCH_OPTIMIZER: _patch_optimizer, "torch": _patch_torch, _TRANSFORMERS_TRAINER: _patch_transformers,
    **{name: functools.partial(_patch_lightning, package=package) for name, package in _LIGHTNING_TRAINERS.items()}}
