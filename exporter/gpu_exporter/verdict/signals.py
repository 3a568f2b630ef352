"""What the judge reads of one training run (rank) on a GPU over one window: :class:`RunSignals`.

Its one job is the run's signals and the two readings of them that compare ranks:

* ``u``: the GPU's interval-mean utilization (busy seconds / wall seconds; the judge's argument);
* the run's phase shares (``data``, ``compute``, ``metrics``, ``checkpoint``, ... adding up to 1);
* the share of GPU memory used (the judge's argument); caching-allocator retries and OOMs in the window;
* for a distributed run, the ``communication`` share of each of its live ranks: a rank whose
  share exceeds the run's lowest by more than ``straggler_wait_share`` waits for that rank, the
  straggler (ST, :func:`straggler_of`). Its value is that excess (the wait), so the projections of the
  causes hold for it too, and the run's step time if the straggler kept up is this rank's step time times
  ``1 - wait``. The part every rank pays, the run's lowest live communication share (a single rank's own share,
  :func:`common_communication`), is communication-bound (CM) above ``communication_bound_share``: a balanced run
  whose ranks all sit in the all-reduce has no straggler, yet the collectives hold every GPU down. A waiting
  rank's share splits in two: the common part (CM) and its excess over it (ST), never counted twice.

The cause kinds (:mod:`~gpu_exporter.verdict.kinds`) read these; the cause table
(:mod:`~gpu_exporter.verdict.causes`) applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RunSignals", "common_communication", "straggler_of"]


@dataclass(frozen=True)
class RunSignals:
    """What one training run (rank) on a GPU reported over the window (``allocator_retries`` / ``allocator_ooms``:
    events within it, :func:`~gpu_exporter.verdict.causes.find_causes` scales the limit to it)."""

    shares: Mapping[str, float]
    allocator_retries: float = 0.0
    allocator_ooms: float = 0.0
    batch_size: float | None = None
    communication: Mapping[str, float] | None = None
    """ST, CM: the ``communication`` share of every live rank of the same run (rank -> share, this one included)."""
    step_seconds: float | None = None
    """ST: this rank's mean step time over the window, for the run's projected step time."""
    callback: tuple[str, str, float] | None = None
    """CK, CB: the run's biggest callback hook of its own: (Class.hook, its phase, its share of the step)."""
    code: Mapping[str, float] | None = None
    """FO, HW: the shares of the step the training thread ran ``framework`` and ``host`` code (verdict/code.py)."""
    host_function: tuple[str, float] | None = None
    """HW: the run's biggest function of its own code inside compute: (``file.py:line:name``, its share of the step)."""



def straggler_of(communication: Mapping[str, float]) -> tuple[str, float] | None:
    """(rank, communication share) of the rank that waits least in a run of two or more ranks, else None.

    Ties go to the lowest rank label (PromQL's ``bottomk`` picks any one of them).

    >>> straggler_of({"0": 0.7, "1": 0.05, "2": 0.68})
    ('1', 0.05)
    """
    if len(communication) < 2:
        return None
    rank = min(communication, key=lambda r: (communication[r], r))
    return rank, communication[rank]


def common_communication(own: float, communication: Mapping[str, float] | None) -> float:
    """CM: the communication share every rank of the run pays, the lowest of its live ranks (``own`` included).

    A single rank's is its own share; a waiting rank's excess over it is ST's wait, not this.

    >>> common_communication(0.7, {"0": 0.7, "1": 0.05, "2": 0.68}), common_communication(0.4, None)
    (0.05, 0.4)
    """
    return min([own, *(communication or {}).values()])
