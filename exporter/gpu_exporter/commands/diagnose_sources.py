"""``diagnose --prometheus-url``'s sources: Readings of a fleet from Prometheus.

Two ways to read the same signals: :func:`from_prometheus` reads the recording rules generated
from the cause table (5m windows: ``gpu:gpu_utilization:avg5m``, ``run:gpu_training_phase:share5m``,
``run:gpu_training_cause:share`` ...) and takes their causes as found; :func:`from_prometheus_window`
computes the rules' signals for any other window from the raw counters and leaves the causes to
the cause table. Both key GPUs by ``cluster_label`` and ``uuid``, as the rules do, so two
clusters' GPUs with the same UUID stay apart (:class:`~gpu_exporter.verdict.readings.Keys`).
"""

from __future__ import annotations

import math

from gpu_exporter import catalog
from gpu_exporter.commands.metrics_client import MetricsError, Prometheus, promql_duration
from gpu_exporter.remedies import read_contexts
from gpu_exporter.verdict import evidence
from gpu_exporter.verdict.causes import BY_ID, Finding
from gpu_exporter.verdict.levels import BY_LEVEL
from gpu_exporter.verdict.readings import INSTANT, Keys, Pairs, instant
from gpu_exporter.verdict.views import Readings


class _Fleet:
    """A Prometheus and the GPU keys of its answers; :meth:`query` puts the key in ``uuid`` for key-blind readers."""

    def __init__(self, prom: Prometheus, cluster_label: str) -> None:
        self.prom = prom
        self.keys = Keys(cluster_label)

    def query(self, expr: str) -> Pairs:
        return self.keys.relabel(self.prom.query(expr))

    def readings(self) -> Readings:
        return Readings(cluster_label=self.keys.cluster_label)


def _live(fleet: _Fleet) -> set[tuple[str, str, str]]:
    return {key for key, value in fleet.keys.per_run(
        fleet.prom.query(f"max without (phase) ({catalog.GPU_TRAINING_CURRENT_PHASE.name})")).items() if value == 1.0}


def from_prometheus_window(prom: Prometheus, seconds: float, cluster_label: str = "") -> Readings:
    """Readings from Prometheus over any window ending at ``prom.at``: the recording rules' signals for it.

    ``rate(gpu_busy_seconds_total[W])`` is ``gpu:gpu_utilization:avg5m`` with the window W, the phases'
    ``increase(...[W])`` give ``run:gpu_training_phase:share5m``'s shares, allocator events are counted over
    W; the causes are then judged with the cause table (``findings`` None). Needs no rules loaded.
    """
    w = promql_duration(seconds)
    prom.require(catalog.GPU_INFO.name, "15m")
    fleet = _Fleet(prom, cluster_label)
    keys = fleet.keys
    readings = instant(fleet.readings(), ((name, prom.query(name)) for name in INSTANT), keys)
    busy = prom.query(f"rate({catalog.GPU_BUSY_SECONDS_TOTAL.name}[{w}])")
    readings.utilization = {u: min(v, 1.0) for u, v in keys.per_gpu(busy).items() if math.isfinite(v)}
    readings.phase_window = keys.phases(prom.query(f"increase({catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name}[{w}])"))
    readings.retries = keys.per_run(prom.query(f"increase({catalog.GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL.name}[{w}])"))
    readings.ooms = keys.per_run(prom.query(f"increase({catalog.GPU_TRAINING_ALLOCATOR_OOMS_TOTAL.name}[{w}])"))
    readings.live = _live(fleet)
    return readings


def from_prometheus(prom: Prometheus, cluster_label: str = "") -> Readings:
    """Readings from Prometheus: the recording rules generated from the cause table, instant values.

    Utilization, memory, phase shares and causes come only from the recording rules (5m windows, at
    ``prom.at``); names, processes, pods and batch sizes from the exporter's instant series.
    """
    prom.require(catalog.GPU_INFO.name, "15m")
    utilization = catalog.GPU_UTILIZATION_AVG5M.name
    if not prom.query(f"count({utilization})"):
        raise MetricsError(f"Prometheus at {prom.base} has no {utilization} series: load the rules "
                           "of prometheus/rules/*.rules.yml (rule_files) so diagnose can read the cause series")
    fleet = _Fleet(prom, cluster_label)
    keys = fleet.keys
    readings = instant(fleet.readings(), ((name, prom.query(name)) for name in INSTANT
                                          if name != catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name), keys)
    readings.utilization = {u: min(v, 1.0) for u, v in keys.per_gpu(prom.query(utilization)).items()
                            if math.isfinite(v)}
    readings.memory_ratio = keys.per_gpu(prom.query(catalog.GPU_MEMORY_USED_RATIO.name))
    shares = prom.query(catalog.RUN_TRAINING_PHASE_SHARE5M.name)
    readings.phase_window = readings.phase_total = keys.phases(shares)
    readings.step_seconds = keys.per_run(prom.query(catalog.RUN_TRAINING_STEP_SECONDS_AVG5M.name))
    readings.live = _live(fleet)
    projected = {(*keys.run(labels), labels.get("cause", "")): value for labels, value in
                 prom.query(catalog.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name)}
    readings.findings = {}
    for labels, value in prom.query(catalog.RUN_TRAINING_CAUSE_SHARE.name):
        cause = BY_ID.get(labels.get("cause", ""))
        if cause is None or labels.get("level") not in BY_LEVEL:
            continue
        key = keys.run(labels)
        readings.findings.setdefault(key, []).append(Finding(
            cause, labels["level"], value, projected.get((*key, cause.cause)), readings.batch_size.get(key),
            straggler=labels.get("straggler_rank", ""), step_seconds=readings.step_seconds.get(key)))
    readings.evidence, readings.hints = evidence.from_series(fleet.query)
    readings.contexts = read_contexts(fleet.query)
    readings.sampled = keys.sampled(shares)
    return readings
