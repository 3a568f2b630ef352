"""A range, judged point by point as ``diagnose`` judges one moment: the run report's verdicts over time.

Each point's :class:`~gpu_exporter.verdict.views.Readings` (those of ``diagnose --prometheus-url --window W --at
T``: commands/report_sources.py) are joined, narrowed to one run as ``diagnose --run`` / ``--run-id`` narrow them,
and judged (:func:`judged`): a :class:`Moment` per GPU key (cluster and uuid) and point. :class:`Timeline` gives the
spans of each verdict and cause, :func:`projection_share` the share of the wall time a cause took, :func:`idle_over`
how much of the GPUs' idle time in compute and between the phases FO, HW and M3 explained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpu_exporter.thresholds import Thresholds
from gpu_exporter.training.protocol import COMMUNICATION
from gpu_exporter.verdict import launches
from gpu_exporter.verdict.causes import BY_ID
from gpu_exporter.verdict.code import IdleSplit
from gpu_exporter.verdict.efficiency import EFFICIENCY_BY_ID, compute_sm
from gpu_exporter.verdict.join import build_views, select
from gpu_exporter.verdict.ladder import judge
from gpu_exporter.verdict.views import GpuKey, GpuView, Readings, RunKey, Verdict

Totals = Mapping[tuple[str, GpuKey], Mapping[str, float]]
"""Phase seconds of each (rank, GPU key) of a run."""
K = TypeVar("K", str, tuple[str, str])
"""A span's key: a cause, or a verdict with its evidence hint."""


def judged(readings: Readings, t: Thresholds, window: float, run: str | None = None,
           chosen: set[RunKey] | None = None, node: str | None = None, namespace: str | None = None,
           ids: str | None = None) -> list[tuple[GpuView, Verdict]]:
    """The GPUs of ``readings`` at one moment with their verdicts, narrowed as ``diagnose``'s flags narrow them
    (:func:`~gpu_exporter.verdict.join.select`) and to the run keys ``chosen`` of the launches to judge
    (:func:`~gpu_exporter.verdict.launches.choose`): what ``diagnose`` says, and a run report at each point."""
    views = select(build_views(readings, t, window), node, namespace, run, ids)
    if chosen is not None:
        views = launches.keep(views, chosen)
    return [(view, judge(view, t)) for view in views]


@dataclass(frozen=True)
class Moment:
    """One GPU at one point, judged (``view.runs``: the reported run's ranks on it)."""

    time: float
    view: GpuView
    verdict: Verdict


@dataclass
class Span:
    """When a verdict or a cause applied: the points (each stands for the step before it) and where."""

    times: set[float] = field(default_factory=set)
    where: set[str] = field(default_factory=set)
    """The GPU keys (a verdict) or the ranks (a cause) it applied to."""

    def seconds(self, step: float) -> float:
        return len(self.times) * step

    def intervals(self, step: float) -> list[tuple[float, float]]:
        return intervals(sorted(self.times), step)


@dataclass
class Timeline:
    """Every moment of one run over a range, by GPU key."""

    moments: dict[str, list[Moment]] = field(default_factory=dict)

    @classmethod
    def judge(cls, points: Iterable[tuple[float, Readings]], t: Thresholds, window: float, run: str,
              run_ids: Sequence[str] = ()) -> Timeline:
        """The moments of ``run`` at each (time, readings) point (:func:`judged`: ``diagnose --run RUN``, with
        ``run_ids`` ``--run-id`` of each id of a launch whose ranks drew their own)."""
        out = cls()
        for ts, readings in points:
            chosen = {key for key, (ident, _) in readings.launches.items()
                      if key[0] == run and ident in run_ids} if run_ids else None
            for view, verdict in judged(readings, t, window, run, chosen):
                out.moments.setdefault(view.key, []).append(Moment(ts, view, verdict))
        return out

    def times(self) -> list[float]:
        return sorted({m.time for ms in self.moments.values() for m in ms})

    def series(self, times: Sequence[float]) -> dict[str, list[Moment | None]]:
        """Each GPU's moment at each of ``times`` (None where the run was not on it)."""
        at = {gpu: {m.time: m for m in ms} for gpu, ms in self.moments.items()}
        return {gpu: [moments.get(ts) for ts in times] for gpu, moments in at.items()}

    def verdicts(self) -> dict[tuple[str, str], Span]:
        """Each verdict of the ladder that some GPU of the run had, with when and on which GPUs, by verdict and
        /proc evidence hint: "not instrumented" with a hint is apart from the one without (:func:`hint_of`)."""
        return _spans(((m.verdict.name, hint_of(m)), m.time, gpu) for gpu, ms in self.moments.items() for m in ms)

    def causes(self) -> dict[str, Span]:
        """Each cause found on a live rank of the run (every finding, not only the one that names the verdict)."""
        return _spans((f.cause.cause, m.time, run.rank) for ms in self.moments.values() for m in ms
                      for run in m.view.runs if run.live for f in run.findings)

    def phase_shares(self, times: Sequence[float]) -> dict[str, list[float | None]]:
        """The run's phase shares at each of ``times``, all ranks together (the phases' seconds in each window)."""
        seconds: dict[float, dict[str, float]] = {}
        for ts, run in ((m.time, r) for ms in self.moments.values() for m in ms for r in m.view.runs):
            if not run.since_start:
                at = seconds.setdefault(ts, {})
                for phase, share in run.shares.items():
                    at[phase] = at.get(phase, 0.0) + share * run.seconds
        out: dict[str, list[float | None]] = {}
        for i, ts in enumerate(times):
            total = sum(seconds.get(ts, {}).values())
            for phase, value in seconds.get(ts, {}).items():
                out.setdefault(phase, [None] * len(times))[i] = value / total if total > 0 else None
        return out


