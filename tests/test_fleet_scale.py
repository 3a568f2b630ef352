"""The shipped rules' cost at small scale, held to the budgets of docs/fleet.md (issue 30).

Problem: a rule group that takes longer than its interval misses evaluations and its alerts go
quiet; every series per GPU is paid for by the whole fleet. bench/fleet_scale.py measures both at
1,000 GPUs and extrapolates to 10,000; this test holds the series budget and every rule's health at 200 GPUs.

A real Prometheus (Debian 2.42) with the shipped rules scrapes 25 simulated 8-GPU nodes (bench/
fleet_sim.py: the exporter's own renderer, counters moving, single- and multi-node instrumented
training runs with causes) every second and evaluates every 5 s. Once every shipped rule has been
evaluated, each must have evaluated without error, and the series stored per GPU, once their count
has settled, must stay under the documented budget. The groups' evaluation times are printed, not
asserted: on a shared 2-core CI machine they measure the machine's load as much as the rules;
bench/fleet_scale.py holds them to their budget at 1,000 GPUs (docs/fleet.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import fleet, fleet_doc, fleet_measure, fleet_sim
from testbed import http_get, promql, run_prometheus, wait_until

NODES = 25  # 200 GPUs
EVALUATION = 5  # seconds: every group evaluates within 5 s of the start


def test_fleet_sim_payloads_move_and_differ_per_node() -> None:
    sim = fleet_sim.Fleet(4)
    first = [sim.body(i).decode() for i in range(4)]
    time.sleep(0.05)
    second = sim.body(0).decode()
    assert first[0] != second  # counters moved
    assert [ln.rpartition(" ")[0] for ln in first[0].splitlines()] == \
        [ln.rpartition(" ")[0] for ln in second.splitlines()]  # same series
    # every node has its own GPU UUIDs; the ddp job spans nodes 1 and 2 with 16 ranks
    uuids = [set(fleet_sim._UUID_RE.findall(body)) for body in first]
    assert all(len(u) == fleet_sim.GPUS_PER_NODE for u in uuids)
    assert len(set().union(*uuids)) == 4 * fleet_sim.GPUS_PER_NODE
    ranks = {line.split('rank="')[1].split('"')[0] for body in first[1:3] for line in body.splitlines()
             if line.startswith("gpu_training_steps_total{") and 'run="ddp-job-0000"' in line}
    assert ranks == {str(r) for r in range(16)}
    assert 'run="solo-0000-0"' in first[3] and "zzRUNzz" not in "".join(first)


def evaluated_rules(prom: str) -> list[dict[str, Any]] | None:
    """Every rule of every group with its group's name, once each has been evaluated; None before."""
    groups = json.loads(http_get(prom + "/api/v1/rules"))["data"]["groups"]
    found = [{**rule, "group": group["name"]} for group in groups for rule in group["rules"]]
    return found if found and all(rule["health"] != "unknown" for rule in found) else None


@pytest.mark.slow
def test_report_names_the_slowest_range_and_instant_panels() -> None:
    figures = fleet_measure.Figures(nodes=1, gpus=8, runs=0, scrape_interval=15, seconds=60, load=(0.0, 0.0), queries=[
        (0.30, 0.40, "gpu-node", "SM activity source", 8, "max by (uuid) (\n  gpu:gpu_sm_active:avg5m\n)"),
        (0.10, 5.30, "gpu-training", "Straggler", 16, "run:gpu_training_straggler:wait"),
        (0.20, 0.10, "gpu-fleet", "Busy", 1, "sum(gpu:gpu_utilization:avg5m)")])
    text = fleet_doc.details([figures])
    assert "slowest 5 min range queries: gpu-training/Straggler 5300 ms; gpu-node/SM activity source 400 ms" in text
    assert "slowest instant queries: gpu-node/SM activity source 300 ms; gpu-fleet/Busy 200 ms" in text
    assert "the slowest range panel, gpu-training/Straggler: `run:gpu_training_straggler:wait`" in text
    assert "the slowest instant panel, gpu-node/SM activity source: `max by (uuid) ( gpu:gpu_sm_active:avg5m )`" in text
    older = fleet_measure.Figures(nodes=1, gpus=8, runs=0, scrape_interval=15, seconds=60, load=(0.0, 0.0),
                                  queries=[(0.1, 0.2, "gpu-fleet", "Busy", 1)])  # type: ignore[list-item]
    assert "the slowest" not in fleet_doc.details([older]) and "gpu-fleet/Busy 200 ms" in fleet_doc.details([older])


