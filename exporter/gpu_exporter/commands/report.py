"""``gpu-exporter report``: what one training run cost and why, read from Prometheus after the fact.

The problem: the alerts and ``diagnose`` speak about the last minutes of a live run; the owner of
last night's eight-hour run asks the next morning what it cost and why it was slow. This command
reads one run (every rank and GPU) from Prometheus over its whole lifetime, or over
``--from``/``--to``, and works for finished runs:

* wall time (the run's own phase timers: the phases add up to wall time), GPU-hours, mean utilization;
* phase shares over the whole range and over time;
* each cause of the cause table (:data:`gpu_exporter.verdict.causes.CAUSES`) with when it applied: the same
  signals as the recording rules (``rate(gpu_busy_seconds_total[W])``, the phases' ``increase``, memory,
  allocator events), judged at every step by :func:`gpu_exporter.verdict.causes.find_causes`, the judge the
  conformance test holds equal to the generated rules (a distributed run's ranks are judged together at each
  step, so a rank that waits for a straggler is told so: ST);
* GPU-hours spent below ``utilization_target`` (per GPU: the share of its utilization points below the
  target, times the wall time);
* the projected wall time without the main cause (the cause that applied longest): hiding a phase of
  share ``s`` (over the range, on the ranks the cause applied to) shortens the run to ``wall x (1 - s)``;
  a launch-bound run (M3) whose GPU were busy through its compute phase loses the idle part of it,
  ``s = compute share - mean utilization``; for a straggler (ST) ``s`` is the waiting ranks' mean
  communication share beyond the straggler's (the run's time if the straggler kept up); allocator
  trouble (M4) has no projection (it is counted, not timed).

Outputs: text, Markdown, JSON, and one self-contained HTML file with inline SVG plots (nothing is
fetched to view it). Example::

    $ gpu-exporter report --prometheus-url http://prometheus:9090 --run resnet50
    $ gpu-exporter report --prometheus-url http://prometheus:9090 --run resnet50 --output html --out r.html
    $ gpu-exporter report --prometheus-url http://prometheus:9090 --run resnet50 --from=-8h --to=-2h

Exit status: 0 report written, 2 bad input, an unreachable Prometheus or a run it does not hold.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.commands.metrics_client import (
    Labels,
    MetricsError,
    Prometheus,
    Series,
    add_client_arguments,
    connection,
    fail,
    iso,
    parse_seconds,
    parse_time,
    promql_duration,
)
from gpu_exporter.thresholds import Thresholds, ThresholdsError, load_thresholds, parse_duration
from gpu_exporter.verdict.causes import BY_ID, RunSignals, find_causes, pct
from gpu_exporter.verdict.levels import useful_utilization

_PHASES = catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name
_LAST_PUSH = catalog.GPU_TRAINING_LAST_PUSH_TIMESTAMP_SECONDS.name
_BUSY = catalog.GPU_BUSY_SECONDS_TOTAL.name
_MEMORY_USED = catalog.GPU_MEMORY_USED_BYTES.name
_MEMORY_TOTAL = catalog.GPU_MEMORY_TOTAL_BYTES.name
_CURRENT_PHASE = catalog.GPU_TRAINING_CURRENT_PHASE.name
_RETRIES = catalog.GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL.name
_OOMS = catalog.GPU_TRAINING_ALLOCATOR_OOMS_TOTAL.name
_BATCH = catalog.GPU_TRAINING_BATCH_SIZE.name
_INFO = catalog.GPU_TRAINING_RUN_INFO.name
_STARTED = catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS.name
_TAG = "tag_"

RankKey = tuple[str, str]
"""(rank, uuid) of one process of the run."""
SAME_JOB_SECONDS = 120.0
"""Launches of one name on other ranks/GPUs that started this close to the latest one are its other ranks."""
POINTS = 150
"""Steps over the range when ``--step`` is not given (at least ``MIN_STEP``)."""
MIN_STEP = 15.0
WINDOW_STEPS = 4
"""Each point's rate window is this many steps, so it always spans several scrapes."""
PHASE_COLORS = {"data": "#e4572e", "compute": "#2e86ab", "metrics": "#f3a712", "checkpoint": "#8e44ad",
                "communication": "#29bf12", "other": "#9e9e9e"}


@dataclass(frozen=True)
class CauseSpan:
    """A cause of the table over the range: the wall-clock seconds it applied to some rank, when, and to which."""

    cause: str
    code: str
    title: str
    seconds: float
    intervals: list[tuple[float, float]]
    remedy: str
    ranks: list[str]


