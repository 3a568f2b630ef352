"""A fleet's GPU time over a range, added up: who had it and what it was judged. Pure: no HTTP, no CLI.

``gpu-exporter report --list`` and ``report --fleet`` (gpu_exporter.commands.fleet) read every GPU judged at every
point of a range and the launches of training runs in it (:class:`Range`, read by
gpu_exporter.commands.fleet_sources); this module shares each GPU's time among those points (:func:`shares`: a
launch's ranks' wall time by the points at which it was live, the GPU's other points the rest of its time) and adds
it up (:func:`fleet`).

Figures, per verdict, team (the runs' ``team`` tag), namespace (pods on the GPU), Kubernetes owner (the
pods' ``kube_pod_owner`` of kube-state-metrics, e.g. ``Job/nightly-resnet``, when Prometheus has it), node
and GPU model:
GPU-hours; GPU-hours below ``utilization_target`` (the verdicts the ladder marks below target); idle
GPU-hours while below target (each point's share x (1 - utilization)): the capacity lost, which an optional
price per GPU-hour per GPU model (:class:`Prices`) turns into money. And the funnel allocated -> busy ->
effective GPU-hours with the hours lost at each step by cause (:mod:`gpu_exporter.verdict.funnel`; effective: SM
activity, where GPM or dcgm-exporter reports it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from gpu_exporter.verdict.funnel import Funnel, Slice
from gpu_exporter.verdict.funnel import funnel as funnel_of
from gpu_exporter.verdict.ladder import VERDICT_TITLES
from gpu_exporter.verdict.views import GpuKey

TEAM_TAG = "team"
"""The run tag whose value names a run's team (``GPU_EXPORTER_TAGS="team=vision"``)."""
NONE = "(none)"
"""The group of GPU time with no team, no pod or no node."""
TOP = 5
"""Offenders listed by default (``--top``)."""
UNJUDGED = "unjudged"
UNJUDGED_TITLE = "not judged (the run was live at no point: shorter than --step, or before Prometheus had data)"


# --- the judged range ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One GPU at one point of the range, judged."""

    time: float
    gpu: str
    """The GPU key (``uuid``, or ``cluster/uuid``)."""
    uuid: str
    node: str
    model: str
    pods: tuple[str, ...]
    verdict: str
    title: str
    code: str
    below: bool
    utilization: float | None
    remedy: str
    launch: tuple[str, str] | None
    """(run, run id) of the live run on the GPU (run id "" from a library without run ids); None: no live run."""
    seconds: float = 0.0
    """The time of the range it stands for: the step before it (the first point: what is left of the range)."""
    starting: bool = False
    """A run on the GPU is live but at its first scrape in the window: the point is neither the run's time (its
    timers have it) nor the GPU's free time, and weighs nothing."""
    sm: float | None = None
    """Its SM activity (effective utilization, 0-1); None without a source (verdict.funnel)."""


@dataclass
class LaunchRow:
    """A launch of a training run in the range: ``--list``'s row, and the time its points share."""

    run: str
    run_ids: list[str]
    start: float
    end: float
    tags: dict[str, str]
    walls: dict[tuple[str, GpuKey], float]
    """Wall seconds of each (rank, GPU key) inside the range (its phase timers); the GPU key's text is ``uuid``, or
    ``cluster/uuid`` with the thresholds' ``cluster_label`` (verdict.readings.Keys), as a Point's ``gpu``."""
    points: list[Point] = field(default_factory=list)
    utilization: float | None = None
    kube_owners: list[str] = field(default_factory=list)
    """The Kubernetes owners (``Kind/name``) of its pods, where kube-state-metrics knows them."""

    @property
    def ident(self) -> str:
        return ",".join(self.run_ids)

    @property
    def wall(self) -> float:
        return max(self.walls.values(), default=0.0)

    def wall_on(self, gpu: str) -> float:
        """Its ranks' wall seconds on the GPU whose key's text is ``gpu`` (a Point's ``gpu``) in the range."""
        return sum(w for (_, on), w in self.walls.items() if str(on) == gpu)

    @property
    def gpu_keys(self) -> list[GpuKey]:
        """The keys of its GPUs (two clusters' GPUs with one UUID are two)."""
        return sorted({gpu for _, gpu in self.walls if gpu})

    @property
    def gpus(self) -> list[str]:
        """The text of its GPUs' keys, as printed."""
        return [str(gpu) for gpu in self.gpu_keys]

    @property
    def ranks(self) -> list[str]:
        return sorted({rank for rank, _ in self.walls}, key=lambda r: (len(r), r))

    def by_verdict(self) -> dict[str, float]:
        """Its wall time by the verdicts of its points (each point its share of the wall time)."""
        counts = Counter(p.verdict for p in self.points)
        return {v: round(self.wall * n / len(self.points), 3) for v, n in counts.most_common()}

    def owners(self) -> list[str]:
        return sorted({pod for p in self.points for pod in p.pods})

    def main(self) -> Point | None:
        """A point of its main verdict: the below-target verdict at most of its points (else the most common)."""
        if not self.points:
            return None
        counts = Counter(p.verdict for p in self.points if p.below) or Counter(p.verdict for p in self.points)
        verdict = counts.most_common(1)[0][0]
        return [p for p in self.points if p.verdict == verdict][-1]


