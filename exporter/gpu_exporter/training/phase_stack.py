"""One phase open at a time for the framework callbacks, and a stack of the phases to return to.

The problem: a framework calls its callbacks' hooks in any nesting (a model forward inside
``training_step``, a ``torch.save`` inside another callback's hook, a metric inside a forward), often
as unpaired events (a pre-hook here, a post-hook there), while :class:`~gpu_exporter.training.run.Phase`
objects nest only as ``with`` blocks do. :class:`PhaseStack` turns each event into one change of the
open phase (``run.switch_to``) and keeps where to return in its own list. The Lightning and
Transformers callbacks and ``training.hooks``' forward and optimizer-step hooks drive it; ``training.hooks``
re-exports it (docs/training.md, "Writing an integration").
"""

from __future__ import annotations

from collections.abc import Callable

from .run import Phase, Run


class PhaseStack:
    """Phase changes for the framework callbacks: one phase open at a time, and a stack of where to return.

    A :class:`Phase` entered again below the top would overwrite its ``_prev``; here the phases to return to are
    this object's own list, so entering a phase that is further down is one more entry like any other.

    >>> from gpu_exporter.training.run import Run
    >>> run = Run("doc", uuid=""); stack = PhaseStack(run)
    >>> compute, metrics = run.phase("compute"), run.phase("metrics")
    >>> with stack.timed(metrics), stack.timed(compute), stack.timed(metrics):
    ...     run.current_phase.name
    'metrics'
    >>> run.current_phase.name
    'other'
    """

    __slots__ = ("_stack", "run", "switch")

    def __init__(self, run: Run) -> None:
        self.run = run
        self._stack: list[Phase] = []
        self.switch: Callable[[Phase], None] = run.switch_to
        """Make a phase the open one (``run.other_phase``: none), leaving the stack as it is."""

    def base(self, phase: Phase) -> None:
        """Switch to ``phase`` and forget where to return (at the loop's fixed points: a batch starts or ends)."""
        self._stack.clear()
        self.switch(phase)

    def push(self, phase: Phase) -> None:
        self._stack.append(self.run.current_phase)
        self.switch(phase)

    def pop(self) -> None:
        self.switch(self._stack.pop() if self._stack else self.run.other_phase)

    def timed(self, phase: Phase, before: Callable[[], None] | None = None) -> _Pushed:
        """A reusable context manager: ``phase`` while inside it, then back to what was open before
        (``before()`` first: a save tells :class:`CallbackTimer` that the hook it runs in writes a checkpoint)."""
        return _Pushed(self, phase, before)


class _Pushed:
    __slots__ = ("_before", "_phase", "_stack")

    def __init__(self, stack: PhaseStack, phase: Phase, before: Callable[[], None] | None = None) -> None:
        self._stack, self._phase, self._before = stack, phase, before

    def __enter__(self) -> None:
        if self._before is not None:
            self._before()
        self._stack.push(self._phase)

    def __exit__(self, *exc: object) -> None:
        self._stack.pop()