@dataclass
class Report:
    """Everything the renderers print; ``to_json`` is its JSON form."""

    run: str
    source: str
    start: float
    end: float
    wall_seconds: float
    gpus: list[str]
    ranks: list[dict[str, Any]]
    mean_utilization: float | None
    shares: dict[str, float]
    gpu_hours: float
    gpu_hours_below_target: float
    causes: list[CauseSpan]
    main_cause: str | None
    projected_wall_seconds: float | None
    projection_share: float | None
    step: float
    times: list[float] = field(default_factory=list)
    utilization: dict[str, list[float | None]] = field(default_factory=dict)
    phase_series: dict[str, list[float | None]] = field(default_factory=dict)
    target: float = 0.85
    low: float = 0.3
    run_id: str = ""
    """The launch reported ("" for a run whose library sent no run id: then the range is all that ``run`` did)."""
    tags: dict[str, str] = field(default_factory=dict)

    def projection_text(self) -> str:
        """``"8.1 h; down to ~3.4 h if loading overlapped compute (input-bound (M1))"``."""
        wall = duration(self.wall_seconds)
        if self.main_cause is None:
            return f"{wall}; no cause applied"
        cause = BY_ID[self.main_cause]
        if self.projected_wall_seconds is None:
            return f"{wall}; main cause {cause.label}: no projection (it is counted, not timed)"
        return f"{wall}; down to ~{duration(self.projected_wall_seconds)} {cause.hidden} ({cause.label})"

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run, "run_id": self.run_id, "tags": self.tags,
            "source": self.source, "start": iso(self.start), "end": iso(self.end),
            "wall_seconds": round(self.wall_seconds, 3), "gpus": self.gpus, "ranks": self.ranks,
            "gpu_hours": round(self.gpu_hours, 6), "mean_utilization": _round(self.mean_utilization),
            "shares": {p: round(v, 4) for p, v in self.shares.items()},
            "gpu_hours_below_target": round(self.gpu_hours_below_target, 6),
            "utilization_target": self.target,
            "causes": [{"cause": c.cause, "code": c.code, "title": c.title, "seconds": round(c.seconds, 3),
                        "applied": [[iso(a), iso(b)] for a, b in c.intervals], "ranks": c.ranks,
                        "remedy": c.remedy}
                       for c in self.causes],
            "main_cause": self.main_cause, "projection_share": _round(self.projection_share),
            "projected_wall_seconds": _round(self.projected_wall_seconds),
            "projection": self.projection_text(), "step_seconds": self.step,
            "series": {"times": [iso(t) for t in self.times],
                       "utilization": {u: [_round(v) for v in vs] for u, vs in self.utilization.items()},
                       "phase_shares": {p: [_round(v) for v in vs] for p, vs in self.phase_series.items()}},
        }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def duration(seconds: float) -> str:
    """``29160 -> "8.1 h"``, ``754 -> "12.6 min"``, ``25.04 -> "25.0 s"``."""
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


# --- reading Prometheus ------------------------------------------------------------------------------

def _key(labels: Labels) -> RankKey:
    return labels.get("rank", ""), labels.get("uuid", "")


def _quote(text: str) -> str:
    return json.dumps(text)


def _at(prom: Prometheus, when: float, expr: str) -> list[tuple[Labels, float]]:
    return prom.at_time(when).query(expr)


def _phase_totals(prom: Prometheus, when: float, run: str, lookback: str) -> dict[RankKey, dict[str, float]]:
    out: dict[RankKey, dict[str, float]] = {}
    expr = f"last_over_time({_PHASES}{{run={_quote(run)}}}[{lookback}])"
    for labels, value in _at(prom, when, expr):
        out.setdefault(_key(labels), {})[labels.get("phase", "other")] = value
    return out


Totals = dict[RankKey, dict[str, float]]


def lifetime(prom: Prometheus, run: str, now: float, lookback: str) -> tuple[float, float, Totals]:
    """(start, end, final phase seconds per rank) of ``run``: its last push, minus the wall time its phase
    timers add up to (the phases add up to wall time)."""
    pushes = _at(prom, now, f"max_over_time({_LAST_PUSH}{{run={_quote(run)}}}"
                            f"[{lookback}])")
    if not pushes:
        raise MetricsError(f"Prometheus at {prom.base} holds no training run {run!r} in the last {lookback}: "
                           f"check the name ({_LAST_PUSH}{{run=...}}) or widen --lookback")
    end = max(value for _, value in pushes)
    totals = _phase_totals(prom, now, run, lookback)
    wall = max((sum(v for v in phases.values() if v > 0) for phases in totals.values()), default=0.0)
    return end - wall, end, totals


@dataclass(frozen=True)
class Launch:
    """One launch (incarnation) of a run: its run id, its ranks, its own start and end.

    Many launches may share a run name (a nightly job); each has its own ``run_id`` (the training
    library's, docs/training.md#run-identity), which only ``gpu_training_run_info`` and
    ``gpu_training_run_start_timestamp_seconds`` carry. The other training series are keyed by
    (run, rank, uuid), shared by the launches of one name, so every read of a launch keeps the samples
    scraped while its info series was there (:meth:`only`): nothing of an earlier launch is read or
    subtracted, and only this launch's (rank, uuid) pairs count.
    """

    run: str
    run_id: str
    """Its run id; ``a,b`` for the ranks of one job that drew ids of their own (:func:`pick_launch`)."""
    start: float
    keys: tuple[RankKey, ...]
    end: float = 0.0
    """Its last push (0 until :func:`launch_range` found it)."""
    tags: tuple[tuple[str, str], ...] = ()
    until: float = math.inf
    """An hour after the next launch of the name started: its own samples all lie before (reads stop there)."""

    @property
    def info(self) -> str:
        """The selector of its ``gpu_training_run_info`` series."""
        ids = self.run_id.split(",")
        match = f"run_id={_quote(ids[0])}" if len(ids) == 1 else f"run_id=~{_quote('|'.join(ids))}"
        return f"{_INFO}{{run={_quote(self.run)}, {match}}}"

    def only(self, expr: str) -> str:
        """``expr`` (series keyed by run, rank, uuid), kept only where this launch's info series is."""
        return f"({expr}) and on(run, rank, uuid) {self.info}"