@dataclass
class Range:
    """Every judged point of the range and the launches in it."""

    source: str
    start: float
    end: float
    step: float
    window: float
    points: list[Point]
    launches: list[LaunchRow]
    target: float
    low: float
    """``utilization_low_threshold`` (the plots' alert line)."""
    pod_owners: dict[str, str] = field(default_factory=dict)
    """``namespace/pod`` -> ``Kind/name`` of its owner (:func:`pod_owners`)."""


def grid(start: float, end: float, step: float) -> list[tuple[float, float]]:
    """(time, seconds it stands for) of the points ``end - k * step`` after ``start``: each stands for the step
    before it, the first for what is left of the range (the seconds add up to ``end - start``).

    >>> grid(0.0, 2.5, 1.0)
    [(0.5, 0.5), (1.5, 1.0), (2.5, 1.0)]
    """
    count = max(1, math.ceil((end - start) / step - 1e-9))
    times = [end - k * step for k in range(count - 1, -1, -1)]
    return [(ts, min(step, ts - start)) for ts in times]


def owners_of(pods: Iterable[str], owners: dict[str, str]) -> tuple[str, ...]:
    """The known owners (``Kind/name``) of ``pods`` (``namespace/pod``), sorted, each once."""
    return tuple(sorted({owners[pod] for pod in pods if pod in owners}))


# --- prices ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prices:
    """Price of one GPU-hour per GPU model (the GPU's ``name`` label), from ``--prices FILE``::

        currency: USD
        gpu_hour:
          NVIDIA H100 80GB HBM3: 4.10
          default: 2.00        # every other model (optional)
    """

    currency: str
    gpu_hour: dict[str, float]
    source: str = ""

    def of(self, model: str) -> float | None:
        return self.gpu_hour.get(model, self.gpu_hour.get("default"))


# --- GPU time: who had it and what it was judged ------------------------------------------------------

@dataclass(frozen=True)
class Share:
    """GPU seconds of one point, with what they are grouped by."""

    point: Point
    seconds: float
    team: str
    namespaces: tuple[str, ...]
    offender: str
    """What the time belongs to: ``run NAME (ID)`` or ``GPU UUID on NODE`` (time no run reported)."""
    owners: tuple[str, ...] = ()
    """The Kubernetes owners of the point's pods (``Kind/name``)."""

    @property
    def idle(self) -> float:
        """Idle seconds while below target: the capacity lost."""
        return self.seconds * (1.0 - min(max(self.point.utilization or 0.0, 0.0), 1.0)) if self.point.below else 0.0


