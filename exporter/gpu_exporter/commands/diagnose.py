"""``gpu-exporter diagnose``: one verdict per GPU on why it is below the utilization target.

Reads a node's exporter (two scrapes ``--window`` apart) or Prometheus (``rate()`` and
``increase()`` over ``--window``, for a fleet, a node, a namespace or a training run), joins
the ``gpu_training_*`` series of the runs on each GPU by ``uuid``, and judges every GPU with the
thresholds the alert rules are generated from (:mod:`gpu_exporter.thresholds`):

========================  ====================================================================
verdict                   when
========================  ====================================================================
healthy                   utilization at or above ``utilization_low_threshold``
allocator trouble (M4)    a run's allocator hit an OOM, or retried more than
                          ``allocator_retries_threshold`` times per ``allocator_window``
input-bound (M1)          below target; a run spends more than ``input_bound_share`` in ``data``
metrics-bound (M2)        below target; a run spends more than ``metrics_bound_share`` in ``metrics``
batch too small (M3)      below target; ``compute`` above ``batch_compute_share`` while memory
                          used is below ``batch_memory_used_ratio``
idle but allocated        below ``idle_utilization_threshold`` while work holds the GPU
not instrumented          below target, work on the GPU, but no training run reports
underutilized             below target, instrumented, but no single cause passes its threshold
unused                    no memory, process or run on the GPU (not counted as below target)
unknown                   NVML reports no utilization (GPUs in MIG mode)
========================  ====================================================================

Exit status: 0 when no GPU with work is below target, 1 when one is, 2 on bad input or an
unreachable source. Example::

    $ gpu-exporter diagnose --url http://127.0.0.1:9445 --window 30s
    $ gpu-exporter diagnose --prometheus-url http://prometheus:9090 --namespace ml-team --output json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from gpu_exporter.commands.metrics_client import (
    ExporterSource,
    Labels,
    MetricsError,
    Prometheus,
    Snapshot,
    fail,
    read_after,
)
from gpu_exporter.thresholds import Thresholds, ThresholdsError, load_thresholds, parse_duration
from gpu_exporter.training.protocol import OTHER, STANDARD_PHASES

DEFAULT_URL = "http://127.0.0.1:9445"
DEFAULT_WINDOW_EXPORTER = "15s"
DEFAULT_WINDOW_PROMETHEUS = "15m"
RUNBOOKS = "https://github.com/gpu-utilization-exporter/gpu-utilization-exporter/blob/main/docs/runbooks.md"
"""Where the runbooks live (the same base the alert rules' ``runbook_url`` uses)."""

INSTRUMENT_SNIPPET = """\
from gpu_exporter import training
run = training.start("my-run")                # pushes to $GPU_EXPORTER_URL (default http://127.0.0.1:9445)
for batch in run.data(loader):                # time spent waiting for the batch is phase "data"
    with run.phase("compute"): loss = train_step(batch)
    run.step(samples=len(batch))"""
"""The five lines that instrument a training loop (docs/training.md has the rest)."""

RunKey = tuple[str, str, str]


@dataclass(frozen=True)
class RunView:
    """A training run on a GPU, over the window."""

    run: str
    rank: str
    shares: dict[str, float]
    seconds: float
    since_start: bool
    batch_size: float | None
    allocator_retries: float
    allocator_ooms: float


@dataclass(frozen=True)
class GpuView:
    """What diagnose knows about one GPU."""

    uuid: str
    gpu: str
    name: str
    node: str
    utilization: float | None
    memory_used_ratio: float | None
    processes: int
    pods: tuple[str, ...]
    runs: tuple[RunView, ...]


@dataclass(frozen=True)
class Verdict:
    """The diagnosis of one GPU."""

    verdict: str
    title: str
    reason: str
    remedy: str = ""
    runbook: str = ""
    below_target: bool = False


@dataclass
class Readings:
    """Everything read from a source, keyed by GPU uuid or (run, rank, uuid)."""

    info: list[Labels] = field(default_factory=list)
    utilization: dict[str, float] = field(default_factory=dict)
    memory_used: dict[str, float] = field(default_factory=dict)
    memory_total: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)
    pods: dict[str, set[str]] = field(default_factory=dict)
    phase_window: dict[RunKey, dict[str, float]] = field(default_factory=dict)
    phase_total: dict[RunKey, dict[str, float]] = field(default_factory=dict)
    retries: dict[RunKey, float] = field(default_factory=dict)
    ooms: dict[RunKey, float] = field(default_factory=dict)
    batch_size: dict[RunKey, float] = field(default_factory=dict)


