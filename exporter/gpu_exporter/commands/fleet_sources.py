"""What ``report --list`` and ``report --fleet`` read: every GPU judged at every point of a range, the launches in it,
the pods' Kubernetes owners (Prometheus), and the prices file.

One pass over the range (:func:`judge_range`) gives a :class:`~gpu_exporter.verdict.fleet.Range`:

* at every ``--step`` point, every GPU Prometheus holds is judged by the one judge, as ``diagnose --prometheus-url
  --window W --at T`` judges it (W: the run report's window), the instant queries of all points answered by one
  range query per expression (:class:`~gpu_exporter.commands.report_sources.Stepped`);
* each launch of a training run (``gpu_training_run_info{run_id}``) in the range gets its ranks' wall time
  inside the range from its own phase timers, as the run report reads them; the points at which one of its
  ranks was live on a GPU (its phases grew within the window) share that time by their verdicts; GPUs are
  keyed by cluster and uuid, as the verdicts are. A GPU's points without a live run share the rest of its time
  in the range; a point at a run's first scrape weighs nothing (its timers have that time).

gpu_exporter.verdict.fleet adds the range up; gpu_exporter.commands.fleet_render prints it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from gpu_exporter import catalog
from gpu_exporter.commands import report_sources as sources
from gpu_exporter.commands.client_cli import iso
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.promql_text import promql_duration
from gpu_exporter.thresholds import Thresholds
from gpu_exporter.verdict.fleet import LaunchRow, Point, Prices, Range, grid, owners_of
from gpu_exporter.verdict.join import build_views
from gpu_exporter.verdict.ladder import judge
from gpu_exporter.verdict.launches import SAME_JOB_SECONDS
from gpu_exporter.verdict.samples import Labels
from gpu_exporter.yamlfile import YamlError, YamlMap, parse

KUBE_POD_OWNER = "kube_pod_owner"
"""kube-state-metrics' series of a pod's owner (labels namespace, pod, owner_kind, owner_name): the Job,
PyTorchJob or ReplicaSet that made the pod, which the kubelet's pod-resources API does not say."""


def _launches(prom: Prometheus, start: float, end: float, now: float, *, cluster_label: str) -> list[LaunchRow]:
    """The launches with a run id that ran in [start, end], with each rank's wall time inside it (by rank and GPU
    key); the ranks of one job that drew ids of their own (started within SAME_JOB_SECONDS) as one row."""
    span = promql_duration(max(end - start, 1.0))
    rows: list[LaunchRow] = []
    for launch in sources.launches(prom, end, span, cluster_label=cluster_label):
        launch, final = sources.launch_range(prom, launch, now)
        if launch.end < start or launch.start > end:
            continue
        a, b = max(start, launch.start), min(end, launch.end)
        whole = launch.start >= start and launch.end <= end
        deltas = final if whole else sources.deltas(prom, launch.run, a, b, span, None, launch,
                                                    cluster_label=cluster_label)
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


def judge_range(prom: Prometheus, t: Thresholds, start: float, end: float, step: float | None, now: float) -> Range:
    """Judge every GPU at every point of [start, end] and find the launches in it (the module docstring)."""
    if end <= start:
        raise MetricsError(f"the range is empty: --from {iso(start)} is not before --to {iso(end)}")
    step = step or max(sources.MIN_STEP, (end - start) / sources.POINTS)
    window = sources.WINDOW_STEPS * step
    seconds_at = dict(grid(start, end, step))
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
    rows = _launches(prom, start, end, now, cluster_label=t.cluster_label)
    by_id = {(row.run, ident): row for row in rows for ident in row.run_ids}
    for point in points:
        if point.launch is not None and point.launch in by_id:
            by_id[point.launch].points.append(point)
    owners = pod_owners(prom, start, end)
    for row in rows:
        row.kube_owners = list(owners_of(row.owners(), owners))
        if row.gpu_keys:
            util = sources.utilization(prom, row.gpu_keys, max(start, row.start), min(end, row.end),
                                       cluster_label=t.cluster_label)
            row.utilization = sum(util.values()) / len(util) if util else None
    return Range(prom.base, start, end, step, window, points, rows, t.utilization_target,
                 t.utilization_low_threshold, owners)


def pod_owners(prom: Prometheus, start: float, end: float) -> dict[str, str]:
    """``namespace/pod`` -> ``Kind/name`` of each pod's owner in the range, from kube-state-metrics'
    ``kube_pod_owner`` ({} without kube-state-metrics); a pod without an owner (``owner_kind="<none>"``) has none."""
    span = promql_duration(max(end - start, 1.0))
    expr = (f"max by (namespace, pod, owner_kind, owner_name) "
            f"(last_over_time({KUBE_POD_OWNER}{{owner_kind!=\"<none>\"}}[{span}]))")
    return owner_map(prom.at_time(end).query(expr))



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



def load_prices(path: str) -> Prices:
    """The prices file at ``path``; MetricsError with one line (``file:line: ...``) when it is not valid."""
    try:
        doc = parse(Path(path).read_text(), path)
    except OSError as err:
        raise MetricsError(f"--prices: cannot read {path}: {err.strerror}") from None
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