def launches(prom: Prometheus, at: float, lookback: str, run: str | None = None,
             run_id: str | None = None) -> list[Launch]:
    """The launches of run name ``run`` or of ``run_id`` seen in ``lookback`` before ``at``, oldest first
    (only those whose library sent a run id)."""
    sel = ", ".join(f"{k}={_quote(v)}" for k, v in (("run", run), ("run_id", run_id)) if v is not None)
    found: dict[tuple[str, str], tuple[float, set[RankKey]]] = {}
    for labels, value in _at(prom, at, f"max_over_time({_STARTED}{{{sel}}}[{lookback}])"):
        ident = labels.get("run_id", "")
        if not ident:
            continue
        start, keys = found.setdefault((labels.get("run", ""), ident), (value, set()))
        keys.add(_key(labels))
        found[(labels.get("run", ""), ident)] = (min(start, value), keys)
    tags: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}
    if found:
        for labels, _ in _at(prom, at, f"last_over_time({_INFO}{{{sel}}}[{lookback}])"):
            tags[(labels.get("run", ""), labels.get("run_id", ""))] = tuple(sorted(
                (k[len(_TAG):], v) for k, v in labels.items() if k.startswith(_TAG)))
    ordered = sorted((Launch(name, ident, start, tuple(sorted(keys)), tags=tags.get((name, ident), ()))
                      for (name, ident), (start, keys) in found.items()), key=lambda launch: launch.start)
    return [replace(launch, until=later.start + 3600) if later.run == launch.run else launch
            for launch, later in zip(ordered, [*ordered[1:], ordered[-1]], strict=True)] if ordered else []


def pick_launch(prom: Prometheus, at: float, lookback: str, run: str | None,
                run_id: str | None) -> tuple[Launch | None, str | None]:
    """(the launch to report, a one-line note when the name was reused), or (None, None) for a run whose
    library sent no run id (then the whole name is reported, as before run ids). MetricsError when none."""
    found = launches(prom, at, lookback, run, run_id)
    if run_id is not None:
        if not found:
            raise MetricsError(f"Prometheus at {prom.base} holds no training run with run id {run_id!r}"
                               f"{'' if run is None else f' named {run!r}'} in the last {lookback}: check the id "
                               f"({_INFO}{{run_id=...}}) or widen --lookback")
        names = sorted({launch.run for launch in found})
        if len(names) > 1:
            raise MetricsError(f"run id {run_id!r} names {len(names)} runs ({', '.join(names)}): add --run NAME")
        # The name's later launches bound the reads (Launch.until).
        named = [launch for launch in launches(prom, at, lookback, names[0]) if launch.run_id == run_id]
        return (named or found)[-1], None
    if not found:
        return None, None
    latest = found[-1]
    # Ranks of one job launched without torchrun draw ids of their own: launches of the name on other
    # (rank, uuid) pairs that started within SAME_JOB_SECONDS of the latest are taken as its other ranks.
    ranks = [launch for launch in found[:-1] if not set(launch.keys) & set(latest.keys)
             and latest.start - launch.start <= SAME_JOB_SECONDS]
    earlier = [launch for launch in found[:-1] if launch not in ranks]
    if ranks:
        latest = replace(latest, run_id=",".join(launch.run_id for launch in [*ranks, latest]),
                         start=min(launch.start for launch in [*ranks, latest]),
                         keys=tuple(sorted(key for launch in [*ranks, latest] for key in launch.keys)))
    note = None
    if earlier:
        shown = ", ".join(f"{launch.run_id} ({iso(launch.start)})" for launch in reversed(earlier[-3:]))
        note = (f"note: run name {run!r} was reused by {len(earlier) + 1} launches in the last {lookback}; this is "
                f"the latest, run id {latest.run_id} (started {iso(latest.start)}); earlier: {shown}"
                f"{', ...' if len(earlier) > 3 else ''}: pick one with --run-id")
    return latest, note


def launch_range(prom: Prometheus, launch: Launch, now: float) -> tuple[Launch, Totals]:
    """``launch`` with its end (its last push), and its final phase seconds per rank.

    Both come from the last scrape that saw the launch, found among the raw samples of its info series
    (each sample at its scrape's time): a query at that very time reads that scrape, however soon the
    next launch of the name replaced it, where a range query's or subquery's steps could fall around it.
    """
    now = min(now, launch.until)
    span = promql_duration(max(now - launch.start, 1.0) + 1.0)
    last: dict[float, set[RankKey]] = {}
    for labels, series in prom.at_time(now).samples(f"{launch.info}[{span}]"):
        if series:
            last.setdefault(max(t for t, _ in series), set()).add(_key(labels))
    end, totals = 0.0, Totals()
    for when, keys in sorted(last.items()):
        for labels, value in _at(prom, when, launch.only(f"{_LAST_PUSH}{{run={_quote(launch.run)}}}")):
            if _key(labels) in keys:
                end = max(end, value)
        for labels, value in _at(prom, when, launch.only(f"{_PHASES}{{run={_quote(launch.run)}}}")):
            if _key(labels) in keys:
                totals.setdefault(_key(labels), {})[labels.get("phase", "other")] = value
    if not totals or end <= 0:
        raise MetricsError(f"Prometheus at {prom.base} holds no snapshot of run {launch.run!r} run id "
                           f"{launch.run_id!r} (its info series came without its timers)")
    return replace(launch, end=end), totals


