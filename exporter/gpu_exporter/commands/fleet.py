"""``gpu-exporter report --list`` and ``report --fleet``: the runs of a range, and what a fleet's GPUs lost and why.

The run report answers one run's owner; the platform team asks *what did our GPUs lose last night, for which
teams, and why*. Both answers here come from one pass over the range (:func:`judge_range`):

* every ``--step`` point of the range, every GPU Prometheus holds is judged by the one judge: the readings
  ``diagnose --prometheus-url --window W --at T`` reads (:func:`~gpu_exporter.commands.diagnose_sources.
  from_prometheus_window`), joined (:func:`~gpu_exporter.verdict.join.build_views`) and judged by the verdict
  ladder (:func:`~gpu_exporter.verdict.ladder.judge`): a cause of a live run (M1 ... CM), not instrumented,
  idle but allocated, unused, healthy. W is the run report's window (:data:`~gpu_exporter.commands.report_sources.
  WINDOW_STEPS` steps). The instant queries of all points are answered by one range query per expression
  (:class:`~gpu_exporter.commands.report_sources.Stepped`), which Prometheus evaluates exactly as those instant queries;
* each launch of a training run (``gpu_training_run_info{run_id}``) in the range gets its ranks' wall time
  inside the range from its own phase timers, as the run report reads them; the points at which one of its
  ranks was live on a GPU (its phases grew within the window) share that time by their verdicts; GPUs are
  keyed by cluster and uuid (the thresholds' ``cluster_label``), as the verdicts are, so two clusters' GPUs with one
  UUID keep their runs and time apart. A GPU's
  points without a live run share the rest of its time in the range (not instrumented, idle but allocated,
  unused, ...); a point at a run's first scrape weighs nothing (its timers have that time).

Figures, per verdict, team (the runs' ``team`` tag), namespace (pods on the GPU), Kubernetes owner (the
pods' ``kube_pod_owner`` of kube-state-metrics, e.g. ``Job/nightly-resnet``, when Prometheus has it), node
and GPU model:
GPU-hours; GPU-hours below ``utilization_target`` (the verdicts the ladder marks below target); idle
GPU-hours while below target (each point's share x (1 - utilization)): the capacity lost, which an optional
price per GPU-hour per GPU model (``--prices FILE``) turns into money. And the funnel allocated -> busy ->
effective GPU-hours with the hours lost at each step by cause (:mod:`gpu_exporter.verdict.funnel`; effective: SM
activity, where GPM or dcgm-exporter reports it).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.commands import report_render as render
from gpu_exporter.commands import report_sources as sources
from gpu_exporter.commands.client_cli import iso, parse_seconds, parse_time
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.promql_text import promql_duration
from gpu_exporter.thresholds import Thresholds
from gpu_exporter.verdict.format import pct
from gpu_exporter.verdict.funnel import Funnel, Slice
from gpu_exporter.verdict.funnel import funnel as funnel_of
from gpu_exporter.verdict.funnel import lines as funnel_lines
from gpu_exporter.verdict.join import build_views
from gpu_exporter.verdict.ladder import LADDER, judge
from gpu_exporter.verdict.launches import SAME_JOB_SECONDS
from gpu_exporter.verdict.samples import Labels
from gpu_exporter.yamlfile import YamlError, YamlMap, parse

KUBE_POD_OWNER = "kube_pod_owner"
"""kube-state-metrics' series of a pod's owner (labels namespace, pod, owner_kind, owner_name): the Job,
PyTorchJob or ReplicaSet that made the pod, which the kubelet's pod-resources API does not say."""
TEAM_TAG = "team"
"""The run tag whose value names a run's team (``GPU_EXPORTER_TAGS="team=vision"``)."""
NONE = "(none)"
"""The group of GPU time with no team, no pod or no node."""
TOP = 5
"""Offenders listed by default (``--top``)."""
UNJUDGED = "unjudged"
UNJUDGED_TITLE = "not judged (the run was live at no point: shorter than --step, or before Prometheus had data)"
VERDICT_TITLES = {row.verdict: row.title for row in reversed(LADDER)}
"""Each verdict's title (its first row's), without the level: ``input_bound -> "input-bound (M1)"``."""


