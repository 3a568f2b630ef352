"""Time torch.distributed collectives as the phase ``communication``; find a job's rank and world size.

The problem: in a multi-GPU job (DDP, FSDP, ``torchrun``) one slow rank stalls all the others
inside collectives. Without a phase for that time the waiting ranks report their wait as
``compute`` (with an idle GPU), which reads as "batch too small" on every GPU but the slow one.
This module puts the time a rank spends in collectives into its own standard phase,
``communication``, so the exporter's straggler cause can tell waiting ranks from the rank they
wait for.

One call turns it on, ``training.watch_distributed(run, ddp_model=None)`` (here: :func:`watch`);
``training.start`` makes it for you when ``torch.distributed`` is already initialized (then without
a DDP model: pass that yourself, once, before the first step)::

    dist.init_process_group("nccl")
    run = training.start("llama-ft")                 # rank, world size from the process group
    model = DDP(model, device_ids=[local_rank])
    training.watch_distributed(run, ddp_model=model) # DDP's gradient all-reduce is timed too

Two things are timed, both only while the run is open:

* **torch.distributed functions** (:data:`COLLECTIVES`: all_reduce, all_gather, reduce_scatter,
  broadcast, barrier and their variants) called from the thread that watched the run: each call
  runs inside ``communication``. A call with ``async_op=True`` counts only its launch; the wait
  belongs to whatever phase calls ``Work.wait()``. The functions are wrapped once per process and
  call straight through when no run is watched.
* **DDP's gradient all-reduce**, through a communication hook (``register_comm_hook``) that does
  what DDP's default does (average each gradient bucket over the group) but waits for each bucket
  inside ``communication``. Under gloo (CPU) this gives up the overlap of the all-reduce with the
  rest of the backward pass; under NCCL the wait only orders CUDA streams, so nothing is lost.
  The hook runs on the autograd thread while the training thread waits in ``backward()``, so the
  run's single-writer timing state still has one writer at a time.

Under CUDA, ``communication`` is a phase like the others, so the GPU-truthful phases (training/gpu_clock.py)
count a collective's GPU time in it. Rank and world size: :func:`resolve_rank`, :func:`resolve_world_size`.
Importing this module never imports torch (it uses torch only when the job has imported it).

>>> resolve_world_size(4)
4
>>> watch(object())  # no torch.distributed in this process: nothing to time
False
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from .interfaces import TimedRun
from .protocol import COMMUNICATION, MAX_WORLD_SIZE

log = logging.getLogger("gpu_exporter.training")

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
    "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "all_to_all", "all_to_all_single",
    "reduce", "gather", "scatter",
)
"""The torch.distributed functions whose time is phase ``communication``."""

_lock = threading.Lock()
_watched: dict[str, Any] = {"run": None, "thread": None}
"""The run the wrapped functions time now, and the ident of the thread that watched it."""
_originals: dict[str, Callable[..., Any]] = {}
"""The unwrapped torch.distributed functions, by name (filled by the first :func:`watch`)."""


def _dist() -> Any:
    """``torch.distributed`` if the job imported torch and it is available, else None."""
    try:
        dist = sys.modules["torch"].distributed
        return dist if dist.is_available() else None
    except Exception:  # torch not imported by the job, or built without distributed support
        return None


def initialized() -> bool:
    """True when torch.distributed is imported and its default process group is initialized.

    >>> initialized()
    False
    """
    dist = _dist()
    try:
        return bool(dist is not None and dist.is_initialized())
    except Exception:
        return False


def resolve_rank(explicit: str | int | None) -> str:
    """The rank label: ``explicit``, else ``$RANK``, else the process group's rank, else ``$LOCAL_RANK``, else "0".

    >>> resolve_rank(2)
    '2'
    """
    if explicit is not None:
        return str(explicit)
    if os.environ.get("RANK", "").strip():
        return os.environ["RANK"].strip()
    if initialized():
        return str(_dist().get_rank())
    return os.environ.get("LOCAL_RANK", "").strip() or "0"


def resolve_world_size(explicit: int | None) -> int:
    """Ranks in the job: ``explicit``, else ``$WORLD_SIZE``, else the process group's size, else 1.

    Raises ValueError on a value that is not a whole number from 1 to :data:`MAX_WORLD_SIZE`.

    >>> resolve_world_size(None)
    1
    """
    value: object = explicit
    source = "world_size"
    if value is None and os.environ.get("WORLD_SIZE", "").strip():
        value, source = os.environ["WORLD_SIZE"].strip(), "$WORLD_SIZE"
    if value is None and initialized():
        value, source = _dist().get_world_size(), "the process group's world size"
    if value is None:
        return 1
    try:
        size = int(str(value)) if not isinstance(value, bool) else 0
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_WORLD_SIZE:
        raise ValueError(f"training.start: {source} must be a whole number from 1 to {MAX_WORLD_SIZE}, not {value!r}")
    return size


def watch(run: TimedRun, ddp_model: Any = None) -> bool:
    """Time ``run``'s collectives (and ``ddp_model``'s gradient all-reduce) as ``communication`` from this thread
    (module docstring); True when the job is distributed, else it does nothing. Also sets ``run.world_size`` from
    the process group when neither ``world_size=`` nor ``$WORLD_SIZE`` set it."""
    dist = _dist()
    if dist is None or not initialized():
        return False
    with _lock:
        if not _originals:
            _wrap_functions(dist)
        _watched.update(run=run, thread=threading.get_ident())
    if run.world_size == 1 and not os.environ.get("WORLD_SIZE", "").strip():
        run.world_size = int(dist.get_world_size())
    if ddp_model is not None and getattr(ddp_model, "_gpu_exporter_run", None) is not run:
        try:
            ddp_model.register_comm_hook(state=None, hook=_ddp_hook(run, dist))
        except RuntimeError as err:  # DDP takes one hook: the job registered its own (or trains already)
            log.warning("gpu_exporter.training: DDP's gradient all-reduce is not timed as communication: %s",
                        str(err).splitlines()[0] if str(err) else type(err).__name__)
        else:
            ddp_model._gpu_exporter_run = run
    return True


def unwatch(run: TimedRun) -> None:
    """Stop timing ``run``'s torch.distributed calls (``run.close()`` does this)."""
    with _lock:
        if _watched["run"] is run:
            _watched.update(run=None, thread=None)