def _run_key(labels: Labels) -> RunKey:
    return labels.get("run", ""), labels.get("rank", ""), labels.get("uuid", "")


def _phases(pairs: Iterable[tuple[Labels, float]]) -> dict[RunKey, dict[str, float]]:
    out: dict[RunKey, dict[str, float]] = {}
    for labels, value in pairs:
        out.setdefault(_run_key(labels), {})[labels.get("phase", OTHER)] = value
    return out


def _per_run(pairs: Iterable[tuple[Labels, float]]) -> dict[RunKey, float]:
    return {_run_key(labels): value for labels, value in pairs}


def _per_gpu(pairs: Iterable[tuple[Labels, float]]) -> dict[str, float]:
    return {labels.get("uuid", ""): value for labels, value in pairs}


def _common(readings: Readings, cur: Iterable[tuple[str, list[tuple[Labels, float]]]]) -> Readings:
    """Fill the instant parts of ``readings`` from (metric name, samples) pairs."""
    for name, pairs in cur:
        if name == "gpu_info":
            readings.info = [labels for labels, _ in pairs]
        elif name == "gpu_memory_used_bytes":
            readings.memory_used = _per_gpu(pairs)
        elif name == "gpu_memory_total_bytes":
            readings.memory_total = _per_gpu(pairs)
        elif name == "gpu_process_memory_used_bytes":
            for labels, _ in pairs:
                uuid = labels.get("uuid", "")
                readings.processes[uuid] = readings.processes.get(uuid, 0) + 1
        elif name == "gpu_pod_info":
            for labels, _ in pairs:
                readings.pods.setdefault(labels.get("uuid", ""), set()).add(
                    f"{labels.get('namespace', '')}/{labels.get('pod', '')}")
        elif name == "gpu_training_phase_seconds_total":
            readings.phase_total = _phases(pairs)
        elif name == "gpu_training_batch_size":
            readings.batch_size = _per_run(pairs)
    return readings


_INSTANT = ("gpu_info", "gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_process_memory_used_bytes",
            "gpu_pod_info", "gpu_training_phase_seconds_total", "gpu_training_batch_size")


def from_snapshots(prev: Snapshot, cur: Snapshot) -> Readings:
    """Readings from two scrapes of one exporter: utilization and run activity are the deltas between them."""
    readings = _common(Readings(), ((name, cur.series(name)) for name in _INSTANT))
    elapsed = cur.at - prev.at
    before = _per_gpu(prev.series("gpu_busy_seconds_total"))
    for uuid, after in _per_gpu(cur.series("gpu_busy_seconds_total")).items():
        if uuid in before and elapsed > 0 and after >= before[uuid]:
            readings.utilization[uuid] = min((after - before[uuid]) / elapsed, 1.0)
    old_phases = _phases(prev.series("gpu_training_phase_seconds_total"))
    for key, phases in readings.phase_total.items():
        old = old_phases.get(key, {})
        restarted = any(phases.get(p, 0.0) < v for p, v in old.items())
        readings.phase_window[key] = {p: v - (0.0 if restarted else old.get(p, 0.0)) for p, v in phases.items()}
    for counter, target in (("gpu_training_allocator_retries_total", readings.retries),
                            ("gpu_training_allocator_ooms_total", readings.ooms)):
        old_counts = _per_run(prev.series(counter))
        for key, value in _per_run(cur.series(counter)).items():
            base = old_counts.get(key, 0.0)
            target[key] = value - base if value >= base else value
    return readings