# --- one pass over the range -------------------------------------------------------------------------

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
    walls: dict[tuple[str, str], float]
    """Wall seconds of each (rank, GPU key) inside the range (its phase timers); the GPU key is ``uuid``, or
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
        """Its ranks' wall seconds on the GPU of key ``gpu`` in the range."""
        return sum(w for (_, on), w in self.walls.items() if on == gpu)

    @property
    def gpus(self) -> list[str]:
        """The keys of its GPUs (two clusters' GPUs with one UUID are two)."""
        return sorted({gpu for _, gpu in self.walls if gpu})

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


def _grid(start: float, end: float, step: float) -> list[tuple[float, float]]:
    """(time, seconds it stands for) of the points ``end - k * step`` after ``start``: each stands for the step
    before it, the first for what is left of the range (the seconds add up to ``end - start``).

    >>> _grid(0.0, 2.5, 1.0)
    [(0.5, 0.5), (1.5, 1.0), (2.5, 1.0)]
    """
    count = max(1, math.ceil((end - start) / step - 1e-9))
    times = [end - k * step for k in range(count - 1, -1, -1)]
    return [(ts, min(step, ts - start)) for ts in times]


def _launches(prom: Prometheus, start: float, end: float, now: float, cluster_label: str = "") -> list[LaunchRow]:
    """The launches with a run id that ran in [start, end], with each rank's wall time inside it (by rank and GPU
    key: ``cluster_label`` keeps two clusters' GPUs with one UUID apart); the ranks of one job that drew ids of
    their own (they started within SAME_JOB_SECONDS on other ranks) as one row."""
    span = promql_duration(max(end - start, 1.0))
    rows: list[LaunchRow] = []
    for launch in sources.launches(prom, end, span, cluster_label=cluster_label):
        launch, final = sources.launch_range(prom, launch, now)
        if launch.end < start or launch.start > end:
            continue
        a, b = max(start, launch.start), min(end, launch.end)
        whole = launch.start >= start and launch.end <= end
        deltas = final if whole else sources.deltas(prom, launch.run, a, b, span, None, launch)
        walls = {key: sum(v for v in phases.values() if v > 0) for key, phases in deltas.items()}
        same = [row for row in rows if row.run == launch.run and not set(row.walls) & set(walls)
                and launch.start - row.start <= SAME_JOB_SECONDS]
        if same:
            same[0].run_ids.append(launch.run_id)
            same[0].walls.update(walls)
            same[0].end = max(same[0].end, launch.end)
        else:
            rows.append(LaunchRow(launch.run, [launch.run_id], launch.start, launch.end, dict(launch.tags), walls))
    return rows


def judge_range(prom: Prometheus, t: Thresholds, start: float, end: float, step: float | None,
                now: float) -> Range:
    """Judge every GPU at every point of [start, end] and find the launches in it (the module docstring)."""
    if end <= start:
        raise MetricsError(f"the range is empty: --from {iso(start)} is not before --to {iso(end)}")
    step = step or max(sources.MIN_STEP, (end - start) / sources.POINTS)
    window = sources.WINDOW_STEPS * step
    seconds_at = dict(_grid(start, end, step))
    sources.Stepped(prom, list(seconds_at), step).require(catalog.GPU_INFO.name, "15m")
    points: list[Point] = []
    for ts, readings in sources.readings_over(prom, list(seconds_at), step, window, t.cluster_label):
        for view in build_views(readings, t, window):
            verdict = judge(view, t)
            gpu_keys = {view.uuid, view.key}
            # The point is a run's once its phases grew within the window (two of its scrapes): at its first scrape
            # a run's shares are those of its first instants ("since start"), not of its work.
            live = sorted((r.run, r.rank) for r in view.runs if r.live and not r.since_start)
            launch = None
            if live:
                run, rank = live[0]
                key = next((k for k in ((run, rank, g) for g in gpu_keys) if k in readings.launches), None)
                launch = (run, readings.launches[key][0] if key else "")
            points.append(Point(ts, view.key, view.uuid, view.node, view.name, view.pods, verdict.name,
                                verdict.title, verdict.code, verdict.below_target, view.utilization, verdict.remedy,
                                launch, seconds_at[ts], not live and any(r.live for r in view.runs), view.sm_active))
    rows = _launches(prom, start, end, now, t.cluster_label)
    by_id = {(row.run, ident): row for row in rows for ident in row.run_ids}
    for point in points:
        if point.launch is not None and point.launch in by_id:
            by_id[point.launch].points.append(point)
    owners = pod_owners(prom, start, end)
    for row in rows:
        row.kube_owners = list(owners_of(row.owners(), owners))
        if row.gpus:
            util = sources.utilization(prom, row.gpus, max(start, row.start), min(end, row.end), t.cluster_label)
            row.utilization = sum(util.values()) / len(util) if util else None
    return Range(prom.base, start, end, step, window, points, rows, t.utilization_target,
                 t.utilization_low_threshold, owners)


