"""``gpu-exporter report``'s sources: a run's launches, timers and busy time, and a range read point by point.

A rank's key is (rank, :class:`~gpu_exporter.verdict.views.GpuKey`): the GPU's cluster (where the series carry the
thresholds' ``cluster_label``, :class:`~gpu_exporter.verdict.readings.Keys`) and uuid, so two clusters' GPUs with one
UUID stay apart. The points of a range are the readings of ``diagnose --prometheus-url --window W --at T``
(:func:`readings_over`), answered by one range query per expression (:class:`Stepped`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from gpu_exporter import catalog
from gpu_exporter.commands.client_cli import iso
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.diagnose_sources import from_prometheus_window
from gpu_exporter.commands.promql_text import promql_duration
from gpu_exporter.training.protocol import OTHER
from gpu_exporter.verdict.launches import SAME_JOB_SECONDS
from gpu_exporter.verdict.readings import Keys
from gpu_exporter.verdict.samples import Labels
from gpu_exporter.verdict.views import GpuKey, Readings

_PHASES = catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name
_LAST_PUSH = catalog.GPU_TRAINING_LAST_PUSH_TIMESTAMP_SECONDS.name
_BUSY = catalog.GPU_BUSY_SECONDS_TOTAL.name
_INFO = catalog.GPU_TRAINING_RUN_INFO.name
_STARTED = catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS.name
_TAG = "tag_"

POINTS = 150
"""Steps over the range when ``--step`` is not given (at least ``MIN_STEP``)."""
MIN_STEP = 15.0
WINDOW_STEPS = 4
"""Each point's rate window is this many steps, so it always spans several scrapes."""

RankKey = tuple[str, GpuKey]
"""(rank, GPU key) of one process of the run."""
Totals = dict[RankKey, dict[str, float]]


def _key(labels: Labels, *, cluster_label: str) -> RankKey:
    return labels.get("rank", ""), Keys(cluster_label=cluster_label).key(labels)


_quote = json.dumps


def _phase_totals(prom: Prometheus, when: float, run: str, lookback: str, *, cluster_label: str,
                  launch: Launch | None = None) -> Totals:
    """Each rank's phase seconds at ``when``: the last within ``lookback``, or only ``launch``'s own samples."""
    out: Totals = {}
    if launch is not None and when <= launch.start:
        return out
    expr = (f"last_over_time({_PHASES}{{run={_quote(run)}}}[{lookback}])" if launch is None
            else launch.only(f"{_PHASES}{{run={_quote(run)}}}"))
    for labels, value in prom.at_time(when).query(expr):
        out.setdefault(_key(labels, cluster_label=cluster_label), {})[labels.get("phase", OTHER)] = value
    return out


def lifetime(prom: Prometheus, run: str, now: float, lookback: str, *,
             cluster_label: str) -> tuple[float, float, Totals]:
    """(start, end, final phase seconds per rank) of ``run``: its last push less the wall time its phases add up to."""
    pushes = prom.at_time(now).query(f"max_over_time({_LAST_PUSH}{{run={_quote(run)}}}[{lookback}])")
    if not pushes:
        raise MetricsError(f"Prometheus at {prom.base} holds no training run {run!r} in the last {lookback}: "
                           f"check the name ({_LAST_PUSH}{{run=...}}) or widen --lookback")
    end = max(value for _, value in pushes)
    totals = _phase_totals(prom, now, run, lookback, cluster_label=cluster_label)
    wall = max((sum(v for v in phases.values() if v > 0) for phases in totals.values()), default=0.0)
    return end - wall, end, totals


@dataclass(frozen=True)
class Launch:
    """One launch (incarnation) of a run: its run id, its ranks, its own start and end. Launches of one name share
    the training series; only ``gpu_training_run_info`` and the start timestamp carry the ``run_id``
    (docs/training.md#run-identity), so a read of a launch keeps the samples of its info series' time (:meth:`only`)."""

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
    cluster_label: str = field(kw_only=True)
    """The label its GPU keys were made with (``Keys``)."""

    @property
    def info(self) -> str:
        """The selector of its ``gpu_training_run_info`` series."""
        ids = self.run_id.split(",")
        match = f"run_id={_quote(ids[0])}" if len(ids) == 1 else f"run_id=~{_quote('|'.join(ids))}"
        return f"{_INFO}{{run={_quote(self.run)}, {match}}}"

    def only(self, expr: str) -> str:
        """``expr`` (series keyed by run, rank, uuid), kept only where this launch's info series is."""
        cluster = f", {self.cluster_label}" if self.cluster_label else ""
        return f"({expr}) and on(run, rank, uuid{cluster}) {self.info}"

    def key(self, labels: Labels) -> RankKey:
        return _key(labels, cluster_label=self.cluster_label)


