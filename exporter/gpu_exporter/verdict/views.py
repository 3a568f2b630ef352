"""What the verdict reads and what it says: readings from a source, the joined views, the verdict.

A source (:mod:`gpu_exporter.verdict.readings` for exporter scrapes and the collectors,
:mod:`gpu_exporter.commands.diagnose_sources` for Prometheus) fills :class:`Readings`, keyed by
GPU key and (run, rank, GPU key); :func:`gpu_exporter.verdict.join.build_views` joins them into one
:class:`GpuView` per GPU with its :class:`RunView` s; :func:`gpu_exporter.verdict.ladder.judge`
turns a view into a :class:`Verdict`.

The GPU key is the ``uuid`` label, or ``<cluster>/<uuid>`` when the readings come from a fleet
whose series carry the ``cluster_label`` of thresholds.yml (the rules keep clusters apart the
same way); :attr:`GpuView.uuid` is always the plain UUID.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, TypeVar

from gpu_exporter.verdict import remedies
from gpu_exporter.verdict.code import IdleSplit
from gpu_exporter.verdict.hints import Hint, ProcessSignals
from gpu_exporter.verdict.kinds import Finding
from gpu_exporter.verdict.samples import Labels

RunKey = tuple[str, str, str]
"""(run, rank, GPU key)."""

_Frozen = TypeVar("_Frozen")


@cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def evolve(obj: _Frozen, **changes: Any) -> _Frozen:
    """``dataclasses.replace(obj, **changes)`` for the verdict's frozen dataclasses (no ``__post_init__``, every field
    an ``__init__`` argument) without its call of ``__init__``: a fleet-wide diagnose makes about three a GPU.

    >>> from dataclasses import replace
    >>> v = RunView("r", "0", {}, 0.0, False, None, 0.0, 0.0, live=False)
    >>> evolve(v, live=True) == replace(v, live=True), evolve(v, live=True) is not v, v.live
    (True, True, False)
    >>> evolve(v, nope=1)
    Traceback (most recent call last):
    TypeError: RunView has no field nope
    """
    cls: type = type(obj)
    if unknown := changes.keys() - _names(cls):
        raise TypeError(f"{type(obj).__name__} has no field {', '.join(sorted(unknown))}")
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


@dataclass(frozen=True)
class RunView:
    """A training run (rank) on a GPU, over the window, with the causes that apply to it."""

    run: str
    rank: str
    shares: dict[str, float]
    seconds: float
    since_start: bool
    batch_size: float | None
    allocator_retries: float
    allocator_ooms: float
    live: bool = True
    findings: tuple[Finding, ...] = ()
    world_size: int = 1
    step_seconds: float | None = None
    """Mean seconds per training step over the window (None: no step in it)."""
    suggestions: dict[str, str] = field(default_factory=dict)
    """Concrete remedy per cause id, from the run's reported context (gpu_exporter.verdict.remedies)."""
    source: str = ""
    """"sampled": phases estimated from the Python stack by the exporter (gpu_exporter.collectors.stacks)."""
    code: dict[str, float] | None = None
    """The stack sampler's shares of the step in the framework's and the job's own code (verdict/code.py), or None."""


@dataclass(frozen=True)
class Process:
    """A process holding memory on a GPU."""

    pid: str
    name: str
    memory_bytes: float


@dataclass(frozen=True)
class GpuKey:
    """A GPU's key: its cluster (the ``cluster_label``'s value in a fleet; "" for one node) and its UUID, so two
    clusters' GPUs with one UUID stay apart. Its text (``str``) is ``uuid``, or ``<cluster>/<uuid>``: what reports
    print and readings are keyed by; keys sort by their text. False without a UUID.

    >>> str(GpuKey("eu", "GPU-1")), str(GpuKey("", "GPU-1")), GpuKey("eu", "GPU-1").uuid
    ('eu/GPU-1', 'GPU-1', 'GPU-1')
    >>> sorted([GpuKey("b", "GPU-1"), GpuKey("a-b", "GPU-2")]), bool(GpuKey("eu", ""))
    ([GpuKey(cluster='a-b', uuid='GPU-2'), GpuKey(cluster='b', uuid='GPU-1')], False)
    """

    cluster: str
    uuid: str

    def __str__(self) -> str:
        return f"{self.cluster}/{self.uuid}" if self.cluster and self.uuid else self.uuid

    def __bool__(self) -> bool:
        return bool(self.uuid)

    def __lt__(self, other: GpuKey) -> bool:
        return str(self) < str(other)


def gpu_key(cluster: str, uuid: str) -> str:
    """The text of a GPU's :class:`GpuKey`, as readings are keyed.

    >>> gpu_key("eu", "GPU-1"), gpu_key("", "GPU-1")
    ('eu/GPU-1', 'GPU-1')
    """
    return str(GpuKey(cluster, uuid))