def pod_owners(prom: Prometheus, start: float, end: float) -> dict[str, str]:
    """``namespace/pod`` -> ``Kind/name`` of each pod's owner in the range, from kube-state-metrics'
    ``kube_pod_owner`` ({} where Prometheus does not scrape kube-state-metrics). A pod without an owner
    (``owner_kind="<none>"``) has none."""
    span = promql_duration(max(end - start, 1.0))
    expr = (f"max by (namespace, pod, owner_kind, owner_name) "
            f"(last_over_time({KUBE_POD_OWNER}{{owner_kind!=\"<none>\"}}[{span}]))")
    return owner_map(prom.at_time(end).query(expr))


def owners_of(pods: Iterable[str], owners: dict[str, str]) -> tuple[str, ...]:
    """The known owners (``Kind/name``) of ``pods`` (``namespace/pod``), sorted, each once."""
    return tuple(sorted({owners[pod] for pod in pods if pod in owners}))


def owner_map(result: Iterable[tuple[Labels, float]]) -> dict[str, str]:
    """The owners of a ``kube_pod_owner`` query's result (a pod with several owners: the first by name).

    >>> owner_map([({"namespace": "ml", "pod": "resnet-0", "owner_kind": "Job", "owner_name": "resnet"}, 1.0)])
    {'ml/resnet-0': 'Job/resnet'}
    """
    out: dict[str, str] = {}
    for labels, _ in sorted(result, key=lambda item: sorted(item[0].items())):
        pod = f"{labels.get('namespace', '')}/{labels.get('pod', '')}"
        if labels.get("owner_kind") and labels.get("owner_name"):
            out.setdefault(pod, f"{labels['owner_kind']}/{labels['owner_name']}")
    return out


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


def load_prices(path: str) -> Prices:
    """The prices file at ``path``; MetricsError with one line (``file:line: ...``) when it is not valid."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise MetricsError(f"--prices: cannot read {path}: {err.strerror}") from None
    try:
        doc = parse(text, path)
    except YamlError as err:
        raise MetricsError(f"--prices: {err}") from None
    if not isinstance(doc, YamlMap):
        raise MetricsError(f"--prices: {path}: expected a mapping with currency and gpu_hour (docs/cli.md)")
    unknown = sorted(set(doc) - {"currency", "gpu_hour"}, key=str)
    if unknown:
        raise MetricsError(f"--prices: {doc.where(unknown[0])}: unknown key {unknown[0]!r} (currency, gpu_hour)")
    currency = doc.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise MetricsError(f"--prices: {doc.where('currency')}: currency must be a name such as USD")
    table = doc.get("gpu_hour")
    if not isinstance(table, YamlMap) or not table:
        raise MetricsError(f"--prices: {doc.where('gpu_hour')}: gpu_hour must map GPU models (as the "
                           f"name label of {catalog.GPU_INFO.name} spells them) "
                           "to a price per GPU-hour, e.g. 'NVIDIA H100 80GB HBM3: 4.10'")
    prices: dict[str, float] = {}
    for model, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise MetricsError(f"--prices: {table.where(model)}: the price of {str(model)!r} must be a number of "
                               f"{currency} per GPU-hour (0 or more), not {value!r}")
        prices[str(model)] = float(value)
    return Prices(currency.strip(), prices, path)


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

    def to_json(self) -> dict[str, Any]:
        priced = self.prices is not None

        def table(rows: dict[str, Tally], name: str) -> list[dict[str, Any]]:
            return [{name: k, **v.to_json(priced)} for k, v in rows.items()]
        causes = [{"verdict": k, "title": self.titles[k], "code": self.codes[k], "below_target": self.below[k],
                   **v.to_json(priced)} for k, v in self.by_cause.items()]
        out: dict[str, Any] = {
            "source": self.r.source, "start": iso(self.r.start), "end": iso(self.r.end),
            "step_seconds": self.r.step, "window_seconds": self.r.window, "utilization_target": self.r.target,
            "filters": self.filters, "gpus": self.gpus, "nodes": self.nodes, **self.total.to_json(priced),
            "by_cause": causes, "by_team": table(self.by_team, "team"),
            "by_namespace": table(self.by_namespace, "namespace"), "by_owner": table(self.by_owner, "owner"),
            "by_node": table(self.by_node, "node"),
            "by_model": table(self.by_model, "model"), "offenders": self.offenders,
            "runs": [launch_json(row) for row in self.r.launches], "funnel": self.funnel.to_json(),
        }
        if self.prices is not None:
            out["prices"] = {"currency": self.prices.currency, "gpu_hour": self.prices.gpu_hour,
                             "unpriced_idle_gpu_hours": round(self.total.unpriced, 6)}
        return out


def fleet(r: Range, prices: Prices | None, namespace: str | None = None, team: str | None = None,
          node: str | None = None, top: int = TOP) -> Fleet:
    """Add up the range's GPU time by verdict, team, namespace, node and model, and find the top offenders."""
    items = keep(shares(r), namespace, team, node)
    total = Tally()
    for s in items:
        total.add(s, prices)
    titles = {s.point.verdict: VERDICT_TITLES.get(s.point.verdict, s.point.title) for s in items}
    codes = {s.point.verdict: s.point.code for s in items}
    below = {s.point.verdict: s.point.below for s in items}
    offenders: dict[str, dict[str, Tally]] = {}
    latest: dict[tuple[str, str], Share] = {}
    for s in items:
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


