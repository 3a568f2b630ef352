"""GPU-truthful phase times: the GPU's own time between two phase changes, from CUDA events, never synchronizing.

The problem: CUDA is asynchronous, so a phase clock read on the CPU gives the GPU's work to whichever
phase happens to wait for it (a ``.item()`` in ``metrics``) and hides the time the GPU sat idle while
the CPU prepared the next batch. :class:`GpuClock` records a CUDA event at every phase change and
attributes the time between consecutive events the stream has reached; ``Run`` (training/run.py)
creates one on CUDA (``gpu_timing`` on, ``sync_every`` off), and its event-recording phases call
:meth:`GpuClock.mark`. Standard library only: the events come from ``device.timing_event_factory``.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

FOLD_EVERY = 64
"""Phase changes between the training thread's own folds of the CUDA events the stream has reached
(:class:`GpuClock`): without a reader (a ``Run`` with no pusher) they would pile up, one per change."""


class Named(Protocol):
    """What the clock needs of a phase (a :class:`~gpu_exporter.training.run.Phase`): its name."""

    name: str


class GpuClock:
    """GPU-truthful phases: the GPU's time between two phase changes goes to the phase that began at the first.

    :meth:`mark` records the event (training thread, a few microseconds). The stream reaches it once all the work
    queued before it is done, so the GPU time between two consecutive events is the work queued between them plus
    the time the GPU sat idle waiting for the CPU in that phase. The pusher thread folds in completed events in
    order (:meth:`resolve`, ``query()`` then ``elapsed_time()``, neither of which waits), so:

    * a phase that queues no work (loading a batch, Python metrics) gets exactly the time the GPU
      sat idle while the CPU did it, and nothing while queued work kept the GPU busy;
    * the CPU's wait in a ``.item()`` goes to the phase whose kernels it waited for;
    * a collective's GPU time (under NCCL, the wait for the other ranks too) is ``communication``.

    Resolved seconds only grow, and lag real time by the events not yet reached (usually less than
    a step); :meth:`settle` attributes the rest by the CPU's clock when the run closes.

    Without a reader, :meth:`mark` folds in the reached events itself every :data:`FOLD_EVERY` marks (unless a
    reader is folding: it never waits), so the pending ones stay bounded; completed events are reused.
    """

    def __init__(self, new_event: Callable[[], Any], first: Named, now: float) -> None:
        self._new = new_event
        self._free: list[Any] = []
        self._pending: deque[tuple[Any, Named, float]] = deque()
        self._last: tuple[Any, Named, float] | None = None
        self._lock = threading.Lock()  # readers (pusher, phase_seconds callers); mark() only tries it, never waits
        self._marks = 0
        self.seconds: dict[str, float] = {}
        """GPU-attributed seconds per phase name, up to the last completed event."""
        self.mark(first, now)

    def mark(self, phase: Named, now: float | None = None) -> None:
        """A phase change to ``phase`` now (training thread)."""
        event = self._free.pop() if self._free else self._new()
        event.record()
        self._pending.append((event, phase, perf_counter() if now is None else now))
        self._marks += 1
        if self._marks % FOLD_EVERY == 0 and self._lock.acquire(blocking=False):
            try:
                self._fold()
            finally:
                self._lock.release()

    def resolve(self) -> dict[str, float]:
        """Fold in every event the stream has reached, in order (pusher thread; never waits)."""
        with self._lock:
            return dict(self._fold())

    def _fold(self) -> dict[str, float]:
        pending = self._pending
        while pending:
            event, phase, cpu = pending[0]
            if not event.query():
                break
            pending.popleft()
            last = self._last
            if last is not None:
                self.seconds[last[1].name] = self.seconds.get(last[1].name, 0.0) + last[0].elapsed_time(event) / 1e3
                self._free.append(last[0])
            self._last = (event, phase, cpu)
        return self.seconds

    def settle(self, now: float) -> dict[str, float]:
        """:meth:`resolve`, then the phases not reached yet by the CPU's clock (the final snapshot)."""
        with self._lock:
            seconds = dict(self._fold())
            if self._last is not None:
                marks = [self._last[1:], *((p, t) for _, p, t in list(self._pending)), (None, now)]
                for (phase, t0), (_, t1) in itertools.pairwise(marks):
                    if phase is not None:
                        seconds[phase.name] = seconds.get(phase.name, 0.0) + max(0.0, t1 - t0)
            return seconds