def from_prometheus(prom: Prometheus, window: str) -> Readings:
    """Readings from Prometheus: ``rate()`` / ``increase()`` over ``window``, the rest instant."""
    prom.require("gpu_info", window)
    readings = _common(Readings(), ((name, prom.query(name)) for name in _INSTANT))
    readings.utilization = {u: min(v, 1.0) for u, v in _per_gpu(
        prom.query(f"rate(gpu_busy_seconds_total[{window}])")).items() if math.isfinite(v)}
    readings.phase_window = _phases(prom.query(f"increase(gpu_training_phase_seconds_total[{window}])"))
    readings.retries = _per_run(prom.query(f"increase(gpu_training_allocator_retries_total[{window}])"))
    readings.ooms = _per_run(prom.query(f"increase(gpu_training_allocator_ooms_total[{window}])"))
    return readings


def build_views(readings: Readings) -> list[GpuView]:
    """One GpuView per GPU of ``gpu_info``, with its runs joined by uuid, in (node, index) order."""
    runs: dict[str, list[RunView]] = {}
    for key, totals in readings.phase_total.items():
        window = readings.phase_window.get(key, {})
        seconds = sum(v for v in window.values() if v > 0)
        since_start = seconds <= 0
        basis = totals if since_start else window
        total = sum(v for v in basis.values() if v > 0)
        shares = {p: round(max(v, 0.0) / total, 4) for p, v in basis.items()} if total > 0 else {}
        runs.setdefault(key[2], []).append(RunView(
            run=key[0], rank=key[1], shares=shares, seconds=total, since_start=since_start,
            batch_size=readings.batch_size.get(key), allocator_retries=readings.retries.get(key, 0.0),
            allocator_ooms=readings.ooms.get(key, 0.0)))
    views = []
    for labels in readings.info:
        uuid = labels.get("uuid", "")
        used, capacity = readings.memory_used.get(uuid), readings.memory_total.get(uuid)
        views.append(GpuView(
            uuid=uuid, gpu=labels.get("gpu", ""), name=labels.get("name", ""),
            node=labels.get("node") or labels.get("instance", ""),
            utilization=readings.utilization.get(uuid),
            memory_used_ratio=used / capacity if used is not None and capacity else None,
            processes=readings.processes.get(uuid, 0), pods=tuple(sorted(readings.pods.get(uuid, ()))),
            runs=tuple(sorted(runs.get(uuid, []), key=lambda r: (r.run, r.rank)))))
    return sorted(views, key=lambda v: (v.node, int(v.gpu) if v.gpu.isdigit() else 1 << 30, v.uuid))


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


_REMEDIES = {
    "input_bound": ("M1: feed the GPU faster: DataLoader(num_workers=N, pin_memory=True, prefetch_factor=4, "
                    "persistent_workers=True), preload or cache the data set, move augmentation to the GPU.",
                    "gputraininginputbound"),
    "metrics_bound": ("M2: compute metrics every N steps or at epoch end, drop the ones nobody reads, keep them "
                      "on the GPU without a .item()/.cpu() per step, log asynchronously.",
                      "gputrainingmetricsbound"),
    "batch_too_small": ("M3: raise the batch size while memory allows (scale the learning rate with it); fewer, "
                        "larger kernels with torch.compile, CUDA graphs or mixed precision.", "gpubatchtoosmall"),
    "allocator_trouble": ("M4: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, stable tensor shapes, no "
                          "torch.cuda.empty_cache() in the loop; lower the batch size a little if memory is "
                          "really too small.", "gpumemoryallocatorthrashing"),
    "idle_but_allocated": ("Release the GPU (stop the idle notebook kernel or the finished job), or find what the "
                           "job waits for: its input (M1) or a collective with a dead rank.", "gpuidlebutallocated"),
    "not_instrumented": ("Instrument the job with gpu_exporter.training so the phases show the cause "
                         "(M1 input, M2 metrics, M3 batch size, M4 allocator):\n" + INSTRUMENT_SNIPPET,
                         "gpuutilizationlow"),
    "underutilized": ("Work through the causes in order: input pipeline (M1), metric computations (M2), batch "
                      "size (M3), allocator (M4); inference servers: batch requests or share the GPU (MIG).",
                      "gpuutilizationlow"),
}