def _launch_totals(prom: Prometheus, launch: Launch, at: float) -> Totals:
    """The phase seconds of ``launch``'s ranks in the sample current at ``at``, a time within the launch
    (none before its first scrape)."""
    out: Totals = {}
    if at <= launch.start:
        return out
    for labels, value in _at(prom, at, launch.only(f"{_PHASES}{{run={_quote(launch.run)}}}")):
        out.setdefault(_key(labels), {})[labels.get("phase", "other")] = value
    return out


def _deltas(prom: Prometheus, run: str, start: float, end: float, lookback: str, final: Totals | None,
            launch: Launch | None = None) -> Totals:
    """Phase seconds of each rank between ``start`` and ``end`` (0 before the run began); ``final``: the
    run's last totals, for a range that ends with the run (its last push may be scraped after ``end``).
    With ``launch``, only that launch's own samples count (its counters start at 0: nothing of an
    earlier launch of the name is subtracted)."""
    if launch is not None:
        after = final if final is not None else _launch_totals(prom, launch, end)
        before = _launch_totals(prom, launch, start) if start < end else {}
        return {key: {p: max(v - before.get(key, {}).get(p, 0.0), 0.0) for p, v in phases.items()}
                for key, phases in after.items()}
    after = final if final is not None else _phase_totals(prom, end, run, promql_duration(max(end - start, 1.0)))
    before = _phase_totals(prom, start, run, lookback) if start < end else {}
    return {key: {p: max(v - before.get(key, {}).get(p, 0.0), 0.0) for p, v in phases.items()}
            for key, phases in after.items()}


def _busy(prom: Prometheus, uuids: Sequence[str], start: float, end: float) -> dict[str, float]:
    """Busy seconds of each GPU between its first and last sample in the range (the counter only grows)."""
    sel = f"{_BUSY}{{uuid=~{_quote('|'.join(uuids))}}}[{promql_duration(max(end - start, 1.0))}]"
    return {labels.get("uuid", ""): value for labels, value in
            _at(prom, end, f"max by (uuid) (max_over_time({sel}) - min_over_time({sel}))")}


def _range(prom: Prometheus, expr: str, start: float, end: float, step: float) -> list[tuple[Labels, Series]]:
    return prom.query_range(expr, start, end, step)


def _grid(series: Series, times: Sequence[float]) -> list[float | None]:
    values = dict(series)
    return [values.get(t) for t in times]


def build(prom: Prometheus, run: str, t: Thresholds, start: float, end: float, step: float | None,
          lookback: str, final: Totals | None = None, launch: Launch | None = None) -> Report:
    """Read ``run`` (only its launch ``launch``, when given) between ``start`` and ``end`` and compute every
    figure of the report."""
    if end <= start:
        raise MetricsError(f"the range is empty: --from {iso(start)} is not before --to {iso(end)}")
    deltas = _deltas(prom, run, start, end, lookback, final, launch)
    if not deltas:
        raise MetricsError(f"Prometheus at {prom.base} has no phase timers of run {run!r} between {iso(start)} "
                           f"and {iso(end)}")
    walls = {key: sum(phases.values()) for key, phases in deltas.items()}
    wall = max(walls.values())
    if wall <= 0:
        raise MetricsError(f"run {run!r} did not run between {iso(start)} and {iso(end)}")
    gpus = sorted({uuid for _, uuid in deltas if uuid})
    totals: dict[str, float] = {}
    for phases in deltas.values():
        for p, v in phases.items():
            totals[p] = totals.get(p, 0.0) + v
    all_seconds = sum(totals.values())
    shares = {p: v / all_seconds for p, v in sorted(totals.items(), key=lambda kv: -kv[1])}

    # Busy seconds of the run's GPUs over the range (the GPU counter's samples at both ends).
    busy = _busy(prom, gpus, start, end) if gpus else {}
    util = {u: min(1.0, max(0.0, value / (end - start))) for u, value in busy.items()}
    mean_util = sum(util.values()) / len(util) if util else None

    step = step or max(MIN_STEP, (end - start) / POINTS)
    window = promql_duration(WINDOW_STEPS * step)
    times, util_series, useful_series, phase_series, spans = _timeline(prom, run, gpus, t, start, end, step, window,
                                                                       launch)
    # Each GPU's hours below target: its share of the run's points whose useful utilization (the level's,
    # gpu_exporter.verdict.levels) is below the target, times the wall time.
    below = 0.0
    for series in useful_series.values():
        points = [v for v in series if v is not None]
        below += wall * sum(v < t.utilization_target for v in points) / len(points) if points else 0.0
    causes = sorted(spans.values(), key=lambda c: (-c.seconds, -shares.get(BY_ID[c.cause].phase, 0.0)))
    main = causes[0].cause if causes else None
    ranks = [{"rank": rank, "uuid": uuid, "wall_seconds": round(walls[(rank, uuid)], 3),
              "utilization": _round(util.get(uuid)),
              "shares": {p: round(v / walls[(rank, uuid)], 4) for p, v in sorted(phases.items(), key=lambda kv: -kv[1])
                         if walls[(rank, uuid)] > 0}}
             for (rank, uuid), phases in sorted(deltas.items())]
    share = _projection_share(causes[0], deltas, mean_util) if causes else None
    return Report(run=run, source=prom.base, start=start, end=end, wall_seconds=wall, gpus=gpus, ranks=ranks,
                  mean_utilization=mean_util, shares=shares, gpu_hours=wall * max(len(gpus), 1) / 3600,
                  gpu_hours_below_target=below / 3600, causes=causes, main_cause=main,
                  projected_wall_seconds=None if share is None else wall * (1 - share), projection_share=share,
                  step=step, times=times, utilization=util_series, phase_series=phase_series,
                  target=t.utilization_target, low=t.utilization_low_threshold,
                  run_id="" if launch is None else launch.run_id, tags=dict(launch.tags) if launch else {})