def launches(prom: Prometheus, at: float, lookback: str, run: str | None = None, run_id: str | None = None, *,
             cluster_label: str) -> list[Launch]:
    """The launches (with a run id) of run name ``run`` or of ``run_id`` in ``lookback`` before ``at``, oldest first."""
    sel = ", ".join(f"{k}={_quote(v)}" for k, v in (("run", run), ("run_id", run_id)) if v is not None)
    found: dict[tuple[str, str], tuple[float, set[RankKey]]] = {}
    for labels, value in prom.at_time(at).query(f"max_over_time({_STARTED}{{{sel}}}[{lookback}])"):
        ident = labels.get("run_id", "")
        if not ident:
            continue
        start, keys = found.setdefault((labels.get("run", ""), ident), (value, set()))
        keys.add(_key(labels, cluster_label=cluster_label))
        found[(labels.get("run", ""), ident)] = (min(start, value), keys)
    tags: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}
    if found:
        for labels, _ in prom.at_time(at).query(f"last_over_time({_INFO}{{{sel}}}[{lookback}])"):
            tags[(labels.get("run", ""), labels.get("run_id", ""))] = tuple(sorted(
                (k[len(_TAG):], v) for k, v in labels.items() if k.startswith(_TAG)))
    ordered = sorted((Launch(name, ident, start, tuple(sorted(keys)), tags=tags.get((name, ident), ()),
                             cluster_label=cluster_label)
                      for (name, ident), (start, keys) in found.items()), key=lambda launch: launch.start)
    later = [next((other for other in ordered[i + 1:] if other.run == launch.run), None)
             for i, launch in enumerate(ordered)]
    return [replace(launch, until=next_one.start + 3600) if next_one else launch
            for launch, next_one in zip(ordered, later, strict=True)]


def pick_launch(prom: Prometheus, at: float, lookback: str, run: str | None, run_id: str | None, *,
                cluster_label: str) -> tuple[Launch | None, str | None]:
    """(the launch to report, a one-line note when the name was reused), or (None, None) for a run whose
    library sent no run id (then the whole name is reported, as before run ids). MetricsError when none."""
    found = launches(prom, at, lookback, run, run_id, cluster_label=cluster_label)
    if run_id is not None:
        if not found:
            raise MetricsError(f"Prometheus at {prom.base} holds no training run with run id {run_id!r}"
                               f"{'' if run is None else f' named {run!r}'} in the last {lookback}: check the id "
                               f"({_INFO}{{run_id=...}}) or widen --lookback")
        names = sorted({launch.run for launch in found})
        if len(names) > 1:
            raise MetricsError(f"run id {run_id!r} names {len(names)} runs ({', '.join(names)}): add --run NAME")
        # The name's later launches bound the reads (Launch.until).
        named = [launch for launch in launches(prom, at, lookback, names[0], cluster_label=cluster_label)
                 if launch.run_id == run_id]
        return (named or found)[-1], None
    if not found:
        return None, None
    latest = found[-1]
    # Ranks of one job launched without torchrun draw ids of their own: launches of the name on other
    # (rank, GPU) pairs that started within SAME_JOB_SECONDS of the latest are taken as its other ranks.
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
    """``launch`` with its end (its last push), and its final phase seconds per rank, both from the last scrape that
    saw the launch (the last raw sample of its info series): a query at that very time reads that scrape, however soon
    the next launch of the name replaced it, where a range query's steps could fall around it."""
    now = min(now, launch.until)
    span = promql_duration(max(now - launch.start, 1.0) + 1.0)
    last: dict[float, set[RankKey]] = {}
    for labels, series in prom.at_time(now).samples(f"{launch.info}[{span}]"):
        if series:
            last.setdefault(max(t for t, _ in series), set()).add(launch.key(labels))
    end, totals = 0.0, Totals()
    for when, keys in sorted(last.items()):
        for labels, value in prom.at_time(when).query(launch.only(f"{_LAST_PUSH}{{run={_quote(launch.run)}}}")):
            if launch.key(labels) in keys:
                end = max(end, value)
        for labels, value in prom.at_time(when).query(launch.only(f"{_PHASES}{{run={_quote(launch.run)}}}")):
            if launch.key(labels) in keys:
                totals.setdefault(launch.key(labels), {})[labels.get("phase", OTHER)] = value
    if not totals or end <= 0:
        raise MetricsError(f"Prometheus at {prom.base} holds no snapshot of run {launch.run!r} run id "
                           f"{launch.run_id!r} (its info series came without its timers)")
    return replace(launch, end=end), totals


