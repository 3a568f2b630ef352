"""A training run: phase timers on the hot path, cumulative snapshots for the pusher.

Concurrency design (single writer, no lock on the hot path): only the training thread
writes the timing state (``Phase.seconds``, ``Run._current``, ``Run._since``). ``_since``,
the clock reading of the last change, doubles as a seqlock: a phase change first sets it to
None (a change is in progress), then updates the rest, then stores the new clock reading, a
new float object. The pusher thread copies the state and keeps the copy only if ``_since``
was not None and is the *same object* after the copy (a live object's identity cannot be
reused, so any change in between shows), else it copies again. A torn copy could otherwise
count the time since the last change twice and make a counter go down in the next
snapshot, which the exporter rejects. The writer reads the clock only *after* marking the
change in progress: a reader whose copy survives the check read its clock before the mark,
so before the writer's clock, and never extends the open phase past the instant the writer
then records. (Reading the clock first let a reader slip in between, report more time than
the writer then stored, and the next snapshot went down.) Under the GIL every attribute
store is atomic and seen in program order, so this is enough; the writer never waits for
the reader.

Example::

    >>> run = Run("demo")
    >>> with run.phase("compute"):
    ...     pass
    >>> run.step(samples=32)
    >>> run.snapshot()["steps"]
    1
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar

from . import context as _context
from . import device as _device
from . import distributed as _distributed
from . import identity as _identity
from . import sampler as _sampler
from . import snapshot as _snapshot
from .gpu_clock import FOLD_EVERY as FOLD_EVERY  # re-exported
from .gpu_clock import GpuClock as GpuClock  # re-exported
from .protocol import DATA, MAX_LABEL_LENGTH, OTHER, STANDARD_PHASES, check_label
from .protocol import DEFAULT_MAX_CUSTOM_PHASES as DEFAULT_MAX_CUSTOM_PHASES  # re-exported

if TYPE_CHECKING:
    from .pusher import Pusher

T = TypeVar("T")

_reporting: weakref.WeakSet[Run] = weakref.WeakSet()
"""The runs with a pusher (:meth:`Run.attach`)."""


def _after_fork_in_child() -> None:
    """Forked children (DataLoader workers) inherit the runs but must never report as the parent."""
    for run in list(_reporting):
        run._closed = True
        run._pusher = None


os.register_at_fork(after_in_child=_after_fork_in_child)


class Phase:
    """One named phase of a run: a reusable context manager that adds its time to the run.

    Nesting is allowed and exclusive: inside ``compute``, a ``metrics`` block pauses
    ``compute``, so the phases still add up to wall time. Keep the object to skip the
    name lookup in tight loops::

        compute = run.phase("compute")
        for batch in run.data(loader):
            with compute:
                loss = model(batch)
    """

    __slots__ = ("_depth", "_prev", "_run", "name", "seconds")

    def __init__(self, run: Run, name: str) -> None:
        self._run = run
        self.name = name
        self.seconds = 0.0
        """Seconds spent in this phase, finished visits only (the pusher adds the open one)."""
        self._prev: Phase | None = None
        self._depth = 0

    def __enter__(self) -> Phase:
        run = self._run
        current = run._current
        if current is self:  # re-entered while already current: only count the depth
            self._depth += 1
            return self
        since = run._since
        run._since = None  # change in progress; only now read the clock (module docstring)
        now = perf_counter()
        current.seconds += now - since  # type: ignore[operator]  # the writer never sees its own mark
        self._prev = current
        run._current = self
        run._since = now
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        run = self._run
        if self._depth:
            self._depth -= 1
            return
        if run._current is not self:  # exited out of order: leave the state alone
            return
        since = run._since
        run._since = None  # the mark first, then the clock: see the module docstring
        now = perf_counter()
        self.seconds += now - since  # type: ignore[operator]  # the writer never sees its own mark
        run._current = self._prev  # type: ignore[assignment]  # set on enter, never None here
        run._since = now

    # The integration API: what a framework callback or hook needs to drive the phases from events
    # it does not pair itself (a pre-hook here, a post-hook there). Every change still goes through
    # __enter__/__exit__ above, so the seqlock of the module docstring holds by construction.

    @property
    def run(self) -> Run:
        """The run this phase adds its time to."""
        return self._run

    @property
    def is_open(self) -> bool:
        """True while this is the run's open phase (:attr:`Run.current_phase`)."""
        return self._run._current is self

    def open(self) -> bool:
        """Enter this phase unless it is the open one already; True if this call entered it.

        Unlike ``with phase:`` it never counts a nested entry, so one :meth:`close` ends it.

        >>> run = Run("demo", uuid=""); compute = run.phase("compute")
        >>> compute.open(), compute.open(), run.current_phase.name
        (True, False, 'compute')
        """
        if self._run._current is self:
            return False
        self.__enter__()
        return True

    def close(self) -> None:
        """Leave this phase if it is the open one, however often it was entered again (back to the phase
        that was open before it); else do nothing.

        >>> run = Run("demo", uuid=""); compute = run.phase("compute")
        >>> with compute, compute:
        ...     compute.close(); run.current_phase.name
        'other'
        """
        if self._run._current is self:
            self._depth = 0
            self.__exit__(None, None, None)