def _projection_share(main: CauseSpan, deltas: Totals, util: float | None) -> float | None:
    """The share of the wall time the main cause takes (docs/cli.md#gpu-exporter-report has the formula).

    A phase's share is taken over the ranks the cause applied to (one slow rank of a distributed run
    holds every rank back by its own share, not by the run's average).
    """
    cause = BY_ID[main.cause]
    walls = {key: sum(phases.values()) for key, phases in deltas.items()}
    communication = {rank: phases.get(cause.phase, 0.0) / walls[(rank, uuid)]
                     for (rank, uuid), phases in deltas.items() if walls[(rank, uuid)] > 0}
    on = [key for key in deltas if key[0] in main.ranks]
    total = sum(walls[key] for key in on)
    share = sum(deltas[key].get(cause.phase, 0.0) for key in on) / total if total > 0 else 0.0
    return cause.run_share(share, communication, util)


def _timeline(prom: Prometheus, run: str, gpus: Sequence[str], t: Thresholds, start: float, end: float,
              step: float, window: str, launch: Launch | None = None
              ) -> tuple[list[float], dict[str, list[float | None]], dict[str, list[float | None]],
                         dict[str, list[float | None]], dict[str, CauseSpan]]:
    """The run over time: utilization and useful utilization per GPU, phase shares (all ranks), and when each
    cause applied (with ``launch``: only at the times its own series were there)."""
    sel = f"run={_quote(run)}"
    match = _quote("|".join(gpus) or "none")

    def only(expr: str) -> str:
        return expr if launch is None else launch.only(expr)
    phases = _range(prom, only(f"increase({_PHASES}{{{sel}}}[{window}])"), start, end, step)
    times = sorted({ts for _, series in phases for ts, _ in series})
    util = {labels.get("uuid", ""): _grid(series, times) for labels, series in _range(
        prom, f"max by (uuid) (rate({_BUSY}{{uuid=~{match}}}[{window}]))", start, end, step)}
    memory = {labels.get("uuid", ""): _grid(series, times) for labels, series in _range(
        prom, f"max by (uuid) ({_MEMORY_USED}{{uuid=~{match}}}) / max by (uuid) "
              f"({_MEMORY_TOTAL}{{uuid=~{match}}} > 0)", start, end, step)}

    def per_rank(expr: str) -> dict[RankKey, list[float | None]]:
        return {_key(labels): _grid(series, times) for labels, series in _range(prom, expr, start, end, step)}
    live = per_rank(f"max by (rank, uuid) ({only(f'{_CURRENT_PHASE}{{{sel}}}')})")
    retries = per_rank(f"max by (rank, uuid) ({only(f'increase({_RETRIES}{{{sel}}}[{window}])')})")
    ooms = per_rank(f"max by (rank, uuid) ({only(f'increase({_OOMS}{{{sel}}}[{window}])')})")
    batch = per_rank(f"max by (rank, uuid) ({only(f'{_BATCH}{{{sel}}}')})")
    by_rank: dict[RankKey, dict[str, list[float | None]]] = {}
    for labels, series in phases:
        by_rank.setdefault(_key(labels), {})[labels.get("phase", "other")] = _grid(series, times)

    retry_limit = t.allocator_retries_threshold * max(1.0, parse_duration(window) / t.allocator_window)
    applied: dict[str, set[float]] = {}
    on_ranks: dict[str, set[str]] = {}
    phase_sum: dict[str, list[float | None]] = {}
    useful: dict[str, list[float | None]] = {uuid: list(series) for uuid, series in util.items()}
    none: list[float | None] = [None] * len(times)

    def at(series: dict[Any, list[float | None]], key: Any, i: int) -> float | None:
        return series.get(key, none)[i]

    for i, ts in enumerate(times):
        seconds: dict[str, float] = {}
        for ph in by_rank.values():
            for p, v in ph.items():
                seconds[p] = seconds.get(p, 0.0) + (v[i] or 0.0)
        total = sum(seconds.values())
        for p in seconds:
            phase_sum.setdefault(p, [None] * len(times))[i] = seconds[p] / total if total > 0 else None
        step_shares: dict[RankKey, dict[str, float]] = {}
        for key, ph in by_rank.items():
            rank_total = sum((v[i] or 0.0) for v in ph.values())
            if rank_total > 0 and (at(live, key, i) or 0.0) == 1.0:
                step_shares[key] = {p: (v[i] or 0.0) / rank_total for p, v in ph.items()}
        for uuid, useful_now in useful.items():  # the level's utilization: capped by the live ranks' collectives
            u_now = util[uuid][i]
            if u_now is not None:
                useful_now[i] = useful_utilization(u_now, *(sh for key, sh in step_shares.items() if key[1] == uuid))
        # ST: the communication share of every live rank at this step, as the rules join a run's ranks.
        communication = {key[0]: shares.get("communication", 0.0) for key, shares in step_shares.items()}
        for key, shares in step_shares.items():
            u = at(util, key[1], i)
            if u is None:
                continue
            signals = RunSignals(shares, at(retries, key, i) or 0.0, at(ooms, key, i) or 0.0, at(batch, key, i),
                                 communication=communication)
            for finding in find_causes(u, at(memory, key[1], i), signals, t, retry_limit):
                applied.setdefault(finding.cause.cause, set()).add(ts)
                on_ranks.setdefault(finding.cause.cause, set()).add(key[0])
    spans = {}
    for cause_id, stamps in applied.items():
        cause = BY_ID[cause_id]
        spans[cause_id] = CauseSpan(cause_id, cause.code, cause.label, len(stamps) * step,
                                    _intervals(sorted(stamps), step), cause.remedy,
                                    sorted(on_ranks[cause_id], key=lambda r: (len(r), r)))
    return times, util, useful, phase_sum, spans