def _verdict(kind: str, title: str, reason: str, below: bool) -> Verdict:
    remedy, anchor = _REMEDIES.get(kind, ("", ""))
    return Verdict(kind, title, reason, remedy, f"{RUNBOOKS}#{anchor}" if anchor else "", below)


def judge(view: GpuView, t: Thresholds, window_seconds: float) -> Verdict:
    """The one verdict for ``view`` under thresholds ``t`` (see the module docstring for the order).

    ``window_seconds`` scales the allocator retry limit: ``allocator_retries_threshold`` per
    ``allocator_window``, never less than the threshold itself.
    """
    retry_limit = t.allocator_retries_threshold * max(1.0, window_seconds / t.allocator_window)
    for run in view.runs:
        if run.allocator_ooms > 0 or run.allocator_retries > retry_limit:
            below = view.utilization is not None and view.utilization < t.utilization_low_threshold
            what = (f"{run.allocator_ooms:.0f} out-of-memory error(s)" if run.allocator_ooms > 0 else
                    f"{run.allocator_retries:.0f} allocation retries (limit {retry_limit:.0f})")
            return _verdict("allocator_trouble", "allocator trouble (M4)",
                            f"run {run.run} rank {run.rank}: the CUDA caching allocator had {what} in the window.",
                            below)
    util = view.utilization
    target = _pct(t.utilization_low_threshold)
    if util is None:
        return Verdict("unknown", "unknown", "NVML reports no utilization for this GPU (MIG mode); "
                       "look at gpu_sm_active_ratio (GPM) instead.")
    if util >= t.utilization_low_threshold:
        return Verdict("healthy", "healthy", f"{_pct(util)} utilization, at or above the {target} target.")
    memory = view.memory_used_ratio
    if not view.processes and not view.runs and (memory is None or memory <= t.work_memory_used_ratio):
        return Verdict("unused", "unused", "no process, training run or memory on the GPU: free capacity.")
    active = [r for r in view.runs if r.shares]
    for phase, limit, code, label, doing in (
            ("data", t.input_bound_share, "input_bound", "input-bound (M1)", "waiting for the next batch"),
            ("metrics", t.metrics_bound_share, "metrics_bound", "metrics-bound (M2)", "computing metrics")):
        for run in active:
            share = run.shares.get(phase, 0.0)
            if share > limit:
                return _verdict(code, label, f"run {run.run} rank {run.rank} spends {_pct(share)} of its time "
                                             f"{doing} (limit {_pct(limit)}).", True)
    for run in active:
        share = run.shares.get("compute", 0.0)
        if share > t.batch_compute_share and memory is not None and memory < t.batch_memory_used_ratio:
            return _verdict("batch_too_small", "batch too small (M3)",
                            f"run {run.run} rank {run.rank} spends {_pct(share)} of its time in compute, yet the "
                            f"GPU is at {_pct(util)} with only {_pct(memory)} of its memory used.", True)
    if util < t.idle_utilization_threshold:
        return _verdict("idle_but_allocated", "idle but allocated",
                        f"{_pct(util)} utilization while {_holder(view)} holds the GPU.", True)
    if not view.runs:
        return _verdict("not_instrumented", "not instrumented",
                        f"{_pct(util)} utilization (target {target}) and no training run reports its phases.", True)
    run = active[0] if active else view.runs[0]
    biggest = max(((p, s) for p, s in run.shares.items() if p != "compute"), key=lambda x: x[1], default=None)
    detail = f"; its largest non-compute phase is {biggest[0]} at {_pct(biggest[1])}" if biggest else ""
    return _verdict("underutilized", "underutilized",
                    f"{_pct(util)} utilization (target {target}); no single cause passes its threshold{detail}.",
                    True)


