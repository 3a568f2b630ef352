"""Readings from a node's own samples: two readings of an exporter (or of the collectors in process).

The source side of the verdict for one node. :func:`from_snapshots` turns two
:class:`~gpu_exporter.verdict.samples.Snapshot` s into :class:`~gpu_exporter.verdict.views.Readings`:
utilization and run activity are the deltas between them. :class:`Keys` and :func:`instant` are
shared with the Prometheus source (commands/diagnose_sources.py), which reads the same series
from a fleet and keys GPUs by cluster as the rules do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_exporter import catalog
from gpu_exporter.training.protocol import OTHER
from gpu_exporter.verdict import evidence, remedies
from gpu_exporter.verdict.callbacks import window_callbacks
from gpu_exporter.verdict.code import window_code
from gpu_exporter.verdict.efficiency import FP_PIPES
from gpu_exporter.verdict.samples import Labels, Snapshot
from gpu_exporter.verdict.views import GpuKey, Process, Readings, RunKey, gpu_key

STALE_SECONDS = 30.0
"""A run that has not pushed for this long (or two windows, if longer) is not live."""

Pairs = list[tuple[Labels, float]]

INSTANT = tuple(f.name for f in (
    catalog.GPU_INFO, catalog.GPU_MEMORY_USED_BYTES, catalog.GPU_MEMORY_TOTAL_BYTES,
    catalog.GPU_PROCESS_MEMORY_USED_BYTES, catalog.GPU_POD_INFO, catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL,
    catalog.GPU_TRAINING_BATCH_SIZE, catalog.GPU_TRAINING_WORLD_SIZE, catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS))
"""The series read as they are (no window): names, memory, processes, pods, run totals and sizes, launches."""


@dataclass(frozen=True, kw_only=True)
class Keys:
    """How a sample's labels name its GPU (:class:`~gpu_exporter.verdict.views.GpuKey`): its ``uuid``, and its
    ``cluster_label``'s value where one is configured ("" for one node); :meth:`gpu` is the key's text.

    >>> Keys(cluster_label="cluster").gpu({"cluster": "eu", "uuid": "GPU-1"})
    'eu/GPU-1'
    >>> Keys(cluster_label="").key({"cluster": "eu", "uuid": "GPU-1"})
    GpuKey(cluster='', uuid='GPU-1')
    """

    cluster_label: str

    def key(self, labels: Labels) -> GpuKey:
        uuid = labels.get("uuid", "")
        cluster = labels.get(self.cluster_label, "") if self.cluster_label and uuid else ""
        return GpuKey(cluster, uuid)

    def gpu(self, labels: Labels) -> str:
        """``str(self.key(labels))`` without the key: a fleet-wide diagnose asks this about 22 times a GPU."""
        uuid = labels.get("uuid", "")
        if self.cluster_label and uuid:
            cluster = labels.get(self.cluster_label, "")
            if cluster:
                return f"{cluster}/{uuid}"
        return uuid

    def relabel(self, pairs: Iterable[tuple[Labels, float]]) -> Pairs:
        """``pairs`` with ``uuid`` set to the GPU key, so key-blind readers (evidence, remedies) keep clusters apart."""
        if not self.cluster_label:
            return list(pairs)
        return [({**labels, "uuid": self.gpu(labels)} if labels.get("uuid") else labels, value)
                for labels, value in pairs]

    def run(self, labels: Labels) -> RunKey:
        return labels.get("run", ""), labels.get("rank", ""), self.gpu(labels)

    def phases(self, pairs: Iterable[tuple[Labels, float]]) -> dict[RunKey, dict[str, float]]:
        out: dict[RunKey, dict[str, float]] = {}
        for labels, value in pairs:
            out.setdefault(self.run(labels), {})[labels.get("phase", OTHER)] = value
        return out

    def per_run(self, pairs: Iterable[tuple[Labels, float]]) -> dict[RunKey, float]:
        return {self.run(labels): value for labels, value in pairs}

    def per_gpu(self, pairs: Iterable[tuple[Labels, float]]) -> dict[str, float]:
        return {self.gpu(labels): value for labels, value in pairs}

    def sampled(self, pairs: Iterable[tuple[Labels, float]]) -> set[RunKey]:
        """The runs whose phases the exporter sampled (label ``source="sampled"``, gpu_exporter.collectors.stacks)."""
        return {self.run(labels) for labels, _ in pairs if labels.get("source") == "sampled"}


def instant(readings: Readings, cur: Iterable[tuple[str, Pairs]], keys: Keys) -> Readings:
    """Fill the instant parts of ``readings`` from (metric name, samples) pairs."""
    for name, pairs in cur:
        if name == catalog.GPU_INFO.name:
            readings.info = [labels for labels, _ in pairs]
        elif name == catalog.GPU_MEMORY_USED_BYTES.name:
            readings.memory_used = keys.per_gpu(pairs)
        elif name == catalog.GPU_MEMORY_TOTAL_BYTES.name:
            readings.memory_total = keys.per_gpu(pairs)
        elif name == catalog.GPU_PROCESS_MEMORY_USED_BYTES.name:
            for labels, value in pairs:
                readings.processes.setdefault(keys.gpu(labels), []).append(
                    Process(labels.get("pid", ""), labels.get("process_name", ""), value))
        elif name == catalog.GPU_POD_INFO.name:
            for labels, _ in pairs:
                readings.pods.setdefault(keys.gpu(labels), set()).add(
                    f"{labels.get('namespace', '')}/{labels.get('pod', '')}")
        elif name == catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name:
            readings.phase_total = keys.phases(pairs)
        elif name == catalog.GPU_TRAINING_BATCH_SIZE.name:
            readings.batch_size = keys.per_run(pairs)
        elif name == catalog.GPU_TRAINING_WORLD_SIZE.name:
            readings.world_size = keys.per_run(pairs)
        elif name == catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS.name:
            readings.launches = {keys.run(labels): (labels.get("run_id", ""), value) for labels, value in pairs}
    return readings


def from_snapshots(prev: Snapshot, cur: Snapshot) -> Readings:
    """Readings from two readings of one exporter: utilization and run activity are the deltas between them. A run is
    live when it reports a current phase and pushed within ``max(STALE_SECONDS, 2 x window)`` of the second reading."""
    keys = Keys(cluster_label="")
    readings = instant(Readings(cluster_label=keys.cluster_label), ((name, cur.series(name)) for name in INSTANT), keys)
    elapsed = cur.at - prev.at
    before = keys.per_gpu(prev.series(catalog.GPU_BUSY_SECONDS_TOTAL.name))
    for uuid, after in keys.per_gpu(cur.series(catalog.GPU_BUSY_SECONDS_TOTAL.name)).items():
        if uuid in before and elapsed > 0 and after >= before[uuid]:
            readings.utilization[uuid] = min((after - before[uuid]) / elapsed, 1.0)
    old_phases = keys.phases(prev.series(catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name))
    for key, phases in readings.phase_total.items():
        old = old_phases.get(key, {})
        restarted = any(phases.get(p, 0.0) < v for p, v in old.items())
        readings.phase_window[key] = {p: v - (0.0 if restarted else old.get(p, 0.0)) for p, v in phases.items()}
    for counter, target in ((catalog.GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL.name, readings.retries),
                            (catalog.GPU_TRAINING_ALLOCATOR_OOMS_TOTAL.name, readings.ooms)):
        old_counts = keys.per_run(prev.series(counter))
        for key, value in keys.per_run(cur.series(counter)).items():
            base = old_counts.get(key, 0.0)
            target[key] = value - base if value >= base else value
    old_steps = keys.per_run(prev.series(catalog.GPU_TRAINING_STEPS_TOTAL.name))
    for key, steps in keys.per_run(cur.series(catalog.GPU_TRAINING_STEPS_TOTAL.name)).items():
        wall = sum(v for v in readings.phase_window.get(key, {}).values() if v > 0)
        if steps > old_steps.get(key, steps) and wall > 0:  # seconds per step: the run's own clock
            readings.step_seconds[key] = wall / (steps - old_steps[key])
    phase_now = cur.series(catalog.GPU_TRAINING_CURRENT_PHASE.name)
    current = set(keys.per_run((labels, value) for labels, value in phase_now if value == 1.0))
    stale = max(STALE_SECONDS, 2 * elapsed)
    pushed = keys.per_run(cur.series(catalog.GPU_TRAINING_LAST_PUSH_TIMESTAMP_SECONDS.name))
    readings.live = {key for key in current if cur.wall - pushed.get(key, cur.wall) <= stale}
    readings.evidence = evidence.from_snapshots(prev, cur)
    readings.contexts = remedies.read_contexts(cur.series)
    readings.sampled = keys.sampled(cur.series(catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name))
    hooks = catalog.GPU_TRAINING_CALLBACK_SECONDS_TOTAL.name
    readings.callbacks = window_callbacks(keys.run, prev.series(hooks), cur.series(hooks), readings.phase_window)
    code = catalog.GPU_TRAINING_CODE_SECONDS_TOTAL.name
    functions = catalog.GPU_TRAINING_HOST_FUNCTION_SECONDS_TOTAL.name
    readings.code, readings.host_functions = window_code(keys.run, prev.series(code), cur.series(code),
                                                         prev.series(functions), cur.series(functions),
                                                         readings.phase_window)
    gpm(readings, cur)
    return readings


GPM_GAUGES = (catalog.GPU_SM_ACTIVE_RATIO, catalog.GPU_TENSOR_ACTIVE_RATIO,
              catalog.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO)
"""The exporter's GPM gauges of SM, tensor pipe and DRAM activity (collectors/gpm.py)."""
DCGM_FIELDS = (catalog.DCGM_SM_ACTIVE, catalog.DCGM_TENSOR_ACTIVE, catalog.DCGM_DRAM_ACTIVE)
"""dcgm-exporter's fields of the same (``diagnose --dcgm-url``)."""