def _intervals(stamps: Sequence[float], step: float) -> list[tuple[float, float]]:
    """Consecutive step times as [first - step, last] intervals."""
    out: list[tuple[float, float]] = []
    for ts in stamps:
        if out and ts - out[-1][1] <= step * 1.5:
            out[-1] = (out[-1][0], ts)
        else:
            out.append((ts - step, ts))
    return out


# --- rendering ---------------------------------------------------------------------------------------

def _rows(r: Report) -> list[tuple[str, str]]:
    """The headline figures as (label, value) rows, shared by every format."""
    rows = [("run", r.run)]
    if r.run_id:
        rows.append(("run id", r.run_id))
    if r.tags:
        rows.append(("tags", ", ".join(f"{k}={v}" for k, v in r.tags.items())))
    return [
        *rows,
        ("range", f"{iso(r.start)} .. {iso(r.end)}"),
        ("wall time", duration(r.wall_seconds)),
        ("GPUs", f"{len(r.gpus)} ({', '.join(r.gpus)})" if r.gpus else "none joined (no GPU UUID)"),
        ("GPU-hours", f"{r.gpu_hours:.3f}"),
        ("mean utilization", pct(r.mean_utilization) if r.mean_utilization is not None else "unknown"),
        ("phase shares", _shares(r.shares)),
        ("GPU-hours below target", f"{r.gpu_hours_below_target:.3f} (below {pct(r.target)})"),
        ("projection", r.projection_text()),
    ]


def _shares(shares: dict[str, float]) -> str:
    """``"data 53%, metrics 30%, compute 17%"`` (phases under 0.5% left out; JSON has them all)."""
    return ", ".join(f"{p} {pct(v)}" for p, v in shares.items() if v >= 0.005)


def _cause_lines(r: Report) -> list[str]:
    if not r.causes:
        return ["no cause of the table applied"]
    return [f"{c.title}: {duration(c.seconds)} on rank(s) {', '.join(c.ranks)} in {len(c.intervals)} stretch(es), "
            f"first {iso(c.intervals[0][0])}, last until {iso(c.intervals[-1][1])}; remedy: {c.remedy}"
            for c in r.causes]


def render_text(r: Report) -> str:
    width = max(len(k) for k, _ in _rows(r))
    lines = [f"{k.ljust(width)}  {v}" for k, v in _rows(r)]
    lines.append("causes" + " " * (width - 4) + ("\n" + " " * (width + 2)).join(_cause_lines(r)))
    for rank in r.ranks:
        util = pct(rank["utilization"]) if rank["utilization"] is not None else "unknown"
        lines.append(f"rank {rank['rank']} on {rank['uuid'] or '(no GPU UUID)'}: {duration(rank['wall_seconds'])}, "
                     f"utilization {util}, " + _shares(rank["shares"]))
    return "\n".join(lines) + "\n"


def render_markdown(r: Report) -> str:
    out = [f"### GPU report: run `{r.run}`", "", "| | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in _rows(r)[1:]]
    out += ["", "| cause | applied | stretches | remedy |", "|---|---|---|---|"]
    out += [f"| {c.title} | {duration(c.seconds)} | {', '.join(f'{iso(a)} .. {iso(b)}' for a, b in c.intervals[:5])}"
            f"{' ...' if len(c.intervals) > 5 else ''} | {c.remedy} |" for c in r.causes] or ["| none | | | |"]
    out += ["", "| rank | GPU | wall time | utilization | phases |", "|---|---|---|---|---|"]
    out += [f"| {k['rank']} | {k['uuid']} | {duration(k['wall_seconds'])} | "
            f"{pct(k['utilization']) if k['utilization'] is not None else 'unknown'} | "
            + _shares(k["shares"]) + " |" for k in r.ranks]
    return "\n".join(out) + "\n"


def _svg_frame(w: int, h: int, pad: int, r: Report, title: str) -> list[str]:
    span = max(r.end - r.start, 1e-9)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
             f'role="img" aria-label="{html.escape(title)}">',
             f'<text x="{pad}" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>',
             f'<rect x="{pad}" y="24" width="{w - 2 * pad}" height="{h - 54}" fill="#fafafa" stroke="#ccc"/>']
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        x = pad + frac * (w - 2 * pad)
        parts.append(f'<text x="{x:.1f}" y="{h - 14}" font-size="11" text-anchor="middle">'
                     f'+{duration(frac * span)}</text>')
    for level in (0, 0.5, 1.0):
        y = 24 + (1 - level) * (h - 54)
        parts.append(f'<text x="{pad - 4}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{pct(level)}</text>')
    return parts