@dataclass(frozen=True)
class GpuView:
    """What the verdict knows about one GPU."""

    uuid: str
    gpu: str
    name: str
    node: str
    utilization: float | None
    memory_used_ratio: float | None
    processes: int
    pods: tuple[str, ...]
    runs: tuple[RunView, ...]
    process_list: tuple[Process, ...] = ()
    evidence: tuple[ProcessSignals, ...] = ()
    """What /proc showed of its processes (verdict/evidence.py); ``evidence_hint``: the first hint that
    passed (an id of hints.HINTS) and ``evidence_finding`` its sentence; ``evidence_text`` all processes."""
    evidence_hint: str = ""
    evidence_finding: str = ""
    evidence_text: str = ""
    cluster: str = ""
    """The GPU's ``cluster_label`` value in a fleet read from Prometheus ("" for one node)."""
    sm_active: float | None = None
    """Effective utilization: the whole GPU's SM activity (0-1); None when no source reports it."""
    tensor_active: float | None = None
    dram_active: float | None = None
    """Tensor pipe and DRAM bandwidth activity (0-1); None when unknown."""
    fp32_active: float | None = None
    fp16_active: float | None = None
    fp64_active: float | None = None
    """FP32, FP16, FP64 pipe activity (0-1) from dcgm-exporter's DCGM_FI_PROF_PIPE_FP*_ACTIVE; None where not served."""
    sm_source: str | None = None
    """Where the SM activity came from: ``"gpm"`` (NVML GPM) or ``"dcgm"`` (dcgm-exporter); None when unknown."""
    efficiency_recorded: str = ""
    """The GPU-level cause the recording rules found (diagnose --prometheus-url); "" where none or not read."""

    @property
    def key(self) -> str:
        """The text of the GPU's key (:func:`gpu_key`), as its readings were keyed."""
        return gpu_key(self.cluster, self.uuid)


@dataclass(frozen=True)
class Verdict:
    """The diagnosis of one GPU. ``projected`` is the utilization reachable without the cause; ``suggestion`` the
    concrete remedy with the run's own numbers (gpu_exporter.verdict.remedies), "" without them."""

    name: str
    title: str
    reason: str
    remedy: str = ""
    runbook: str = ""
    below_target: bool = False
    code: str = ""
    level: str = ""
    projected: float | None = None
    suggestion: str = ""
    effective: str = ""
    """The effective-use line (gpu_exporter.verdict.efficiency.effective_line)."""
    worth: float | None = None
    """An efficiency verdict's worth: the share of the GPU between busy and effective (times hours, GPU-hours)."""
    idle: IdleSplit | None = None
    """Below target with a live run: the GPU's idle time split by cause (gpu_exporter.verdict.code.idle_split)."""


@dataclass
class Readings:
    """Everything read from a source, keyed by GPU key or (run, rank, GPU key)."""

    info: list[Labels] = field(default_factory=list)
    utilization: dict[str, float] = field(default_factory=dict)
    memory_used: dict[str, float] = field(default_factory=dict)
    memory_total: dict[str, float] = field(default_factory=dict)
    memory_ratio: dict[str, float] = field(default_factory=dict)
    processes: dict[str, list[Process]] = field(default_factory=dict)
    pods: dict[str, set[str]] = field(default_factory=dict)
    phase_window: dict[RunKey, dict[str, float]] = field(default_factory=dict)
    phase_total: dict[RunKey, dict[str, float]] = field(default_factory=dict)
    retries: dict[RunKey, float] = field(default_factory=dict)
    ooms: dict[RunKey, float] = field(default_factory=dict)
    batch_size: dict[RunKey, float] = field(default_factory=dict)
    world_size: dict[RunKey, float] = field(default_factory=dict)
    step_seconds: dict[RunKey, float] = field(default_factory=dict)
    live: set[RunKey] = field(default_factory=set)
    findings: dict[RunKey, list[Finding]] | None = None
    """Causes read from Prometheus' recording rules; None: judge here with the cause table."""
    evidence: dict[str, list[ProcessSignals]] = field(default_factory=dict)
    hints: dict[tuple[str, str], list[tuple[Hint, float]]] | None = None
    """Evidence hints per (GPU key, pid) from the recording rules; None: apply hints.HINTS here."""
    contexts: dict[RunKey, remedies.Context] = field(default_factory=dict)
    sampled: set[RunKey] = field(default_factory=set)
    """The runs whose phases the exporter sampled (label ``source="sampled"``)."""
    callbacks: dict[RunKey, tuple[str, str, float]] = field(default_factory=dict)
    """The biggest callback hook of each run over the window: (Class.hook, phase, share; verdict/callbacks.py)."""
    code: dict[RunKey, dict[str, float]] = field(default_factory=dict)
    """Each run's shares of framework and host code over the window (the stack sampler's; verdict/code.py)."""
    host_functions: dict[RunKey, tuple[str, float]] = field(default_factory=dict)
    """Each run's biggest function of its own code over the window: (file.py:line:name, share; verdict/code.py)."""
    launches: dict[RunKey, tuple[str, float]] = field(default_factory=dict)
    """(run id, start time) of each run key (gpu_training_run_start_timestamp_seconds; verdict/launches.py)."""
    cluster_label: str = field(kw_only=True)
    """The label the GPU keys were made with (verdict.readings.Keys); "" for one node."""
    sm_active: dict[str, tuple[float, str]] = field(default_factory=dict)
    tensor_active: dict[str, float] = field(default_factory=dict)
    dram_active: dict[str, float] = field(default_factory=dict)
    """Per GPU key: the SM activity with its source ("gpm" or "dcgm"), and that source's tensor pipe and DRAM's."""
    efficiency: dict[str, str] = field(default_factory=dict)
    """The GPU-level cause the recording rules found per GPU key (verdict.efficiency; from Prometheus)."""
    fp_active: dict[str, dict[str, float]] = field(default_factory=dict)
    """The fp pipes' activity per pipe (``"fp32"``, ...: verdict.efficiency.FP_PIPES) and GPU key (dcgm-exporter's)."""