# --- rendering ---------------------------------------------------------------------------------------

def _h(hours: float) -> str:
    """GPU-hours to 3 decimals, or to 5 below 0.1 (a short range).

    >>> _h(1234.56789), _h(0.0028)
    ('1234.568', '0.00280')
    """
    return f"{hours:.3f}" if hours >= 0.1 or hours == 0 else f"{hours:.5f}"


def _money(prices: Prices, value: float) -> str:
    return f"{value:.2f} {prices.currency}" if value >= 1 or value == 0 else f"{value:.4f} {prices.currency}"


TEXT_WIDTH = 100
"""The widest line of the text report (its tables' labels, headline and offenders wrap to it)."""
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z])")
"""A full stop that ends a sentence: followed by a capital, not the one of "e.g." or "i.e."."""


def _first(remedy: str) -> str:
    """The first sentence of a remedy (the JSON has all of it); "e.g." or a dotted name does not end it.

    >>> _first("Cheaper decoding (on the GPU, e.g. DALI), or cache torch.compile output. Then more.")
    'Cheaper decoding (on the GPU, e.g. DALI), or cache torch.compile output.'
    """
    line = (remedy.splitlines() or [""])[0]
    end = _SENTENCE_END.search(line)
    return line[:end.start() + 1] if end else line


def _wrap(line: str, indent: int) -> list[str]:
    """``line`` in lines of at most :data:`TEXT_WIDTH` columns, the later ones indented by ``indent``; a word
    (a name, a code) is never cut."""
    return textwrap.wrap(line, TEXT_WIDTH, subsequent_indent=" " * indent, break_long_words=False,
                         break_on_hyphens=False) or [line]


def _headline(f: Fleet) -> list[tuple[str, str]]:
    r = f.r
    rows = [("fleet", f"{f.gpus} GPU(s) on {f.nodes} node(s) at {r.source}"
                      + "".join(f", {k} {v}" for k, v in f.filters.items())),
            ("range", f"{iso(r.start)} .. {iso(r.end)} ({render.duration(r.end - r.start)}, one point every "
                      f"{render.duration(r.step)}, judged over {render.duration(r.window)})"),
            ("GPU-hours", _h(f.total.gpu_hours)),
            ("GPU-hours below target", f"{_h(f.total.below_target)} (below {pct(r.target)})"),
            ("idle GPU-hours below target", f"{_h(f.total.idle)} (the capacity lost)")]
    if f.prices is not None:
        unpriced = f", and {_h(f.total.unpriced)} idle GPU-hours of models without a price" if f.total.unpriced else ""
        rows.append(("money lost", f"{_money(f.prices, f.total.money)} (idle GPU-hours below target x "
                                   f"{f.prices.source}'s price per GPU-hour{unpriced})"))
    rows += funnel_lines(f.funnel, f.titles)
    rows.append(("runs", str(len(f.r.launches))))
    return rows