def _xy(r: Report, ts: float, value: float, w: int, h: int, pad: int) -> tuple[float, float]:
    span = max(r.end - r.start, 1e-9)
    return pad + (ts - r.start) / span * (w - 2 * pad), 24 + (1 - min(max(value, 0.0), 1.0)) * (h - 54)


def svg_utilization(r: Report, w: int = 900, h: int = 260, pad: int = 50) -> str:
    parts = _svg_frame(w, h, pad, r, "GPU utilization over time")
    for level, color, name in ((r.target, "#2a9d8f", "target"), (r.low, "#e76f51", "alert threshold")):
        _, y = _xy(r, r.start, level, w, h, pad)
        parts.append(f'<line x1="{pad}" x2="{w - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
                     f'stroke-dasharray="6 4"/><text x="{w - pad - 4}" y="{y - 4:.1f}" font-size="11" '
                     f'text-anchor="end" fill="{color}">{name} {pct(level)}</text>')
    palette = ("#1d3557", "#e63946", "#457b9d", "#f4a261", "#2a9d8f", "#6d597a")
    for i, (uuid, values) in enumerate(sorted(r.utilization.items())):
        points = " ".join("{:.1f},{:.1f}".format(*_xy(r, ts, v, w, h, pad))
                          for ts, v in zip(r.times, values, strict=False) if v is not None)
        color = palette[i % len(palette)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{320 + 170 * i}" y="16" font-size="11" fill="{color}">{html.escape(uuid)}</text>')
    return "\n".join([*parts, "</svg>"])


def svg_phases(r: Report, w: int = 900, h: int = 260, pad: int = 50) -> str:
    parts = _svg_frame(w, h, pad, r, "Phase shares over time (all ranks)")
    order = list(r.shares)
    base = [0.0] * len(r.times)
    for phase in order:
        values = r.phase_series.get(phase, [])
        top = [b + (values[i] or 0.0 if i < len(values) else 0.0) for i, b in enumerate(base)]
        upper = [_xy(r, ts, v, w, h, pad) for ts, v in zip(r.times, top, strict=True)]
        lower = [_xy(r, ts, v, w, h, pad) for ts, v in zip(r.times, base, strict=True)][::-1]
        if upper:
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in upper + lower)
            color = PHASE_COLORS.get(phase, "#607d8b")
            parts.append(f'<polygon fill="{color}" fill-opacity="0.85" stroke="none" points="{points}">'
                         f'<title>{html.escape(phase)}</title></polygon>')
        base = top
    for i, phase in enumerate(p for p in order if r.shares[p] >= 0.005):
        x = 320 + i * 105
        color = PHASE_COLORS.get(phase, "#607d8b")
        parts.append(f'<rect x="{x}" y="7" width="10" height="10" fill="{color}"/><text x="{x + 14}" '
                     f'y="16" font-size="11">{html.escape(phase)} {pct(r.shares[phase])}</text>')
    return "\n".join([*parts, "</svg>"])


def svg_causes(r: Report, w: int = 900, pad: int = 50) -> str:
    rows = r.causes or []
    h = 40 + 22 * max(len(rows), 1)
    span = max(r.end - r.start, 1e-9)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
             'aria-label="When each cause applied">',
             '<text x="0" y="16" font-size="14" font-weight="bold">When each cause applied</text>']
    for i, c in enumerate(rows):
        y = 28 + 22 * i
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">{html.escape(c.code)}</text>')
        for a, b in c.intervals:
            x0 = pad + (max(a, r.start) - r.start) / span * (w - 2 * pad)
            x1 = pad + (min(b, r.end) - r.start) / span * (w - 2 * pad)
            parts.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="16" fill="#e76f51">'
                         f'<title>{html.escape(c.title)}: {iso(a)} .. {iso(b)}</title></rect>')
    if not rows:
        parts.append('<text x="0" y="44" font-size="12">No cause of the table applied.</text>')
    return "\n".join([*parts, "</svg>"])


def render_html(r: Report) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _rows(r))
    causes = "".join(f"<tr><td>{html.escape(c.title)}</td><td>{duration(c.seconds)}</td>"
                     f"<td>{html.escape(iso(c.intervals[0][0]))} .. {html.escape(iso(c.intervals[-1][1]))}</td>"
                     f"<td>{html.escape(c.remedy)}</td></tr>" for c in r.causes) \
        or '<tr><td colspan="4">No cause of the table applied.</td></tr>'
    ranks = "".join(f"<tr><td>{html.escape(k['rank'])}</td><td>{html.escape(k['uuid'])}</td>"
                    f"<td>{duration(k['wall_seconds'])}</td>"
                    f"<td>{pct(k['utilization']) if k['utilization'] is not None else 'unknown'}</td>"
                    f"<td>{html.escape(_shares(k['shares']))}</td></tr>"
                    for k in r.ranks)
    style = ("body{font-family:sans-serif;margin:24px;color:#222;max-width:960px}"
             "table{border-collapse:collapse;margin:8px 0 20px}th,td{border:1px solid #ddd;padding:4px 8px;"
             "text-align:left;font-size:13px}th{background:#f3f3f3}h1{font-size:20px}h2{font-size:16px}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>GPU report: {html.escape(r.run)}</title><style>{style}</style></head><body>\n"
            f"<h1>GPU report: run {html.escape(r.run)}</h1>\n<table>{rows}</table>\n"
            f"{svg_utilization(r)}\n{svg_phases(r)}\n{svg_causes(r)}\n"
            f"<h2>Causes</h2><table><tr><th>cause</th><th>applied</th><th>from .. until</th><th>remedy</th></tr>"
            f"{causes}</table>\n<h2>Ranks</h2><table><tr><th>rank</th><th>GPU</th><th>wall time</th>"
            f"<th>utilization</th><th>phases</th></tr>{ranks}</table>\n"
            f"<p>Source {html.escape(r.source)}; one point every {duration(r.step)}. Projection: "
            f"wall time x (1 - share of the main cause); see docs/cli.md.</p>\n</body></html>\n")


