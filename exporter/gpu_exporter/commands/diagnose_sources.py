"""``diagnose --prometheus-url``'s sources: Readings of a fleet from Prometheus.

Two ways to read the same signals: :func:`from_prometheus` reads the recording rules generated from the cause table
(5m windows: ``gpu:gpu_utilization:avg5m``, ``run:gpu_training_cause:share`` ...) and takes their causes as found;
:func:`from_prometheus_window` computes the rules' signals for any other window from the raw counters and leaves the
causes to the cause table. Both key GPUs by ``cluster_label`` and ``uuid``, as the rules do, so two clusters' GPUs
with the same UUID stay apart (:class:`~gpu_exporter.verdict.readings.Keys`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gpu_exporter import catalog
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.promql_text import any_of_chunks, promql_duration
from gpu_exporter.verdict import evidence
from gpu_exporter.verdict.callbacks import hook_for
from gpu_exporter.verdict.causes import BATCH_CAUSE, BY_ID, CONTEXT_CAUSES
from gpu_exporter.verdict.code import window_code
from gpu_exporter.verdict.efficiency import FP_PIPES, dram_query, for_cluster, sm_query, tensor_query
from gpu_exporter.verdict.kinds import LABEL as STRAGGLER_LABEL
from gpu_exporter.verdict.kinds import Finding
from gpu_exporter.verdict.levels import BY_LEVEL
from gpu_exporter.verdict.readings import INSTANT, Keys, Pairs, instant
from gpu_exporter.verdict.remedies import GAUGES, read_contexts
from gpu_exporter.verdict.views import Readings

_GPU, _RUN, _PROCESS = ("uuid",), ("run", "rank", "uuid"), ("uuid", "pid")
_READ: dict[str, tuple[str, ...]] = {
    catalog.GPU_INFO.name: ("uuid", "gpu", "name", "node", "instance"),
    **dict.fromkeys((m.name for m in (catalog.GPU_MEMORY_USED_BYTES, catalog.GPU_MEMORY_TOTAL_BYTES,
                                      catalog.GPU_UTILIZATION_AVG5M, catalog.GPU_MEMORY_USED_RATIO)), _GPU),
    **dict.fromkeys((m.name for m in (catalog.GPU_TRAINING_BATCH_SIZE, catalog.GPU_TRAINING_WORLD_SIZE,
                                      catalog.RUN_TRAINING_STEP_SECONDS_AVG5M)), _RUN),
    **dict.fromkeys((m.name for m in (catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL, catalog.RUN_TRAINING_PHASE_SHARE5M)),
                    (*_RUN, "phase", "source")),
    catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS.name: (*_RUN, "run_id"),
    catalog.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name: (*_RUN, "cause"),
    catalog.RUN_TRAINING_CAUSE_SHARE.name: (*_RUN, "cause", "level", STRAGGLER_LABEL),
    catalog.RUN_TRAINING_CALLBACK_SHARE5M.name: (*_RUN, "callback", "phase"),
    catalog.RUN_TRAINING_CODE_SHARE5M.name: (*_RUN, "part"),
    catalog.GPU_POD_INFO.name: ("uuid", "namespace", "pod"),
    catalog.GPU_PROCESS_MEMORY_USED_BYTES.name: (*_PROCESS, "process_name"),
    **dict.fromkeys((m.name for m in (catalog.PROCESS_CPU_RATE5M, catalog.PROCESS_CHILDREN_CPU_RATE5M,
                                      catalog.GPU_PROCESS_CHILD_PROCESSES, catalog.PROCESS_READ_BYTES_RATE5M,
                                      catalog.GPU_PROCESS_CPU_SECONDS_TOTAL,
                                      catalog.GPU_PROCESS_CHILDREN_CPU_SECONDS_TOTAL,
                                      catalog.GPU_PROCESS_READ_BYTES_TOTAL)),
                    _PROCESS),
    **dict.fromkeys((m.name for m in (catalog.PROCESS_MAIN_THREAD_STATE_SHARE5M,
                                      catalog.GPU_PROCESS_MAIN_THREAD_STATE_SECONDS_TOTAL)), (*_PROCESS, "state")),
    catalog.PROCESS_HINT_VALUE.name: (*_PROCESS, "hint"),
    catalog.GPU_SM_ACTIVE_AVG5M.name: ("uuid", "source"),
    catalog.GPU_BUSY_NOT_EFFECTIVE_RATIO.name: ("uuid", "cause"),
}
"""The labels diagnose reads of each series (verdict.readings' Keys and instant, evidence, remedies; of ``gpu_info``
a GPU's view's), besides the cluster label; a rate of a counter keeps the counter's (evidence.rates). Prometheus drops
the others (``max by``: instance, job, node and a target's own labels): at fleet scale that halves the answers."""


def _sent(expr: str, labels: tuple[str, ...] | None, cluster_label: str) -> str:
    if labels is None:
        return expr
    return f"max by ({', '.join((*labels, cluster_label) if cluster_label else labels)}) ({expr})"


_LIVE_NOW = f"{catalog.GPU_TRAINING_CURRENT_PHASE.name} == 1"
"""A series for each run (rank) that reports a current phase, the runs live at ``prom.at``: the window's read."""
_LIVE_RULES = catalog.RUN_USEFUL_UTILIZATION_AVG5M.name
"""A series for each run (rank) the rules found live at their last evaluation, on a GPU with a utilization: the runs
whose cause series :func:`from_prometheus` reads (one series a run, not one a phase: docs/fleet.md)."""


class _Fleet:
    """A Prometheus, the GPU keys of its answers, and the answers to every query of one reading, sent together
    (:meth:`Prometheus.query_many`: a fleet waits for the slowest query, not for their sum)."""

    def __init__(self, prom: Prometheus, cluster_label: str, exprs: Mapping[str, tuple[str, ...] | None],
                 live: str) -> None:
        self.prom = prom
        self.keys = Keys(cluster_label=cluster_label)
        self.live = live
        """The expression with a series for each live run (:data:`_LIVE_NOW`, :data:`_LIVE_RULES`)."""
        self.sent = {expr: _sent(expr, labels, cluster_label)
                     for expr, labels in {catalog.GPU_INFO.name: _READ[catalog.GPU_INFO.name], **exprs,
                                          live: _RUN}.items()}
        self.answers = prom.query_many(list(self.sent.values()))
        if not self.raw(catalog.GPU_INFO.name):
            prom.require(catalog.GPU_INFO.name, "15m")

    def raw(self, expr: str) -> Pairs:
        return self.answers[self.sent[expr]]

    def query(self, expr: str) -> Pairs:
        """:meth:`raw` with the GPU key in ``uuid``, for key-blind readers (evidence, remedies)."""
        return self.keys.relabel(self.raw(expr))

    def remedy_inputs(self, causes: Pairs, readings: Readings) -> None:
        """Fill in the numbers of the concrete remedies (CONTEXT_CAUSES) for the runs found with one of those causes
        (``causes``: the cause series): their context gauges and their GPUs' memory, in two more queries that name
        those runs and GPUs (not a PromQL join, which reads every rank's gauges: docs/fleet.md)."""
        found = [labels for labels, _ in causes if labels.get("cause") in CONTEXT_CAUSES and labels.get("run")]
        if not found:
            return
        cluster = self.keys.cluster_label
        names = "|".join(family.name for family in GAUGES.values())
        # the runs and GPUs named in matchers of at most MATCHER_LIMIT characters each (VictoriaMetrics refuses a
        # longer query), their answers added up
        contexts = [_sent(f'{{__name__=~"{names}", {runs}}}', ("__name__", *_RUN), cluster)
                    for runs in any_of_chunks("run", [labels["run"] for labels in found])]
        gpus = any_of_chunks("uuid", [labels["uuid"] for labels in found if labels.get("uuid")])
        memory = {name: [_sent(f"{name}{{{matcher}}}", _GPU, cluster) for matcher in gpus]
                  for name in (catalog.GPU_MEMORY_USED_BYTES.name, catalog.GPU_MEMORY_TOTAL_BYTES.name)}
        answers = self.prom.query_many([*contexts, *(expr for exprs in memory.values() for expr in exprs)])
        by_name: dict[str, Pairs] = {}
        for labels, value in self.keys.relabel([pair for expr in contexts for pair in answers[expr]]):
            by_name.setdefault(labels.get("__name__", ""), []).append((labels, value))
        readings.contexts = read_contexts(lambda name: by_name.get(name, []))
        readings.memory_used, readings.memory_total = (
            self.keys.per_gpu([pair for expr in exprs for pair in answers[expr]]) for exprs in memory.values())

    def readings(self, names: Iterable[str]) -> Readings:
        """Readings with the instant series ``names`` filled in, and the live runs (a series of :attr:`live`)."""
        readings = instant(Readings(cluster_label=self.keys.cluster_label),
                           ((name, self.raw(name)) for name in names), self.keys)
        readings.live = set(self.keys.per_run(self.raw(self.live)))
        return readings


def _activity(fleet: _Fleet, readings: Readings, sm: str, tensor: str, dram: str, fp: dict[str, str]) -> None:
    """The GPUs' SM activity (with its source), tensor, DRAM and fp pipe activity from the answers to ``sm``,
    ``tensor``, ``dram`` and ``fp`` (each pipe's query by its key; fp pipes only where dcgm-exporter serves them)."""
    keys = fleet.keys
    for labels, value in fleet.raw(sm):
        if math.isfinite(value):
            readings.sm_active[keys.gpu(labels)] = (value, labels.get("source", ""))
    readings.tensor_active = {g: v for g, v in keys.per_gpu(fleet.raw(tensor)).items() if math.isfinite(v)}
    readings.dram_active = {g: v for g, v in keys.per_gpu(fleet.raw(dram)).items() if math.isfinite(v)}
    readings.fp_active = {pipe: {g: v for g, v in keys.per_gpu(fleet.raw(query)).items() if math.isfinite(v)}
                          for pipe, query in fp.items()}


def _reads(names: Iterable[str]) -> dict[str, tuple[str, ...] | None]:
    return {name: _READ.get(name) for name in names}


def from_prometheus_window(prom: Prometheus, seconds: float, *, cluster_label: str) -> Readings:
    """Readings from Prometheus over any window W ending at ``prom.at``: the recording rules' signals computed over W
    from the raw counters (``rate``, ``increase``; the processes' /proc evidence by ``evidence.from_window``), their
    causes and hints left to the cause and evidence tables (``findings`` and ``hints`` None). Needs no rules loaded."""
    w = promql_duration(seconds)
    busy, phases, retries, ooms = (f"{fn}({metric.name}[{w}])" for fn, metric in (
        ("rate", catalog.GPU_BUSY_SECONDS_TOTAL), ("increase", catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL),
        ("increase", catalog.GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL),
        ("increase", catalog.GPU_TRAINING_ALLOCATOR_OOMS_TOTAL)))
    process_rates = {expr: _READ[name] for name, expr in zip(evidence.WINDOWED, evidence.rates(w), strict=True)}
    sm, tensor, dram = (for_cluster(q(w), cluster_label) for q in (sm_query, tensor_query, dram_query))
    fp = {pipe.key: for_cluster(pipe.query(w), cluster_label) for pipe in FP_PIPES}
    code, functions = (f"increase({metric.name}[{w}])" for metric in (  # the stack sampler's (verdict/code.py)
        catalog.GPU_TRAINING_CODE_SECONDS_TOTAL, catalog.GPU_TRAINING_HOST_FUNCTION_SECONDS_TOTAL))
    fleet = _Fleet(prom, cluster_label, {**_reads((*INSTANT, catalog.GPU_PROCESS_CHILD_PROCESSES.name)), busy: _GPU,
                                         phases: (*_RUN, "phase"), retries: _RUN, ooms: _RUN, **process_rates,
                                         sm: None, tensor: None, dram: None, **dict.fromkeys(fp.values()),
                                         code: (*_RUN, "part"),
                                         functions: (*_RUN, "function")},
                   _LIVE_NOW)
    keys = fleet.keys
    readings = fleet.readings(INSTANT)
    readings.utilization = {u: min(v, 1.0) for u, v in keys.per_gpu(fleet.raw(busy)).items() if math.isfinite(v)}
    readings.phase_window = keys.phases(fleet.raw(phases))
    readings.retries = keys.per_run(fleet.raw(retries))
    readings.ooms = keys.per_run(fleet.raw(ooms))
    readings.code, readings.host_functions = window_code(keys.run, (), fleet.raw(code), (), fleet.raw(functions),
                                                         readings.phase_window)
    readings.evidence = evidence.from_window(fleet.query, w)
    _activity(fleet, readings, sm, tensor, dram, fp)
    return readings


_RULES = tuple(m.name for m in (
    catalog.GPU_UTILIZATION_AVG5M, catalog.GPU_MEMORY_USED_RATIO, catalog.RUN_TRAINING_PHASE_SHARE5M,
    catalog.RUN_TRAINING_STEP_SECONDS_AVG5M, catalog.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION,
    catalog.RUN_TRAINING_CAUSE_SHARE))
"""The recording rules :func:`from_prometheus` reads."""


def from_prometheus(prom: Prometheus, *, cluster_label: str, launches: bool = True,
                    sm_active_low: float | None = None, utilization_target: float = 0.0) -> Readings:
    """Readings from Prometheus: the recording rules generated from the cause table (5m windows, at ``prom.at``) for
    utilization, memory, phase shares and causes (the GPU-level ones too, where ``gpu:gpu_busy_not_effective:ratio``
    has them); names, processes, pods and batch sizes from the exporter's instant series, every query sent at once.
    The runs' launches only with ``launches`` (``--run``, ``--run-id``; a fleet-wide read skips their series).
    With ``sm_active_low`` the live runs that may get the batch suggestion of the SM form of M3 (verdict/efficiency.py)
    get their context read too: a run with no cause of its own on a GPU at or above ``utilization_target`` whose SM
    activity is below ``sm_active_low``, not every run below the line (docs/fleet.md)."""
    skip = {catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name,  # the rules' shares instead
            catalog.GPU_MEMORY_USED_BYTES.name, catalog.GPU_MEMORY_TOTAL_BYTES.name}  # remedy_inputs reads them
    if not launches:
        skip.add(catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS.name)
    names = tuple(name for name in INSTANT if name not in skip)
    tensor, dram = (for_cluster(q(), cluster_label) for q in (tensor_query, dram_query))
    fp = {pipe.key: for_cluster(pipe.query(), cluster_label) for pipe in FP_PIPES}
    fleet = _Fleet(prom, cluster_label, {**_reads((*names, *_RULES, *evidence.SERIES, catalog.GPU_SM_ACTIVE_AVG5M.name,
                                                   catalog.GPU_BUSY_NOT_EFFECTIVE_RATIO.name,
                                                   catalog.RUN_TRAINING_CALLBACK_SHARE5M.name,
                                                   catalog.RUN_TRAINING_CODE_SHARE5M.name)),
                                         tensor: None, dram: None, **dict.fromkeys(fp.values())},
                   _LIVE_RULES)
    utilization, memory, shares, step, projected, causes = (fleet.raw(name) for name in _RULES)
    if not utilization:
        raise MetricsError(f"Prometheus at {prom.base} has no {_RULES[0]} series: load the rules "
                           "of prometheus/rules/*.rules.yml (rule_files) so diagnose can read the cause series")
    keys = fleet.keys
    readings = fleet.readings(names)
    readings.utilization = {u: min(v, 1.0) for u, v in keys.per_gpu(utilization).items() if math.isfinite(v)}
    readings.memory_ratio = keys.per_gpu(memory)
    readings.phase_window = readings.phase_total = keys.phases(shares)
    readings.step_seconds = keys.per_run(step)
    projections = {(*keys.run(labels), labels.get("cause", "")): value for labels, value in projected}
    readings.callbacks = {keys.run(labels): (labels.get("callback", ""), labels.get("phase", ""), value)
                          for labels, value in fleet.raw(catalog.RUN_TRAINING_CALLBACK_SHARE5M.name)}
    for labels, value in fleet.raw(catalog.RUN_TRAINING_CODE_SHARE5M.name):  # the idle time's split (verdict/code.py)
        readings.code.setdefault(keys.run(labels), {})[labels.get("part", "")] = value
    readings.findings = {}
    for labels, value in causes:
        cause = BY_ID.get(labels.get("cause", ""))
        if cause is None or labels.get("level") not in BY_LEVEL:
            continue
        key = keys.run(labels)
        readings.findings.setdefault(key, []).append(Finding(
            cause, labels["level"], value, projections.get((*key, cause.cause)), readings.batch_size.get(key),
            straggler=labels.get(STRAGGLER_LABEL, ""), step_seconds=readings.step_seconds.get(key),
            callback=hook_for(cause.phase, readings.callbacks.get(key))))
    readings.evidence, readings.hints = evidence.from_series(fleet.query)
    _activity(fleet, readings, catalog.GPU_SM_ACTIVE_AVG5M.name, tensor, dram, fp)
    readings.efficiency = {keys.gpu(labels): labels.get("cause", "")  # the GPU-level causes as the rules found them
                           for labels, _ in fleet.raw(catalog.GPU_BUSY_NOT_EFFECTIVE_RATIO.name)}
    with_cause = {keys.run(labels) for labels, _ in causes}
    low = [] if sm_active_low is None else [  # the SM form of M3's batch suggestion reads the run's context too
        ({**labels, "cause": BATCH_CAUSE}, 0.0) for labels, _ in fleet.raw(fleet.live)
        if keys.run(labels) not in with_cause
        and readings.utilization.get(gpu := keys.gpu(labels), 0.0) >= utilization_target
        and (sm := readings.sm_active.get(gpu)) is not None and sm[0] < sm_active_low]
    fleet.remedy_inputs([*causes, *low], readings)
    readings.sampled = keys.sampled(shares)
    return readings
