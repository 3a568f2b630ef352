"""``report --fleet``'s funnel (gpu_exporter.verdict.funnel): allocated GPU-hours -> busy -> effective, with the hours
lost at each step by cause, on a judged range whose SM activity is known: without servers, and end to end (a
simulated node of bench/fleet_sim.py serving a known SM activity per GPU, a real Prometheus, ``gpu-exporter report
--fleet``)."""

from __future__ import annotations

import json
import random
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from gpu_exporter import catalog
from gpu_exporter.commands.fleet_render import render_json, render_text
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.fleet import LaunchRow, Point, Range, fleet
from gpu_exporter.verdict.funnel import NO_CAUSE, Funnel, Slice, funnel
from gpu_exporter.verdict.views import GpuKey
from test_alerting_e2e import fast_rules
from test_query import run_cli

from bench import fleet as fleet_bench
from bench import fleet_sim
from testbed import http_get, run_prometheus, wait_until

REPO = Path(__file__).resolve().parents[1]
T = load_thresholds(None)
STEP, POINTS = 60.0, 120  # two hours at one point a minute
# uuid: (verdict, busy, SM activity or None: no source). The truth each GPU's readings scatter around.
TRUTH: dict[str, tuple[str, float, float | None]] = {
    "GPU-a": ("sm_batch_too_small", 0.95, 0.30),  # busy, most SMs idle, memory left (M3)
    "GPU-b": ("tensor_cores_idle", 0.92, 0.70),  # fp32 math (TC)
    "GPU-c": ("memory_bound", 0.90, 0.35),  # memory-bound (MB)
    "GPU-d": ("healthy", 0.93, 0.85),  # effective
    "GPU-e": ("input_bound", 0.20, 0.15),  # below target: its run cause explains it
    "GPU-f": ("not_instrumented", 0.60, None),  # no GPM, no dcgm-exporter: SM activity unknown
    "GPU-g": ("unused", 0.0, 0.0),  # no work: free capacity, not allocated
}


def _point(rng: random.Random, k: int, uuid: str) -> Point:
    """One judged point: a 5m window's readings, the truth plus sampling noise (at most 0.02 either way)."""
    verdict, busy, sm = TRUTH[uuid]
    b = min(1.0, max(0.0, busy + rng.uniform(-0.02, 0.02)))
    s = None if sm is None else min(b, max(0.0, sm + rng.uniform(-0.02, 0.02)))
    launch = ("train", "r1") if uuid == "GPU-e" else None
    return Point(STEP * k, uuid, uuid, "node-1", "NVIDIA H100 80GB HBM3", (), verdict, verdict, "",
                 verdict in ("input_bound", "not_instrumented"), b, "fix it.", launch, STEP, False, s)


def _range(seed: int) -> Range:
    rng = random.Random(seed)
    points = [_point(rng, k, uuid) for k in range(1, POINTS + 1) for uuid in TRUTH]
    run = LaunchRow("train", ["r1"], 0.0, STEP * POINTS, {}, {("0", GpuKey("", "GPU-e")): STEP * POINTS})
    run.points = [p for p in points if p.launch]
    return Range("http://prometheus:9090", 0.0, STEP * POINTS, STEP, 5 * STEP, points, [run], T.utilization_target,
                 T.utilization_low_threshold)