def hint_of(m: Moment) -> str:
    """The /proc evidence hint the moment's verdict names: the GPU's, where its verdict has a code but no cause
    (the ladder's "not instrumented" with evidence); "" for every other verdict."""
    return (m.view.evidence_hint if m.verdict.code and m.verdict.name not in BY_ID
            and m.verdict.name not in EFFICIENCY_BY_ID else "")


@dataclass(frozen=True)
class Effective:
    """Effective utilization (SM activity) over a range, beside busy utilization: ``sm``, ``busy`` and ``compute``
    (the compute phase's) are means over the points with an SM source (None: none); ``lost`` the GPU-hours between
    busy and effective, ``worth`` the same for each efficiency verdict's points (verdict -> GPU-hours)."""

    sm: float | None
    busy: float | None
    sources: tuple[str, ...]
    compute: float | None
    lost: float
    worth: dict[str, float]


def effective(series: Mapping[str, Sequence[Moment | None]], wall: float) -> Effective:
    """The :class:`Effective` figures of each GPU's moments (``series``) over a run's ``wall`` seconds."""
    sms: list[float] = []
    busys: list[float] = []
    computes: list[float] = []
    sources: set[str] = set()
    lost = 0.0
    worth: dict[str, float] = {}
    for moments in series.values():
        judged = [m for m in moments if m is not None and m.view.utilization is not None]
        known = [m for m in judged if m.view.sm_active is not None]
        for m in known:
            sm, busy = m.view.sm_active or 0.0, m.view.utilization or 0.0
            sms.append(sm)
            busys.append(busy)
            sources.add(m.view.sm_source or "")
            lost += wall * max(0.0, busy - sm) / len(judged)
            if m.verdict.name in EFFICIENCY_BY_ID:
                worth[m.verdict.name] = worth.get(m.verdict.name, 0.0) + wall * (m.verdict.worth or 0.0) / len(judged)
            computes.extend(c for r in m.view.runs if r.live and (c := compute_sm(sm, r.shares)) is not None)
    return Effective(sum(sms) / len(sms) if sms else None, sum(busys) / len(busys) if busys else None,
                     tuple(sorted(sources - {""})), sum(computes) / len(computes) if computes else None,
                     lost / 3600, {k: v / 3600 for k, v in worth.items()})


def idle_over(series: Mapping[str, Sequence[Moment | None]], step: float) -> tuple[IdleSplit, float] | None:
    """How much of the GPUs' idle time in compute and between the phases FO, HW and M3 explained over a range, and
    the GPU-seconds that covers: the mean of the moments' own splits (each verdict's ``idle``), each standing for
    the ``step`` before it; None where no moment has one."""
    splits = [m.verdict.idle for ms in series.values() for m in ms if m is not None and m.verdict.idle is not None]
    if not splits:
        return None
    def mean(part: str) -> float:
        return sum(float(getattr(s, part)) for s in splits) / len(splits)

    return (IdleSplit(mean("idle"), mean("framework"), mean("host"), mean("launch"), mean("unexplained"),
                      any(s.sampled for s in splits)), len(splits) * step)


def _spans(found: Iterable[tuple[K, float, str]]) -> dict[K, Span]:
    out: dict[K, Span] = {}
    for key, ts, where in found:
        span = out.setdefault(key, Span())
        span.times.add(ts)
        span.where.add(where)
    return out


def intervals(stamps: Sequence[float], step: float) -> list[tuple[float, float]]:
    """Consecutive step times as [first - step, last] intervals."""
    out: list[tuple[float, float]] = []
    for ts in stamps:
        if out and ts - out[-1][1] <= step * 1.5:
            out[-1] = (out[-1][0], ts)
        else:
            out.append((ts - step, ts))
    return out


def projection_share(cause_id: str, ranks: Iterable[str], deltas: Totals, util: float | None) -> float | None:
    """The share of a finished run's wall time cause ``cause_id`` took (:meth:`Cause.run_share`): its phase's
    share over the ranks it applied to (one slow rank holds every rank back by its own share, not the run's average),
    with each rank's communication share over the whole run."""
    cause = BY_ID[cause_id]
    walls = {key: sum(phases.values()) for key, phases in deltas.items()}
    communication = {rank: phases.get(COMMUNICATION, 0.0) / walls[(rank, gpu)]
                     for (rank, gpu), phases in deltas.items() if walls[(rank, gpu)] > 0}
    on = [key for key in deltas if key[0] in set(ranks)]
    total = sum(walls[key] for key in on)
    share = sum(deltas[key].get(cause.phase, 0.0) for key in on) / total if total > 0 else 0.0
    return cause.run_share(share, communication, util)