def _holder(view: GpuView) -> str:
    if view.runs:
        return f"training run {view.runs[0].run}"
    if view.processes:
        return f"{view.processes} process{'es' if view.processes > 1 else ''}"
    return f"{_pct(view.memory_used_ratio or 0.0)} of its memory"


def select(views: Sequence[GpuView], node: str | None, namespace: str | None, run: str | None,
           ids: str | None) -> list[GpuView]:
    """The GPUs matching every filter given (node, pod namespace, training run, index or uuid)."""
    wanted = {i.strip() for i in ids.split(",") if i.strip()} if ids else None
    return [v for v in views
            if (node is None or node in (v.node, v.node.rpartition(":")[0]))
            and (namespace is None or any(p.split("/", 1)[0] == namespace for p in v.pods))
            and (run is None or any(r.run == run for r in v.runs))
            and (wanted is None or v.gpu in wanted or v.uuid in wanted)]


def _phase_order(shares: dict[str, float]) -> list[str]:
    standard = [p for p in (*STANDARD_PHASES, OTHER) if p in shares]
    return standard + sorted(p for p in shares if p not in standard)


def render_text(results: Sequence[tuple[GpuView, Verdict]], window: str, t: Thresholds, out: TextIO) -> None:
    """Readable report: one block per GPU, then a summary line."""
    for view, verdict in results:
        where = f"  on {view.node}" if view.node else ""
        out.write(f"GPU {view.gpu}  {view.name}  {view.uuid}{where}\n")
        util = "n/a" if view.utilization is None else f"{view.utilization * 100:.1f}%"
        memory = "n/a" if view.memory_used_ratio is None else _pct(view.memory_used_ratio)
        procs = f"{view.processes} process{'' if view.processes == 1 else 'es'}"
        out.write(f"  utilization  {util} over {window} (target {_pct(t.utilization_low_threshold)}), "
                  f"memory {memory} used, {procs}\n")
        for pod in view.pods:
            out.write(f"  pod          {pod}\n")
        for r in view.runs:
            phases = ", ".join(f"{p} {_pct(r.shares[p])}" for p in _phase_order(r.shares)) or "no phase time yet"
            basis = "since the run started" if r.since_start else "in the window"
            batch = f", batch {r.batch_size:.0f}" if r.batch_size is not None else ""
            out.write(f"  run          {r.run} (rank {r.rank}): {phases} ({basis}){batch}\n")
        out.write(f"  verdict      {verdict.title}: {verdict.reason}\n")
        if verdict.remedy:
            first, *rest = verdict.remedy.split("\n")
            out.write(f"  remedy       {first}\n")
            out.write("".join(f"                 {line}\n" for line in rest))
        if verdict.runbook:
            out.write(f"  runbook      {verdict.runbook}\n")
        out.write("\n")
    below = sum(v.below_target for _, v in results)
    target = _pct(t.utilization_low_threshold)
    out.write(f"{below} of {len(results)} GPU(s) below the {target} utilization target.\n" if below else
              f"No GPU with work is below the {target} utilization target ({len(results)} GPU(s) checked).\n")


