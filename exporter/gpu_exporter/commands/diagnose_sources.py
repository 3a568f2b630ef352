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
        fleet.prom.query("max without (phase) (gpu_training_current_phase)")).items() if value == 1.0}


def from_prometheus_window(prom: Prometheus, seconds: float, cluster_label: str = "") -> Readings:
    """Readings from Prometheus over any window ending at ``prom.at``: the recording rules' signals for it.

    ``rate(gpu_busy_seconds_total[W])`` is ``gpu:gpu_utilization:avg5m`` with the window W, the phases'
    ``increase(...[W])`` give ``run:gpu_training_phase:share5m``'s shares, allocator events are counted over
    W; the causes are then judged with the cause table (``findings`` None). Needs no rules loaded.
    """
    w = promql_duration(seconds)
    prom.require("gpu_info", "15m")
    fleet = _Fleet(prom, cluster_label)
    keys = fleet.keys
    readings = instant(fleet.readings(), ((name, prom.query(name)) for name in INSTANT), keys)
    readings.utilization = {u: min(v, 1.0) for u, v in keys.per_gpu(prom.query(f"rate(gpu_busy_seconds_total[{w}])"))
                            .items() if math.isfinite(v)}
    readings.phase_window = keys.phases(prom.query(f"increase(gpu_training_phase_seconds_total[{w}])"))
    readings.retries = keys.per_run(prom.query(f"increase(gpu_training_allocator_retries_total[{w}])"))
    readings.ooms = keys.per_run(prom.query(f"increase(gpu_training_allocator_ooms_total[{w}])"))
    readings.live = _live(fleet)
    return readings


def from_prometheus(prom: Prometheus, cluster_label: str = "") -> Readings:
    """Readings from Prometheus: the recording rules generated from the cause table, instant values.

    Utilization, memory, phase shares and causes come only from the recording rules (5m windows, at
    ``prom.at``); names, processes, pods and batch sizes from the exporter's instant series.
    """
    prom.require("gpu_info", "15m")
    if not prom.query("count(gpu:gpu_utilization:avg5m)"):
        raise MetricsError(f"Prometheus at {prom.base} has no gpu:gpu_utilization:avg5m series: load the rules "
                           "of prometheus/rules/*.rules.yml (rule_files) so diagnose can read the cause series")
    fleet = _Fleet(prom, cluster_label)
    keys = fleet.keys
    readings = instant(fleet.readings(), ((name, prom.query(name)) for name in INSTANT
                                          if name != "gpu_training_phase_seconds_total"), keys)
    readings.utilization = {u: min(v, 1.0) for u, v in keys.per_gpu(prom.query("gpu:gpu_utilization:avg5m")).items()
                            if math.isfinite(v)}
    readings.memory_ratio = keys.per_gpu(prom.query("gpu:gpu_memory_used:ratio"))
    shares = prom.query("run:gpu_training_phase:share5m")
    readings.phase_window = readings.phase_total = keys.phases(shares)
    readings.step_seconds = keys.per_run(prom.query("run:gpu_training_step_seconds:avg5m"))
    readings.live = _live(fleet)
    projected = {(*keys.run(labels), labels.get("cause", "")): value for labels, value in
                 prom.query("run:gpu_training_cause:projected_utilization")}
    readings.findings = {}
    for labels, value in prom.query("run:gpu_training_cause:share"):
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