def _table_rows(f: Fleet) -> list[tuple[str, list[tuple[str, Tally]]]]:
    causes = [(f"{f.titles[k]}{'' if f.below[k] else ' (not below target)'}", v) for k, v in f.by_cause.items()]
    owners = [("Kubernetes owner", list(f.by_owner.items()))] if f.by_owner else []
    return [("cause", causes), ("team", list(f.by_team.items())), ("namespace", list(f.by_namespace.items())),
            *owners, ("node", list(f.by_node.items())), ("GPU model", list(f.by_model.items()))]


def _columns(f: Fleet) -> list[str]:
    return ["GPU-hours", "below target", "idle below target", *(["money lost"] if f.prices else [])]


def _cells(f: Fleet, t: Tally) -> list[str]:
    return [_h(t.gpu_hours), _h(t.below_target), _h(t.idle), *([_money(f.prices, t.money)] if f.prices else [])]


def _offender_line(f: Fleet, i: int, o: dict[str, Any]) -> str:
    money = f", {_money(f.prices, o['money_lost'])}" if f.prices else ""
    remedy = _first(o["remedy"]) or "none"
    where = [f"team {o['team']}"] if o["team"] != NONE else []
    where += [] if o["who"].startswith("GPU ") else [f"node {o['node'] or NONE}"]
    return (f"{i}. {o['who']}{' (' + ', '.join(where) + ')' if where else ''}: {o['title']}, "
            f"{_h(o['gpu_hours_below_target'])} "
            f"GPU-hours below target, {_h(o['idle_gpu_hours_below_target'])} idle{money}; remedy: {remedy}")