def _truth() -> Funnel:
    """The funnel the GPUs' true shares make over the range (each GPU the whole range)."""
    hours = STEP * POINTS / 3600
    return funnel(Slice(hours * 3600, busy, sm, verdict) for verdict, busy, sm in TRUTH.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_funnel_of_a_fleet_with_known_sm_activity_matches_the_truth(seed: int) -> None:
    """Each step's GPU-hours and each cause's lost hours are within 5% of what the GPUs' true busy and SM shares
    make; an unused GPU is not allocated; a GPU without a source is unknown, neither effective nor lost."""
    got, want = fleet(_range(seed), None).funnel, _truth()
    assert want.allocated == pytest.approx(6 * 2.0)  # six GPUs with work, two hours each
    for name in ("allocated", "busy", "effective", "unknown", "idle", "ineffective"):
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=0.05), name
    assert set(got.ineffective_by) == {"sm_batch_too_small", "tensor_cores_idle", "memory_bound", NO_CAUSE}
    for cause, hours in want.ineffective_by.items():
        assert got.ineffective_by[cause] == pytest.approx(hours, rel=0.05), cause
    for verdict, hours in want.idle_by.items():
        assert got.idle_by[verdict] == pytest.approx(hours, rel=0.05), verdict
    # busy = effective + lost busy -> effective + unknown (SM activity never above busy here)
    assert got.busy == pytest.approx(got.effective + got.ineffective + got.unknown)
    assert got.unknown == pytest.approx(2.0 * 0.60, rel=0.05) and "not_instrumented" not in got.ineffective_by


def test_the_report_shows_the_funnel() -> None:
    """Text and JSON carry the three steps and the biggest causes of each loss."""
    f = fleet(_range(1), None)
    text = render_text(f)
    assert "allocated GPU-hours" in text and "effective GPU-hours" in text and "lost, busy -> effective" in text
    effective = text[text.index("lost, busy -> effective"):text.index("SM activity unknown")]
    assert f.titles["sm_batch_too_small"].split(" (")[0] in effective  # named by its title, biggest first
    assert max(len(line) for line in text.splitlines()) <= 100
    data = json.loads(render_json(f))["funnel"]
    assert data["allocated_gpu_hours"] == pytest.approx(f.funnel.allocated, abs=1e-6)
    assert next(iter(data["lost_busy_to_effective"])) == "sm_batch_too_small"  # the biggest loss first


def test_sm_activity_above_busy_counts_as_effective_and_loses_nothing() -> None:
    f = funnel([Slice(3600.0, 0.5, 0.6, "healthy"), Slice(3600.0, None, 0.5, "unknown")])
    assert (f.allocated, f.busy, f.effective, f.ineffective) == (1.0, 0.5, 0.5, 0.0)


SM_FACTORS = (0.9, 0.6, 0.3, 0.9, 0.6, 0.3, 0.9, 0.3)
"""Each GPU's SM activity as a share of its busy utilization, by index on the node (the busiest, GPU 7 at ~90%
busy, is at or above the target with SM activity well below sm_active_low: busy but not effective)."""
RULES = {f"rules/{path.name}": fast_rules(path) for path in sorted((REPO / "prometheus" / "rules").glob("*.yml"))}
"""The shipped rules, their windows shrunk 60-fold (test_alerting_e2e.fast_rules)."""
SECONDS = 10.0
"""The range the report judges (points every 2 s, each judged over the 8 s before it)."""
SCRAPES = """
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [rules/*.yml]
scrape_configs:
  - job_name: gpu-exporter
    static_configs: {targets}
"""