def _activity(readings: Readings, source: str, per_gpu: Iterable[dict[str, float]]) -> None:
    """Fill a GPU's SM, tensor and DRAM activity from ``source`` unless one already did (GPM first)."""
    sm, tensor, dram = per_gpu
    for gpu, value in sm.items():
        if gpu in readings.sm_active:
            continue
        readings.sm_active[gpu] = (value, source)
        for target, values in ((readings.tensor_active, tensor), (readings.dram_active, dram)):
            if gpu in values:
                target[gpu] = values[gpu]


def gpm(readings: Readings, snapshot: Snapshot) -> Readings:
    """The whole GPU's GPM gauges (``mig_uuid=""``) of an exporter's reading (means over its last GPM sample)."""
    keys = Keys(cluster_label=readings.cluster_label)
    _activity(readings, "gpm", (keys.per_gpu((labels, value) for labels, value in snapshot.series(family.name)
                                             if not labels.get("mig_uuid")) for family in GPM_GAUGES))
    return readings


def dcgm(readings: Readings, snapshot: Snapshot) -> Readings:
    """dcgm-exporter's profiling fields (its ``UUID`` label is the GPU's uuid) for the GPUs GPM did not fill: each
    the mean over dcgm-exporter's last collection interval. Its fp pipe fields, where served, for every GPU."""
    def per_gpu(name: str) -> dict[str, float]:
        return {gpu_key("", labels.get(catalog.DCGM_UUID_LABEL, "")): value
                for labels, value in snapshot.series(name) if labels.get(catalog.DCGM_UUID_LABEL)}

    _activity(readings, "dcgm", (per_gpu(field.name) for field in DCGM_FIELDS))
    for pipe in FP_PIPES:
        readings.fp_active.setdefault(pipe.key, {}).update(per_gpu(pipe.series.name))
    return readings