def render_text(f: Fleet) -> str:
    """The report for a terminal: no line wider than :data:`TEXT_WIDTH` (a table's long labels wrap in their
    column, the numbers on their first line)."""
    head = _headline(f)
    width = max(len(k) for k, _ in head)
    lines = [wrapped for k, v in head for wrapped in _wrap(f"{k.ljust(width)}  {v}", width + 2)]
    for name, rows in _table_rows(f):
        cols = _columns(f)
        cells = [_cells(f, t) for _, t in rows]
        widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
        numbers = sum(widths) + 2 * len(widths)  # each column and the two spaces before it
        room = max(TEXT_WIDTH - 3 - numbers, 12)  # the label column's widest
        labels = [textwrap.wrap(k, room, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
                  or [k] for k, _ in rows]
        label = max([len(name), *(len(part) for parts in labels for part in parts)])
        header = "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))
        lines += ["", f"{('by ' + name).ljust(label + 3)}  {header}"]
        for parts, row in zip(labels, cells, strict=True):
            values = "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
            lines += [f"   {parts[0].ljust(label)}  {values}", *(f"   {part}" for part in parts[1:])]
    lines += ["", "top offenders (idle GPU-hours below target)"]
    offenders = [_offender_line(f, i, o) for i, o in enumerate(f.offenders, 1)] or ["none: no GPU time below target"]
    lines += [wrapped for line in offenders for wrapped in _wrap(line, 3)]
    return "\n".join(lines) + "\n"


def render_markdown(f: Fleet) -> str:
    out = ["### GPU fleet report", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in _headline(f))]
    for name, rows in _table_rows(f):
        cols = _columns(f)
        out += ["", f"| {name} | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        out += [f"| {k} | " + " | ".join(_cells(f, t)) + " |" for k, t in rows]
    out += ["", "| # | offender | team | verdict | below target | idle | remedy |", "|---|---|---|---|---:|---:|---|"]
    out += [f"| {i} | {o['who']} | {o['team']} | {o['title']} | {_h(o['gpu_hours_below_target'])} | "
            f"{_h(o['idle_gpu_hours_below_target'])} | {_first(o['remedy'])} |"
            for i, o in enumerate(f.offenders, 1)]
    return "\n".join(out) + "\n"


def render_json(f: Fleet) -> str:
    return json.dumps(f.to_json(), indent=2) + "\n"


def svg_bars(title: str, rows: Sequence[tuple[str, Tally]], w: int = 900) -> str:
    """Horizontal bars: each group's GPU-hours, the part below target and the idle part of it."""
    h = 40 + 22 * max(len(rows), 1)
    scale = max([t.gpu_hours for _, t in rows] + [1e-12])
    left, right = 260, w - 120
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    for i, (name, t) in enumerate(rows):
        y = 28 + 22 * i
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">{html.escape(name[:40])}</text>')
        for value, color in ((t.gpu_hours, "#cfd8dc"), (t.below_target, "#f4a261"), (t.idle, "#e76f51")):
            width = max((right - left) * value / scale, 0.0)
            parts.append(f'<rect x="{left}" y="{y}" width="{width:.1f}" height="16" fill="{color}"/>')
        parts.append(f'<text x="{right + 6}" y="{y + 13}" font-size="11">{_h(t.gpu_hours)} h</text>')
    return "\n".join([*parts, "</svg>"])


def render_html(f: Fleet) -> str:
    head = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _headline(f))
    tables, plots = [], []
    for name, rows in _table_rows(f):
        cols = "".join(f"<th>{html.escape(c)}</th>" for c in _columns(f))
        body = "".join(f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td>{c}</td>" for c in _cells(f, t)) + "</tr>"
                       for k, t in rows)
        tables.append(f"<h2>By {html.escape(name)}</h2><table><tr><th>{html.escape(name)}</th>{cols}</tr>{body}"
                      "</table>")
        if name in ("cause", "team"):
            plots.append(svg_bars(f"GPU-hours by {name}: all (grey), below target (orange), idle below target (red)",
                                  rows))
    if f.times:  # the run report's plot of utilization over time, with the target and alert lines
        over_time = render.Report(
            run="fleet", source=f.r.source, start=f.r.start, end=f.r.end, wall_seconds=f.r.end - f.r.start, gpus=[],
            ranks=[], mean_utilization=None, shares={}, gpu_hours=f.total.gpu_hours,
            gpu_hours_below_target=f.total.below_target, causes=[], main_cause=None, projected_wall_seconds=None,
            projection_share=None, step=f.r.step, times=f.times, utilization=f.utilization, target=f.r.target,
            low=f.r.low)
        plots.insert(0, render.svg_utilization(over_time))
    offenders = "".join(f"<li>{html.escape(_offender_line(f, i, o)[len(str(i)) + 2:])}</li>"
                        for i, o in enumerate(f.offenders, 1)) or "<li>none: no GPU time below target</li>"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>GPU fleet report</title>"
            f"<style>{render.STYLE}</style></head><body>\n<h1>GPU fleet report</h1>\n<table>{head}</table>\n"
            + "\n".join(plots) + "\n" + "\n".join(tables)
            + f"\n<h2>Top offenders</h2><ol>{offenders}</ol>\n<p>Every GPU judged at every point by the verdict "
              "ladder of diagnose; see docs/cli.md.</p>\n</body></html>\n")


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json, "html": render_html}


# --- the list of runs --------------------------------------------------------------------------------

def _main_title(main: Point | None) -> str | None:
    return None if main is None else VERDICT_TITLES.get(main.verdict, main.verdict)


def launch_json(row: LaunchRow) -> dict[str, Any]:
    main = row.main()
    return {"run_id": row.ident, "run": row.run, "tags": row.tags, "owner": row.owners(),
            "kubernetes_owner": row.kube_owners,
            "start": iso(row.start), "end": iso(row.end), "ranks": row.ranks, "gpus": row.gpus,
            "wall_seconds": round(row.wall, 3), "mean_utilization": None if row.utilization is None
            else round(row.utilization, 4),
            "seconds_by_verdict": row.by_verdict(), "main_cause": None if main is None else main.verdict,
            "main_cause_title": _main_title(main)}


def _list_cells(row: LaunchRow, sep: str, empty: str) -> tuple[str, ...]:
    """A row of the list as text and Markdown show it: lists joined by ``sep``, ``empty`` for what is not known."""
    return (row.ident, row.run, sep.join(f"{k}={v}" for k, v in row.tags.items()) or empty,
            sep.join(row.kube_owners or row.owners()) or empty, str(len(row.ranks)), str(len(row.gpus)),
            iso(row.start), render.duration(row.wall), empty if row.utilization is None else pct(row.utilization),
            _main_title(row.main()) or empty)


