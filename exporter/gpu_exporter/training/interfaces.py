"""What the distributed timers and the pusher need of a run: the :class:`~gpu_exporter.training.run.Run` they are given.

``run`` imports ``distributed`` (rank, world size, unwatch at close) and names ``pusher``'s type
(``Run.attach``, ``Run.pusher``); these two modules take a run described here instead of importing
``run`` back, so the package's import graph goes one way (tests/test_import_graph.py). Standard
library only; nothing here runs at import beyond the class statements.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol


class TimedRun(Protocol):
    """A run whose collectives ``distributed`` times as phase ``communication``."""

    world_size: int

    @property
    def closed(self) -> bool: ...

    def phase(self, name: str) -> AbstractContextManager[Any]: ...


class PushedRun(Protocol):
    """A run whose snapshots ``pusher`` sends: its name, the process that reports it and its snapshot."""

    name: str
    _pid: int

    def snapshot(self, finished: bool = False) -> dict[str, Any]: ...