def _instant(prom: str, expr: str, at: float) -> list[dict[str, Any]]:
    """An instant query at ``at``: the dashboard panel as Grafana asks for it at the end of its range."""
    body = json.loads(http_get(f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': expr, 'time': at})}"))
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.mark.slow
def test_report_fleet_funnel_matches_the_sm_activity_a_simulated_node_serves() -> None:
    """One simulated 8-GPU node (the shared kind: 8 uninstrumented processes a GPU, 20-90% busy) serves a known SM
    activity per GPU (its busy utilization x SM_FACTORS); a real Prometheus scrapes it every second, and ``report
    --fleet --output json`` over the last 10 s judges it. Allocated, busy and effective GPU-hours, and the hours lost
    busy -> effective by cause, are within 5% of what the served counters and gauges make."""
    sim = fleet_sim.Fleet(1)
    template = sim.templates[0]
    busy = {uuid: template.rate(catalog.GPU_BUSY_SECONDS_TOTAL.name, uuid) for uuid in template.uuids}
    served = {uuid: round(busy[uuid] * SM_FACTORS[j], 4) for j, uuid in enumerate(template.uuids)}
    sim.templates = [template.pinned(catalog.GPU_SM_ACTIVE_RATIO.name, served.__getitem__)]
    server = fleet_sim.serve(sim)
    try:
        hostport = f"127.0.0.1:{server.server_address[1]}"
        targets = json.dumps(list(fleet_sim.targets(1, hostport)))
        with run_prometheus(SCRAPES.format(targets=targets), RULES) as prom:
            first = time.time()
            wait_until(lambda: time.time() - first > 25, 40, 1.0, what="25 s of scrapes")
            end = time.time() - 2  # the last scrape is in
            result = run_cli("report", "--prometheus-url", prom, "--fleet", "--output", "json", "--from",
                             str(end - SECONDS), "--to", str(end), "--step", "2s", timeout=120)
            board = {title: expr for dashboard, title, expr in fleet_bench.dashboard_queries(
                {**fleet_bench.grafana_variables(), "__range": f"{SECONDS:.0f}s", "__interval": "1s",
                 "__interval_ms": "1000"}) if dashboard == "gpu-fleet-cost"}
            panel = {title: _instant(prom, board[title], end) for title in (
                "Funnel: allocated, busy, effective GPU-hours", "GPU-hours lost busy to effective, by cause",
                "GPU-hours lost, busy to effective")}
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout)["funnel"]
    seconds = SECONDS
    t = load_thresholds(None)
    at_target_low = [u for u in busy if busy[u] >= t.utilization_target and served[u] < t.sm_active_low]
    assert at_target_low, "the node needs a GPU that is busy but not effective"
    hours = {"allocated": len(busy) * seconds / 3600, "busy": sum(busy.values()) * seconds / 3600,
             "effective": sum(served.values()) * seconds / 3600,
             "effective_cause": sum(busy[u] - served[u] for u in at_target_low) * seconds / 3600}
    assert got["allocated_gpu_hours"] == pytest.approx(hours["allocated"], rel=0.05)
    assert got["busy_gpu_hours"] == pytest.approx(hours["busy"], rel=0.05)
    assert got["effective_gpu_hours"] == pytest.approx(hours["effective"], rel=0.05)
    assert got["sm_unknown_busy_gpu_hours"] == 0  # every GPU has GPM
    lost = got["lost_busy_to_effective"]
    by_cause = sum(v for k, v in lost.items() if k != NO_CAUSE)
    assert by_cause == pytest.approx(hours["effective_cause"], rel=0.05), lost
    assert sum(lost.values()) == pytest.approx(hours["busy"] - hours["effective"], rel=0.05), lost
    # the cost dashboard's funnel over the same 10 s, from the shipped recording rules (windows shrunk 60-fold, so
    # their 5m rates cover 5 s), says the same
    bars = {s["metric"]["step"]: float(s["value"][1]) for s in panel["Funnel: allocated, busy, effective GPU-hours"]}
    assert bars["1 allocated"] == pytest.approx(hours["allocated"], rel=0.05), bars
    assert bars["2 busy"] == pytest.approx(hours["busy"], rel=0.05), bars
    assert bars["3 effective"] == pytest.approx(hours["effective"], rel=0.05), bars
    causes = {s["metric"]["cause"]: float(s["value"][1]) for s in panel["GPU-hours lost busy to effective, by cause"]}
    found = sum(v for k, v in causes.items() if k != NO_CAUSE)
    assert found == pytest.approx(hours["effective_cause"], rel=0.05), causes
    # the total busy -> effective, computed at query time (the recorded series holds only the GPUs with a cause),
    # and the hours of no cause (the total less the causes'): the GPUs below the target or effective enough
    (total,) = [float(s["value"][1]) for s in panel["GPU-hours lost, busy to effective"]]
    assert total == pytest.approx(hours["busy"] - hours["effective"], rel=0.05), total
    assert causes[NO_CAUSE] == pytest.approx(hours["busy"] - hours["effective"] - hours["effective_cause"],
                                             rel=0.05), causes
    assert sum(causes.values()) == pytest.approx(total, rel=0.05), causes  # the bars add up to the total