def render_list_text(rows: Sequence[LaunchRow], r: Range) -> str:
    head = ("RUN ID", "RUN", "TAGS", "OWNER", "RANKS", "GPUS", "START", "WALL", "UTIL", "MAIN CAUSE")
    table = [head, *(_list_cells(row, ",", "-") for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table]
    lines.append(f"{len(rows)} run(s) between {iso(r.start)} and {iso(r.end)} at {r.source}")
    return "\n".join(lines) + "\n"


def render_list_json(rows: Sequence[LaunchRow], r: Range) -> str:
    return json.dumps({"source": r.source, "start": iso(r.start), "end": iso(r.end),
                       "runs": [launch_json(row) for row in rows]}, indent=2) + "\n"


def render_list_markdown(rows: Sequence[LaunchRow], r: Range) -> str:
    out = [f"### Training runs, {iso(r.start)} .. {iso(r.end)}", "",
           "| run id | run | tags | owner | ranks | GPUs | start | wall | utilization | main cause |",
           "|---|---|---|---|---:|---:|---|---:|---:|---|"]
    out += ["| " + " | ".join(_list_cells(row, ", ", "")) + " |" for row in rows]
    return "\n".join(out) + "\n"


LIST_RENDERERS = {"text": render_list_text, "markdown": render_list_markdown, "json": render_list_json}


# --- command line (flags added by gpu_exporter.commands.report) --------------------------------------

DEFAULT_FROM = "-24h"
"""``--from`` of ``--list`` and ``--fleet`` when not given (``--to``: now)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``report --list`` and ``report --fleet`` (``report`` adds them to its own)."""
    group = parser.add_argument_group("runs and fleet", "--list and --fleet take --from/--to (default "
                                      f"{DEFAULT_FROM} .. now), --step, --output, --out")
    what = group.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true",
                      help="list the training runs in the range: run id, name, tags, owner, ranks, GPUs, wall time, "
                           "mean utilization, main cause")
    what.add_argument("--fleet", action="store_true",
                      help="the fleet report over the range: GPU-hours, GPU-hours below target and idle, by cause, "
                           f"team (tag {TEAM_TAG}), namespace, node and GPU model; top offenders with their remedy")
    group.add_argument("--namespace", help="only GPU time of pods in this Kubernetes namespace")
    group.add_argument("--team", help=f"only the runs whose tag {TEAM_TAG} is TEAM")
    group.add_argument("--node", help="only GPUs of this node (its node or instance label)")
    group.add_argument("--prices", metavar="FILE",
                       help="YAML: currency and gpu_hour (price per GPU-hour per GPU model, as the GPU's name label "
                            "spells it, or default): --fleet adds the money lost")
    group.add_argument("--top", type=int, default=TOP, metavar="N", help=f"offenders to list (default {TOP})")


def range_text(args: argparse.Namespace, prom: Prometheus, t: Thresholds) -> str:
    """What ``report --list`` / ``report --fleet`` print; MetricsError on bad flags or an unreadable Prometheus
    (``report``'s :func:`~gpu_exporter.commands.report.run` prints it as one line, exit status 2)."""
    if args.run_name is not None or args.run_id is not None:
        raise MetricsError("--list and --fleet cover every run of the range: drop --run/--run-id")
    if args.list and args.output == "html":
        raise MetricsError("--list writes text, markdown or json (--output html is for a report)")
    if args.top < 0:
        raise MetricsError(f"--top: {args.top} is not a count of offenders (0 or more)")
    prices = load_prices(args.prices) if args.prices else None
    now = parse_time("now", "now")
    end = parse_time(args.end, "--to") if args.end else now
    start = parse_time(args.start or DEFAULT_FROM, "--from", now)
    step = None if args.step is None else parse_seconds(args.step, "--step")
    r = judge_range(prom, t, start, end, step, now)
    if args.list:
        return LIST_RENDERERS[args.output](keep_launches(r.launches, args.namespace, args.team, args.node), r)
    return RENDERERS[args.output](fleet(r, prices, args.namespace, args.team, args.node, args.top))