def deltas(prom: Prometheus, run: str, start: float, end: float, lookback: str, final: Totals | None,
           launch: Launch | None = None, *, cluster_label: str) -> Totals:
    """Phase seconds of each rank between ``start`` and ``end`` (0 before the run began); ``final``: the run's last
    totals, for a range that ends with the run (its last push may be scraped after ``end``). With ``launch``, only
    its own samples count (its counters start at 0: nothing of an earlier launch of the name is subtracted)."""
    cluster_label = launch.cluster_label if launch else cluster_label
    after = final if final is not None else _phase_totals(prom, end, run, promql_duration(max(end - start, 1.0)),
                                                          cluster_label=cluster_label, launch=launch)
    before = (_phase_totals(prom, start, run, lookback, cluster_label=cluster_label, launch=launch) if start < end
              else {})
    return {key: {p: max(v - before.get(key, {}).get(p, 0.0), 0.0) for p, v in phases.items()}
            for key, phases in after.items()}


def utilization(prom: Prometheus, gpus: Sequence[GpuKey], start: float, end: float, *,
                cluster_label: str) -> dict[GpuKey, float]:
    """Mean utilization (0-1) of each GPU (by GPU key) over the range: its busy seconds between its first and last
    sample in the range (the counter only grows), over the range's seconds."""
    keys = Keys(cluster_label=cluster_label)
    uuids = sorted({gpu.uuid for gpu in gpus})
    sel = f"{_BUSY}{{uuid=~{_quote('|'.join(uuids))}}}[{promql_duration(max(end - start, 1.0))}]"
    by = f"uuid, {cluster_label}" if cluster_label else "uuid"
    found = {keys.key(labels): value for labels, value in
             prom.at_time(end).query(f"max by ({by}) (max_over_time({sel}) - min_over_time({sel}))")}
    span = max(end - start, 1e-9)
    return {gpu: min(1.0, max(0.0, value / span)) for gpu, value in found.items() if gpu in gpus}


class Stepped(Prometheus):
    """A Prometheus whose instant queries at the points of one grid are answered from one range query per
    expression (Prometheus evaluates a range query as the instant query at every step); ``only``: a selector of
    ``gpu_info`` that keeps the answers to the series of its GPUs (by ``uuid``)."""

    def __init__(self, prom: Prometheus, times: Sequence[float], step: float,
                 cache: dict[str, dict[int, list[tuple[Labels, float]]]] | None = None,
                 at: float | None = None, only: str = "") -> None:
        super().__init__(prom.base, prom.timeout, at, prom.connection)
        self.times, self.step, self.only = list(times), step, only
        self.cache = {} if cache is None else cache

    def at_time(self, at: float | None) -> Stepped:
        return Stepped(self, self.times, self.step, self.cache, at, self.only)

    def _all(self, expr: str) -> dict[int, list[tuple[Labels, float]]]:
        if expr not in self.cache:
            by_time: dict[int, list[tuple[Labels, float]]] = {}
            for labels, series in self.query_range(expr, self.times[0], self.times[-1], self.step):
                for ts, value in series:
                    by_time.setdefault(_ms(ts), []).append((labels, value))
            self.cache[expr] = by_time
        return self.cache[expr]

    def query(self, expr: str) -> list[tuple[Labels, float]]:
        if self.at is None:
            raise MetricsError("internal: a stepped query needs a point of the grid")
        return self._all(f"({expr}) and on(uuid) {self.only}" if self.only else expr).get(_ms(self.at), [])

    def require(self, metric: str, window: str) -> None:
        if not self._all(f"count(last_over_time({metric}[{window}]))"):
            raise MetricsError(f"Prometheus at {self.base} has no {metric} series between {iso(self.times[0])} and "
                               f"{iso(self.times[-1])}: is it scraping a gpu-exporter, and is the range right?")


def _ms(ts: float) -> int:
    return round(ts * 1000)


def readings_over(prom: Prometheus, times: Sequence[float], step: float, window: float, cluster_label: str,
                  gpus: Sequence[GpuKey] = ()) -> Iterator[tuple[float, Readings]]:
    """(time, the readings of ``diagnose --prometheus-url --window W --at T``) at every point T of ``times`` (a grid
    ``step`` apart) where Prometheus holds GPUs; only the series of ``gpus`` when given (a run reads no fleet)."""
    uuids = _quote("|".join(sorted({gpu.uuid for gpu in gpus})))
    stepped = Stepped(prom, times, step, only=f"{catalog.GPU_INFO.name}{{uuid=~{uuids}}}" if gpus else "")
    for ts in times:
        at = stepped.at_time(ts)
        if at.query(catalog.GPU_INFO.name):
            yield ts, from_prometheus_window(at, window, cluster_label=cluster_label)