def render_json(r: Report) -> str:
    return json.dumps(r.to_json(), indent=2) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json, "html": render_html}


# --- command line ------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpu-exporter report``."""
    parser.epilog = "exit status: 0 report written, 2 an error (bad flag, unreachable Prometheus, unknown run)"
    parser.add_argument("--prometheus-url", metavar="URL", required=True, help="the Prometheus that scraped the run")
    parser.add_argument("--run", dest="run_name", metavar="RUN",
                        help="the training run by name (its run label): its latest launch, with a note on stderr when "
                             "the name was used by several launches")
    parser.add_argument("--run-id", dest="run_id", metavar="ID",
                        help="the training run by the run id of one launch (its run_id label)")
    parser.add_argument("--from", dest="start", metavar="TIME",
                        help="start of the range (default: the run's start): --from=-8h, Unix seconds or ISO 8601")
    parser.add_argument("--to", dest="end", metavar="TIME", help="end of the range (default: the run's last push)")
    parser.add_argument("--step", metavar="DURATION",
                        help=f"time between points of the series (default: the range / {POINTS}, at least "
                             f"{MIN_STEP:g}s); each point's rate window is {WINDOW_STEPS} steps")
    parser.add_argument("--lookback", metavar="DURATION", default="30d",
                        help="how far back to look for the run (default 30d; a PromQL range: 2w, 36h)")
    parser.add_argument("--thresholds", metavar="FILE", help="thresholds YAML (default: the packaged copy)")
    parser.add_argument("--output", choices=tuple(RENDERERS), default="text", help="the format (default text)")
    parser.add_argument("--out", metavar="FILE", help="write the report to FILE instead of standard output")
    from gpu_exporter.commands import fleet  # fleet reads runs through this module

    fleet.add_arguments(parser)
    add_client_arguments(parser, "--prometheus-url")


def run(args: argparse.Namespace) -> int:
    """Run ``gpu-exporter report``; 0 on success, 2 on errors."""
    try:
        t = load_thresholds(args.thresholds)
    except ThresholdsError as err:
        return fail(str(err))
    try:
        prom = Prometheus(args.prometheus_url, connection=connection(args, args.prometheus_url, "--prometheus-url"))
        now = parse_time("now", "now")
        if getattr(args, "list", False) or getattr(args, "fleet", False):
            from gpu_exporter.commands import fleet

            return fleet.run_range(args, prom, t)
        step = None if args.step is None else parse_seconds(args.step, "--step")
        try:
            parse_duration(args.lookback)
        except ValueError as err:
            raise MetricsError(f"--lookback: {err}") from None
        end = parse_time(args.end, "--to") if args.end else None
        start = parse_time(args.start, "--from") if args.start else None
        final = None
        if args.run_name is None and args.run_id is None:
            raise MetricsError("name the run: --run NAME (its latest launch) or --run-id ID (one launch); "
                              "--list lists the runs of a range, --fleet reports on all GPUs")
        launch, note = pick_launch(prom, end if end is not None else now, args.lookback, args.run_name, args.run_id)
        if note is not None:
            sys.stderr.write(f"gpu-exporter: {note}\n")
        if launch is not None:  # the launch's own range; --from/--to narrow it
            launch, totals = launch_range(prom, launch, now)
            final = totals if end is None or end >= launch.end else None
            start = launch.start if start is None else max(start, launch.start)
            end = launch.end if end is None else min(end, launch.end)
            report = build(prom, launch.run, t, start, end, step, args.lookback, final, launch)
        elif start is None or end is None:
            run_start, run_end, totals = lifetime(prom, args.run_name, end if end is not None else now,
                                                  args.lookback)
            final = totals if end is None else None
            start = run_start if start is None else start
            end = run_end if end is None else end
        if launch is None:
            report = build(prom, args.run_name, t, start, end, step, args.lookback, final)
    except MetricsError as err:
        return fail(str(err))
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    return write(RENDERERS[args.output](report), args.out)


def write(text: str, out: str | None) -> int:
    """Write a rendered report to ``out`` (stdout when None); the exit status (2: cannot write)."""
    if out:
        try:
            Path(out).write_text(text)
        except OSError as err:
            return fail(f"cannot write {out}: {err.strerror}")
    else:
        sys.stdout.write(text)
    return 0


def register(subcommands: dict[str, Any]) -> None:
    """Add ``report`` to the CLI's sub-command registry (``gpu_exporter.cli.SUBCOMMANDS``)."""
    subcommands["report"] = ("what one training run cost and why, from Prometheus (text, Markdown, JSON, HTML)",
                             add_arguments, run)