def shares(r: Range) -> list[Share]:
    """Every point's GPU seconds. A launch's ranks' wall time on a GPU is shared by the points at which it was
    live there; the GPU's other points share the rest of its time in the range (its points x the step)."""
    rows = {(row.run, ident): row for row in r.launches for ident in row.run_ids}
    by_gpu: dict[str, list[Point]] = {}
    for p in r.points:
        by_gpu.setdefault(p.gpu, []).append(p)
    out: list[Share] = []
    for points in by_gpu.values():
        free = [p for p in points if p.launch is None and not p.starting]
        run_points: dict[tuple[str, str], list[Point]] = {}
        for p in points:
            if p.launch is not None and not p.starting:
                row = rows.get(p.launch)
                run_points.setdefault((row.run, row.ident) if row else p.launch, []).append(p)
        used, first = 0.0, points[0]
        for (run, ident), pts in run_points.items():
            row = rows.get((run, ident.split(",")[0]))
            wall = row.wall_on(first.gpu) if row else 0.0
            if wall <= 0:  # a run without a run id (older library): each point its step
                wall = sum(p.seconds for p in pts)
            used += wall
            tags = row.tags if row else {}
            name = f"run {run} ({ident})" if ident else f"run {run}"
            out += [_share(p, wall / len(pts), tags.get(TEAM_TAG, NONE), name, r.pod_owners) for p in pts]
        for row in r.launches:  # ran on the GPU, but live at no point (shorter than a step, or before the data)
            wall = row.wall_on(first.gpu)
            if wall > 0 and (row.run, row.ident) not in run_points:
                used += wall
                near = min(points, key=lambda p: abs(p.time - row.start))  # its pods, most likely
                unjudged = Point(row.start, first.gpu, first.uuid, near.node, first.model, near.pods, UNJUDGED,
                                 UNJUDGED_TITLE, "", False, None, "", (row.run, row.run_ids[0]))
                out.append(_share(unjudged, wall, row.tags.get(TEAM_TAG, NONE), f"run {row.run} ({row.ident})",
                                  r.pod_owners))
        rest = max(0.0, sum(p.seconds for p in points) - used)
        out += [_share(p, rest / len(free), NONE, f"GPU {p.uuid} on {p.node or NONE}", r.pod_owners) for p in free]
    return out


def _share(p: Point, seconds: float, team: str, offender: str, owners: dict[str, str]) -> Share:
    return Share(p, seconds, team, tuple(sorted({pod.split("/", 1)[0] for pod in p.pods})), offender,
                 owners_of(p.pods, owners))


def _node_matches(node: str, wanted: str) -> bool:
    return wanted in (node, node.rpartition(":")[0])


def keep(items: Iterable[Share], namespace: str | None, team: str | None, node: str | None) -> list[Share]:
    """The shares that match every filter given."""
    return [s for s in items if (namespace is None or namespace in s.namespaces)
            and (team is None or s.team == team) and (node is None or _node_matches(s.point.node, node))]


def keep_launches(rows: Iterable[LaunchRow], namespace: str | None, team: str | None,
                  node: str | None) -> list[LaunchRow]:
    return [row for row in rows if (team is None or row.tags.get(TEAM_TAG) == team)
            and (namespace is None or any(pod.split("/", 1)[0] == namespace for pod in row.owners()))
            and (node is None or any(_node_matches(p.node, node) for p in row.points))]



# --- the fleet report --------------------------------------------------------------------------------

@dataclass
class Tally:
    gpu_hours: float = 0.0
    below_target: float = 0.0
    idle: float = 0.0
    money: float = 0.0
    unpriced: float = 0.0
    """Idle GPU-hours of models without a price."""

    def add(self, s: Share, prices: Prices | None) -> None:
        self.gpu_hours += s.seconds / 3600
        if s.point.below:
            self.below_target += s.seconds / 3600
            self.idle += s.idle / 3600
            price = prices.of(s.point.model) if prices else None
            if price is None:
                self.unpriced += s.idle / 3600
            else:
                self.money += s.idle / 3600 * price

    def to_json(self, priced: bool) -> dict[str, Any]:
        out = {"gpu_hours": round(self.gpu_hours, 6), "gpu_hours_below_target": round(self.below_target, 6),
               "idle_gpu_hours_below_target": round(self.idle, 6)}
        return {**out, "money_lost": round(self.money, 6)} if priced else out


def _tally(items: Iterable[Share], key: Any, prices: Prices | None) -> dict[str, Tally]:
    out: dict[str, Tally] = {}
    for s in items:
        for k in key(s):
            out.setdefault(k, Tally()).add(s, prices)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1].below_target, -kv[1].gpu_hours, kv[0])))