class _SyncPhase(Phase):
    """A Phase that first waits for queued CUDA work (see ``sync_every``).

    ``Run.step`` switches the class of its phases on the steps that synchronise, so the plain
    path pays nothing for the option.
    """

    __slots__ = ()

    def __enter__(self) -> Phase:
        self._run._synchronize()
        return Phase.__enter__(self)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._run._synchronize()
        Phase.__exit__(self, exc_type, exc, tb)


class _EventPhase(Phase):
    """A Phase that records a CUDA event at each phase change (GPU-truthful phases, :class:`GpuClock`)."""

    __slots__ = ()

    def __enter__(self) -> Phase:
        run = self._run
        before = run._current
        Phase.__enter__(self)
        if run._current is not before:  # the change's clock reading is run._since: no second perf_counter()
            run._gpu.mark(self, run._since)  # type: ignore[union-attr]  # set whenever this class is used
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        run = self._run
        before = run._current
        Phase.__exit__(self, exc_type, exc, tb)
        if run._current is not before:
            run._gpu.mark(run._current, run._since)  # type: ignore[union-attr]


class Run(AbstractContextManager["Run"]):
    """Timing state of one training process (one run, one rank); create it with ``training.start``.

    ``Run`` itself does no I/O; ``start()`` attaches the background pusher (:meth:`attach`; module docstring).
    """

    def __init__(self, name: str, *, rank: str | int | None = None, uuid: str | None = None,
                 device: int | None = None, sync_every: int = 0, gpu_timing: bool = True,
                 max_custom_phases: int = DEFAULT_MAX_CUSTOM_PHASES, world_size: int | None = None,
                 run_id: str | None = None, tags: dict[str, str] | None = None) -> None:
        rank_label = _distributed.resolve_rank(rank)
        _identity.check_labels(name, rank_label, uuid)
        if sync_every < 0:
            raise ValueError(f"training.start: sync_every must be 0 (off) or > 0, not {sync_every}")
        if max_custom_phases < 0:
            raise ValueError(f"training.start: max_custom_phases must be >= 0, not {max_custom_phases}")
        self.run_id, self.run_id_source = _identity.resolve_run_id(run_id)
        """This launch's id, shared by the job's ranks, and where it came from (training/identity.py)."""
        self.tags = _identity.resolve_tags(tags)
        """The user's tags (validated; ``$GPU_EXPORTER_TAGS`` updated by ``tags=``)."""
        self.name = name
        self.rank = rank_label
        self.world_size = _distributed.resolve_world_size(world_size)
        """Ranks in the job (1 unless distributed); every snapshot carries it."""
        self.started_at = time.time()
        self.steps = self.samples = self.batch_size = 0
        self._identity = _device.GpuIdentity(uuid, device)
        self._pid = os.getpid()
        self._thread = threading.get_ident()
        """The training thread: the one that creates the run (the stack sampler reads its stack)."""
        self._sampler: _sampler.StackSampler | None = None
        self._closed = False
        self._max_custom = max_custom_phases
        self._sync_now = False
        self._sync_every = sync_every
        self._sync_fn: Callable[[], None] | None = None
        self._start = perf_counter()  # the run's wall time includes the GPU timing's set-up, as it always did
        self._since: float | None = self._start
        """Clock reading of the last phase change; None while one is in progress (module docstring)."""
        new_event = _device.timing_event_factory() if gpu_timing and not sync_every else None
        self._phase_class: type[Phase] = Phase if new_event is None else _EventPhase
        self._other = self._phase_class(self, OTHER)
        self._phases: dict[str, Phase] = {OTHER: self._other}
        self._order: list[Phase] = [self._other]
        for standard in STANDARD_PHASES:
            self._add_phase(standard)
        self._current: Phase = self._other
        self._gpu = None if new_event is None else GpuClock(new_event, self._other, self._start)
        """GPU-truthful phases (CUDA, ``sync_every`` off): see :class:`GpuClock`."""
        self._allocator: Callable[[int], dict[str, int] | None] = _device.allocator_stats
        self._pusher: Pusher | None = None
        self.callback_report: Callable[[], list[dict[str, Any]]] | None = None
        """Set by a framework integration that times the job's callback hooks (training/callbacks.py,
        ``CallbackTimer.snapshot``): the snapshot's ``callbacks`` field, called on the pusher thread."""

    def attach(self, pusher: Pusher) -> None:
        """Report through ``pusher`` from now on: start it, and stop it at ``close()`` or interpreter exit
        (``training.start`` does this). A forked child's copy of the run never reports. One pusher per run."""
        if self._pusher is not None or self._closed:
            raise ValueError(f"training: run {self.name!r} is closed or has a pusher already")
        rate = _sampler.rate_from_env()  # a bad $GPU_EXPORTER_STACK_SAMPLING_HZ fails before anything starts
        self._pusher = pusher
        _reporting.add(self)
        atexit.register(self.close)
        pusher.start()
        if rate:  # whose code runs in compute/other (causes FO, HW): training/sampler.py
            self._sampler = _sampler.StackSampler(self._thread, lambda: self._current.name, rate,
                                                  self.cpu_phase_seconds)
            self._sampler.start()

    @property
    def pusher(self) -> Pusher | None:
        """The pusher :meth:`attach` started; None before, after ``close()`` and in a forked child."""
        return self._pusher

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True after ``close()``, and always in a forked child (which never reports)."""
        return self._closed

    def close(self) -> None:
        """Stop pushing and send the final snapshot (bounded by the push timeout); also runs at exit.

        In a forked child (a DataLoader worker) this does nothing: only the parent reports.

        >>> run = Run("demo"); run.close(); run.closed
        True
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        _distributed.unwatch(self)
        pusher, self._pusher = self._pusher, None
        if self._sampler is not None:
            self._sampler.stop()
        if pusher is not None and os.getpid() == self._pid:
            pusher.stop()

    @property
    def current_phase(self) -> Phase:
        """The open phase (:attr:`other_phase` when no named phase is open). Integrations read it on the
        training thread to decide a change; change it only through a :class:`Phase` (``with``, ``open``, ``close``).

        >>> run = Run("demo", uuid="")
        >>> with run.phase("data"):
        ...     run.current_phase.name
        'data'
        """
        return self._current

    @property
    def other_phase(self) -> Phase:
        """The ``other`` phase: time outside every named phase (``run.phase("other")`` is the same object)."""
        return self._other

    def close_phases(self) -> None:
        """Close every open phase (one a failed backward or an unfinished save left), back to ``other``.

        >>> run = Run("demo", uuid=""); run.phase("compute").open(); run.phase("metrics").open()
        True
        True
        >>> run.close_phases(); run.current_phase.name
        'other'
        """
        other = self._other
        while (current := self._current) is not other:  # Phase.close() of each, inline: integrations' hot path
            current._depth = 0
            current.__exit__(None, None, None)

    def switch_to(self, phase: Phase) -> None:
        """Make ``phase`` the open phase: close every open phase, then enter ``phase`` (``other_phase``: none).

        What a framework callback does at an event that ends one phase and begins another (hooks.PhaseStack).

        >>> run = Run("demo", uuid=""); run.phase("compute").open(); run.phase("metrics").open()
        True
        True
        >>> run.switch_to(run.phase("data")); run.current_phase.name, run.phase("compute").is_open
        ('data', False)
        """
        if self._current is not phase:
            self.close_phases()
            if phase is not self._other:
                phase.__enter__()

    def _add_phase(self, name: str) -> Phase:
        phase = _SyncPhase(self, name) if self._sync_now else self._phase_class(self, name)
        self._phases[name] = phase
        self._order.append(phase)  # list.append is atomic: the pusher iterates a copy
        return phase

    def phase(self, name: str) -> Phase:
        """The context manager for phase ``name`` (standard: data, compute, metrics, checkpoint).

        A new name adds a custom phase, up to ``max_custom_phases``; beyond that, ValueError.

        >>> run = Run("demo")
        >>> with run.phase("compute"):
        ...     pass
        """
        if (phase := self._phases.get(name)) is not None:
            return phase
        if (problem := check_label("phase name", name, MAX_LABEL_LENGTH)) is not None:
            raise ValueError(f"run.phase: {problem}")
        if len(self._phases) - 1 - len(STANDARD_PHASES) >= self._max_custom:
            raise ValueError(f"run.phase: cannot add phase {name!r}: the run already has {self._max_custom} "
                             f"custom phases (max_custom_phases); reuse one of {sorted(self._phases)}")
        return self._add_phase(name)

    def data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate ``iterable``, counting the time blocked in ``next()`` as phase ``data``.

        >>> run = Run("demo")
        >>> [x for x in run.data([1, 2])]
        [1, 2]
        """
        _context.note_loader(self, iterable)  # num_workers, pin_memory, ... for concrete remedies
        iterator = iter(iterable)
        phase = self._phases[DATA]
        while True:
            with phase:
                try:
                    item = next(iterator)
                except StopIteration:
                    return
            yield item

    def step(self, samples: int = 0) -> None:
        """Count one finished training step of ``samples`` samples (also the current batch size).

        >>> run = Run("demo"); run.step(samples=64); run.batch_size
        64
        """
        self.steps = steps = self.steps + 1
        if samples:
            self.samples += samples
            self.batch_size = samples
        if self._sync_every:
            sync_now = steps % self._sync_every == 0
            if sync_now != self._sync_now:
                self._sync_now = sync_now
                cls = _SyncPhase if sync_now else Phase
                for phase in self._order:
                    phase.__class__ = cls

    def _synchronize(self) -> None:
        if self._sync_fn is None:
            self._sync_fn = _device.synchronizer(self.identity()[1]) or _no_sync
        self._sync_fn()

    def identity(self) -> tuple[str, int]:
        """(GPU UUID or "", CUDA device index), found once on first use (may ask torch or NVML).

        >>> Run("demo", uuid="GPU-1").identity()[0]
        'GPU-1'
        """
        return self._identity()

    def phase_seconds(self, finished: bool = False) -> dict[str, float]:
        """Seconds per phase so far, what the exporter's causes read; they add up to wall time since start.

        On CUDA (with ``sync_every`` off) these are GPU-truthful (:class:`GpuClock`): up to the last phase
        change the GPU has reached, or, with ``finished``, the rest by the CPU's clock. Otherwise they
        are :meth:`cpu_phase_seconds`. Safe to call from any thread.

        >>> sorted(Run("demo").phase_seconds())
        ['checkpoint', 'communication', 'compute', 'data', 'metrics', 'other']
        """
        gpu = self._gpu
        if gpu is None:
            return self.cpu_phase_seconds()
        attributed = gpu.settle(perf_counter()) if finished else gpu.resolve()
        return {phase.name: attributed.get(phase.name, 0.0) for phase in list(self._order)}

    def cpu_phase_seconds(self) -> dict[str, float]:
        """Seconds per phase by the CPU's clock, the open phase included; they add up to wall time since start.

        Safe to call from any thread (see the module docstring).

        >>> sorted(Run("demo").cpu_phase_seconds())
        ['checkpoint', 'communication', 'compute', 'data', 'metrics', 'other']
        """
        while True:
            since = self._since
            if since is None:
                time.sleep(0)  # a phase change is half done: let the training thread finish it
                continue
            now = perf_counter()
            current = self._current
            seconds = {phase.name: phase.seconds for phase in list(self._order)}
            if self._since is since:  # no change began since `since` was read
                seconds[current.name] += now - since
                return seconds

    def snapshot(self, finished: bool = False) -> dict[str, Any]:
        """The cumulative JSON document the pusher sends (training/snapshot.py; schema in docs/training.md).

        >>> Run("demo", uuid="").snapshot()["current_phase"]
        'other'
        """
        return _snapshot.document(self, finished, self._pid, None if self._gpu is None else self.cpu_phase_seconds,
                                  self._allocator, self._sampler)


def _no_sync() -> None:
    """Stand-in synchronizer without CUDA: nothing is queued, so nothing to wait for."""