def _wrap_functions(dist: Any) -> None:
    """Replace each collective of torch.distributed (and distributed_c10d) with a timed one."""
    modules = [dist, getattr(dist, "distributed_c10d", None)]
    for name in COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue
        _originals[name] = original
        timed = _timed(original)
        for module in modules:
            if module is not None and getattr(module, name, None) is original:
                setattr(module, name, timed)


def _timed(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        run = _watched["run"]
        if run is None or run.closed or _watched["thread"] != threading.get_ident():
            return original(*args, **kwargs)
        with run.phase(COMMUNICATION):
            return original(*args, **kwargs)

    return timed  # functools.wraps set timed.__wrapped__ = original


def _ddp_hook(run: TimedRun, dist: Any) -> Callable[[Any, Any], Any]:
    """A DDP communication hook: average each gradient bucket over the group, timed as ``communication``."""
    torch = sys.modules["torch"]
    all_reduce = _originals.get("all_reduce", dist.all_reduce)
    phase = run.phase(COMMUNICATION)

    def hook(state: Any, bucket: Any) -> Any:
        group = state if state is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size(group))
        if run.closed:
            return all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])
        with phase:
            all_reduce(tensor, group=group, async_op=True).wait()
        done = torch.futures.Future()
        done.set_result(tensor)
        return done

    # DDP checks the hook's annotations; this module's are strings (from __future__ import annotations).
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
    return hook
