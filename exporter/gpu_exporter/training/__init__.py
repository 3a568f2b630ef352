"""Instrument a training loop so the exporter can say *why* its GPU is underused.

Standard library only; torch is used when the job has loaded it. Example::

    from gpu_exporter import training

    run = training.start("resnet50-lr3e-4")      # exporter URL from $GPU_EXPORTER_URL
    for batch in run.data(loader):               # time blocked in next(loader) is phase "data"
        with run.phase("compute"):
            loss = train_step(batch)
        with run.phase("metrics"):
            log_metrics(loss)
        run.step(samples=len(batch))
    run.close()                                  # also happens at interpreter exit

See docs/training.md for the phases, the snapshot schema and honest timing under CUDA.

Importing the package loads only the wire contract (``protocol``); the timing code and the
HTTP pusher load on first use of a name below (:func:`__getattr__`), so the exporter, which imports
``protocol`` for its ingest, carries neither. ``start`` and ``watch_distributed`` are
gpu_exporter.training.session's, ``watch`` is gpu_exporter.training.hooks', ``Run`` and ``Phase``
gpu_exporter.training.run's.

Project imports: none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The four aliased names were the package's attributes when start() was defined here: they stay.
from .protocol import DEFAULT_MAX_CUSTOM_PHASES as DEFAULT_MAX_CUSTOM_PHASES
from .protocol import DEFAULT_URL as DEFAULT_URL
from .protocol import INGEST_PATH as INGEST_PATH
from .protocol import OTHER, STANDARD_PHASES
from .protocol import normalize_url as normalize_url

if TYPE_CHECKING:
    from .hooks import watch
    from .run import Phase, Run
    from .session import start, watch_distributed

__all__ = ["OTHER", "STANDARD_PHASES", "Phase", "Run", "start", "watch", "watch_distributed"]


def __getattr__(name: str) -> Any:
    """``Run``, ``Phase``, ``start``, ``watch_distributed`` and ``watch``, imported on first use.

    The one place the package loads its modules late: the exporter's serve path runs this file
    when it imports ``protocol`` and must not load the timing code (tests/test_footprint.py).
    """
    if name in ("Run", "Phase"):
        from . import run

        return getattr(run, name)
    if name in ("start", "watch_distributed"):
        from . import session

        return getattr(session, name)
    if name == "watch":
        from . import hooks

        return hooks.watch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