@dataclass
class Fleet:
    """The fleet report: everything the renderers print."""

    r: Range
    total: Tally
    gpus: int
    nodes: int
    by_cause: dict[str, Tally]
    by_team: dict[str, Tally]
    by_namespace: dict[str, Tally]
    by_owner: dict[str, Tally]
    """Empty when no pod has a known Kubernetes owner (no kube-state-metrics): the table is left out."""
    by_node: dict[str, Tally]
    by_model: dict[str, Tally]
    offenders: list[dict[str, Any]]
    prices: Prices | None
    filters: dict[str, str]
    titles: dict[str, str]
    codes: dict[str, str]
    below: dict[str, bool]
    times: list[float] = field(default_factory=list)
    utilization: dict[str, list[float | None]] = field(default_factory=dict)
    """Mean utilization over time of every GPU, and of the GPUs a run had (the HTML's plot)."""
    funnel: Funnel = field(default_factory=Funnel)
    """Allocated -> busy -> effective GPU-hours and the hours lost at each step (gpu_exporter.verdict.funnel)."""



def fleet(r: Range, prices: Prices | None, namespace: str | None = None, team: str | None = None,
          node: str | None = None, top: int = TOP) -> Fleet:
    """Add up the range's GPU time by verdict, team, namespace, node and model, and find the top offenders."""
    items = keep(shares(r), namespace, team, node)
    total = Tally()
    titles = {s.point.verdict: VERDICT_TITLES.get(s.point.verdict, s.point.title) for s in items}
    codes = {s.point.verdict: s.point.code for s in items}
    below = {s.point.verdict: s.point.below for s in items}
    offenders: dict[str, dict[str, Tally]] = {}
    latest: dict[tuple[str, str], Share] = {}
    for s in items:
        total.add(s, prices)
        if s.point.below:
            offenders.setdefault(s.offender, {}).setdefault(s.point.verdict, Tally()).add(s, prices)
            latest[(s.offender, s.point.verdict)] = s
    ranked = sorted(offenders.items(), key=lambda kv: -sum(t.idle for t in kv[1].values()))[:top]
    found = []
    for who, verdicts in ranked:
        main = max(verdicts, key=lambda v: verdicts[v].below_target)
        s = latest[(who, main)]
        sums = Tally(*(sum(getattr(t, k.name) for t in verdicts.values()) for k in fields(Tally)))
        found.append({"who": who, "team": s.team, "namespaces": list(s.namespaces), "node": s.point.node,
                      "verdict": main, "title": titles[main], "code": s.point.code,
                      **sums.to_json(prices is not None), "remedy": s.point.remedy})
    filters = {k: v for k, v in (("namespace", namespace), ("team", team), ("node", node)) if v is not None}
    times = sorted({s.point.time for s in items if s.point.verdict != UNJUDGED})
    series: dict[str, list[float | None]] = {}
    for name, runs_only in (("mean of all GPUs", False), ("mean of the GPUs a run had", True)):
        at: dict[float, list[float]] = {}
        for s in items:
            if (s.point.launch is not None or not runs_only) and s.point.utilization is not None \
                    and s.point.verdict != UNJUDGED:
                at.setdefault(s.point.time, []).append(s.point.utilization)
        if at:
            series[name] = [sum(at[ts]) / len(at[ts]) if ts in at else None for ts in times]
    return Fleet(r, total, len({s.point.gpu for s in items}), len({s.point.node for s in items}),
                 _tally(items, lambda s: [s.point.verdict], prices), _tally(items, lambda s: [s.team], prices),
                 _tally(items, lambda s: list(s.namespaces) or [NONE], prices),
                 _tally(items, lambda s: list(s.owners) or [NONE], prices) if any(s.owners for s in items) else {},
                 _tally(items, lambda s: [s.point.node or NONE], prices),
                 _tally(items, lambda s: [s.point.model or NONE], prices), found, prices, filters, titles, codes,
                 below, times, series,
                 funnel_of(Slice(s.seconds, s.point.utilization, s.point.sm, s.point.verdict) for s in items))