def test_rule_groups_and_series_within_budget_at_200_gpus(tmp_path: Path) -> None:
    sim = fleet_sim.Fleet(NODES)
    server = fleet_sim.serve(sim)
    shipped = fleet.shipped_rules()
    try:
        hostport = f"127.0.0.1:{server.server_address[1]}"
        config = fleet_measure.prometheus_config(NODES, hostport, scrape_interval=1, evaluation_interval=EVALUATION)
        with run_prometheus(config, files=shipped) as prom:
            wait_until(lambda: len(promql(prom, "node:gpu_utilization:avg5m")) == NODES, 30, interval=0.5,
                       what="node:gpu_utilization:avg5m for every node")
            rules = wait_until(lambda: evaluated_rules(prom), 30, interval=0.5, what="every rule's first evaluation")
            def two_causes() -> list[dict[str, Any]] | None:
                found = promql(prom, "count by (cause) (run:gpu_training_cause:share)")
                return found if len(found) >= 2 else None
            causes = wait_until(two_causes, 60, interval=0.5, what="two causes from the cause rules")
            # What the fleet's Prometheus stores per GPU, once every rule has written its series and the count has
            # settled: the first rounds, on windows of a few samples, hold ~60% more pending alerts (518 ALERTS
            # series right after the first round, 325 from ~20 s on), so a count taken then measures the moment.
            counts: list[float] = []

            def settled() -> float | None:
                counts.append(fleet.scalar(prom, 'count({__name__=~".+"})'))
                return counts[-1] if len(counts) > 1 and abs(counts[-1] - counts[-2]) <= 0.001 * counts[-2] else None
            stored = wait_until(settled, 120, interval=EVALUATION, what="the stored series to settle (0.1% a round)")
            # The cardinality guard (gpu-cardinality.recording): each target's series, and their sum.
            exporters = {r["metric"]["node"]: float(r["value"][1])
                         for r in promql(prom, "instance:gpu_exporter_series:count")}
            (total,) = [float(r["value"][1]) for r in promql(prom, "cluster:gpu_exporter_series:sum")]
            durations, _, _ = fleet_measure.rule_groups(prom)
    finally:
        server.shutdown()
    print(f"\nseries stored per GPU: {stored / (NODES * fleet_sim.GPUS_PER_NODE):.2f}; ms per group evaluation at 200 "
          "GPUs (not asserted):", {g: round(v * 1000, 1) for g, (_, v) in sorted(durations.items())})
    served = {fleet_sim.node_name(i): sum(1 for line in sim.body(i).decode().splitlines()
                                          if line and not line.startswith("#")) for i in range(NODES)}
    assert exporters == served and total == sum(served.values()), (exporters, total)
    gpus = NODES * fleet_sim.GPUS_PER_NODE
    shipped_groups = [g for text in shipped.values() for g in yaml.safe_load(text)["groups"]]
    assert sorted(r["group"] for r in rules) == sorted(g["name"] for g in shipped_groups for _ in g["rules"])
    failed = [(r["group"], r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not failed, failed
    assert stored / gpus < fleet_measure.SERIES_PER_GPU_BUDGET, (stored, gpus)
    assert len(causes) >= 2, causes  # the cause rules ran on real inputs