def render_json(results: Sequence[tuple[GpuView, Verdict]], source: str, window_seconds: float, t: Thresholds,
                out: TextIO) -> None:
    """Machine-readable report: the source, the window, the thresholds and every GPU with its verdict."""
    doc = {
        "source": source,
        "window_seconds": window_seconds,
        "utilization_target": t.utilization_low_threshold,
        "gpus_below_target": sum(v.below_target for _, v in results),
        "gpus": [{**{k: v for k, v in asdict(view).items() if k != "runs"},
                  "runs": [asdict(r) for r in view.runs], "verdict": asdict(verdict)}
                 for view, verdict in results],
    }
    out.write(json.dumps(doc, indent=2) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpu-exporter diagnose``."""
    parser.add_argument("--url", default=None, metavar="URL",
                        help=f"the node's exporter (default {DEFAULT_URL}); two scrapes --window apart")
    parser.add_argument("--prometheus-url", metavar="URL",
                        help="diagnose from Prometheus instead (a fleet; narrow it with --node/--namespace/--run)")
    parser.add_argument("--window", metavar="DURATION",
                        help=f"time to average over (default {DEFAULT_WINDOW_EXPORTER} from an exporter, "
                             f"{DEFAULT_WINDOW_PROMETHEUS} from Prometheus)")
    parser.add_argument("--node", help="only GPUs of this node (its node or instance label; Prometheus only)")
    parser.add_argument("--namespace", help="only GPUs allocated to pods of this Kubernetes namespace")
    parser.add_argument("--run", dest="run_name", metavar="RUN", help="only GPUs this training run reports from")
    parser.add_argument("-i", "--id", metavar="ID[,ID...]", help="only these GPUs (indexes or UUIDs)")
    parser.add_argument("--thresholds", metavar="FILE",
                        help="thresholds YAML (default: the packaged copy of prometheus/thresholds.yml)")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text for people, json for tools")


def _window(text: str) -> tuple[float, str]:
    """Seconds and a label (``30s``, ``15m``) of a ``--window`` value: a duration or plain seconds."""
    plain = text.replace(".", "", 1).isdigit()
    try:
        seconds = float(text) if plain else parse_duration(text)
    except ValueError as err:
        raise MetricsError(f"--window: {err}") from None
    if seconds <= 0:
        raise MetricsError(f"--window must be longer than 0 s, not {text!r}")
    return seconds, f"{seconds:g}s" if plain else text


def run(args: argparse.Namespace) -> int:
    """Run ``gpu-exporter diagnose``; 0 all at target, 1 any GPU with work below target, 2 on errors."""
    try:
        thresholds = load_thresholds(args.thresholds)
    except ThresholdsError as err:
        return fail(str(err))
    try:
        if args.url is not None and args.prometheus_url is not None:
            raise MetricsError("--url and --prometheus-url exclude each other: read one exporter or Prometheus")
        if args.node is not None and args.prometheus_url is None:
            raise MetricsError("--node needs --prometheus-url (an exporter only knows its own node)")
        if args.prometheus_url is not None:
            seconds, window = _window(args.window or DEFAULT_WINDOW_PROMETHEUS)
            prom = Prometheus(args.prometheus_url)
            promql_window = window if "." not in window else f"{round(seconds * 1000)}ms"
            readings, source = from_prometheus(prom, promql_window), prom.base
        else:
            seconds, window = _window(args.window or DEFAULT_WINDOW_EXPORTER)
            exporter = ExporterSource(args.url or DEFAULT_URL)
            first = exporter.read()
            time.sleep(max(0.0, seconds - (time.monotonic() - first.at)))
            readings, source = from_snapshots(first, read_after(exporter, first.at, 5.0)), exporter.url
        views = select(build_views(readings), args.node, args.namespace, args.run_name, args.id)
        if not views:
            filters = [f"--{flag} {getattr(args, dest)}" for flag, dest in
                       (("node", "node"), ("namespace", "namespace"), ("run", "run_name"), ("id", "id"))
                       if getattr(args, dest) is not None]
            raise MetricsError(f"no GPU matches {' '.join(filters)} at {source}" if filters else
                               f"{source} reports no GPUs")
    except MetricsError as err:
        return fail(str(err))
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    results = [(view, judge(view, thresholds, seconds)) for view in views]
    if args.output == "json":
        render_json(results, source, seconds, thresholds, sys.stdout)
    else:
        render_text(results, window, thresholds, sys.stdout)
    return 1 if any(verdict.below_target for _, verdict in results) else 0


def register(subcommands: dict[str, Any]) -> None:
    """Add ``diagnose`` to the CLI's sub-command registry (``gpu_exporter.cli.SUBCOMMANDS``)."""
    subcommands["diagnose"] = ("say per GPU why it is below the utilization target, and the remedy",
                               add_arguments, run)
