"""The verdict package: its layering, its ladder table, and fleet keys (cluster, uuid) as the rules use.

Fast tests: the layering one runs a child Python (imports only), the fleet one reads a fake
Prometheus (a dict of PromQL expression -> samples) through diagnose's real source adapter.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from gpu_exporter import catalog
from gpu_exporter.commands.diagnose_sources import from_prometheus, from_prometheus_window
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.causes import CAUSES
from gpu_exporter.verdict.join import build_views
from gpu_exporter.verdict.ladder import LADDER, judge
from gpu_exporter.verdict.levels import LEVELS, describe

from testbed import exporter_env

T = load_thresholds()
ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
import gpu_exporter.server, gpu_exporter.status_page
from gpu_exporter.status_page import StatusPage
from gpu_exporter.thresholds import load_thresholds
StatusPage(lambda: [], load_thresholds()).status()
print(" ".join(sorted(m for m in sys.modules if m.startswith("gpu_exporter"))))
"""


def test_the_server_and_the_status_page_import_no_command_module() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=exporter_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.split()
    assert "gpu_exporter.verdict.ladder" in loaded  # the probe did judge
    assert [m for m in loaded if m.startswith("gpu_exporter.commands")] == []


def test_the_ladder_has_every_verdict_once_and_every_cause_as_a_row() -> None:
    rows = [row.name for row in LADDER]
    assert len(rows) == len(set(rows))
    assert {c.cause for c in CAUSES} <= set(rows)
    assert {"unknown", "healthy", "unused", "idle_but_allocated", "not_instrumented", "not_instrumented_evidence",
            "underutilized"} <= set(rows)
    for row in LADDER:  # every key a row names is a real threshold, every row below target has a runbook or none
        for key in row.keys:
            assert hasattr(T, key), (row.name, key)
        assert row.promql, row.name
    assert [d["level"] for d in describe(T)] == [lv.name for lv in LEVELS]
    assert [d["below"] for d in describe(T)] == [T.utilization_low_threshold, T.utilization_target]


def _shipped_rules() -> tuple[dict[str, list[str]], dict[str, list[dict[str, str]]]]:
    """alert name -> its expressions, recorded series -> the labels of each of its rules (prometheus/rules)."""
    alerts: dict[str, list[str]] = {}
    records: dict[str, list[dict[str, str]]] = {}
    for path in sorted((ROOT / "prometheus" / "rules").glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    alerts.setdefault(rule["alert"], []).append(rule["expr"])
                else:
                    records.setdefault(rule["record"], []).append(rule.get("labels", {}))
    return alerts, records


def test_every_rows_promql_is_what_the_generated_rules_hold() -> None:
    """A row's alerts are generated alerts, its runbook sections are runbooks.md sections derived from their names,
    and its PromQL is what those alerts hold: each alert's comparison (one per alert, low then target; a cause's
    recorded share, which its alert reads) is in the expression of every rule of that alert. A row no alert speaks
    for shows its condition on recorded series that exist. A cause's share is recorded once, at the run's level."""
    from gpu_exporter.verdict.alerts import runbook_anchor

    from monitoring import build

    model = build()
    alerts, records = _shipped_rules()
    level_exprs = [r["expr"] for path in sorted((ROOT / "prometheus" / "rules").glob("*.rules.yml"))
                   for group in yaml.safe_load(path.read_text())["groups"] for r in group["rules"]
                   if r.get("record") == catalog.RUN_USEFUL_UTILIZATION_LEVEL.name]
    sections = {line[3:].strip().lower() for line in (ROOT / "docs" / "runbooks.md").read_text().splitlines()
                if line.startswith("## ")}
    causes = {c.cause: c for c in CAUSES}
    for row in LADDER:
        named_series = re.findall(r"\b[a-z]+:[a-z0-9_]+:[a-z0-9_]+\b", row.promql)
        assert all(series in records for series in named_series), (row.name, row.promql)
        if not row.alerts:
            assert named_series and (row.anchor, row.target_anchor) == ("", ""), (row.name, row.promql)
            continue
        assert [row.anchor, row.target_anchor][:len(row.alerts)] == [runbook_anchor(a) for a in row.alerts]
        assert {row.anchor, row.target_anchor} - {""} <= sections, row.name
        parts = row.promql.split("\nor\n")
        assert len(parts) == len(row.alerts), (row.name, row.promql)
        for name, part in zip(row.alerts, parts, strict=True):
            rules = model.named(name)
            assert rules and name in alerts, (row.name, name)
            assert all(part in rule.expr() for rule in rules), (row.name, name, part)
        if row.name in causes:
            cause = causes[row.name]
            selector = f'{catalog.RUN_TRAINING_CAUSE_SHARE.name}{{cause="{cause.cause}"}}'
            assert row.alerts == (cause.alert,) and row.promql == selector, (row.name, row.promql)
            assert any(selector in expr for expr in alerts[cause.alert]), (row.name, alerts[cause.alert])
            # one share rule per cause; it takes its level from the run's recorded level, one rule for every level
            assert [labels.get("level") for labels in records[named_series[0]]
                    if labels.get("cause") == cause.cause] == [None], row.name
            (level_expr,) = level_exprs
            assert all(f'"level", "{lv.name}"' in level_expr for lv in LEVELS), row.name


def test_a_rows_condition_moves_with_its_keys() -> None:
    """The thresholds.yml keys a row names are the ones its condition reads: moving the idle row's key, the unused
    row's or a level's line moves the verdict."""
    from dataclasses import replace

    from gpu_exporter.verdict.ladder import BY_ROW
    from gpu_exporter.verdict.views import GpuView, Process

    def view(utilization: float, memory: float, processes: int = 1) -> GpuView:
        procs = tuple(Process("7", "python", 4e10) for _ in range(processes))
        return GpuView("GPU-x", "0", "NVIDIA H100", "n1", utilization, memory, processes, (), (), procs)

    (idle_key,) = BY_ROW["idle_but_allocated"].keys
    idle = getattr(T, idle_key)
    assert judge(view(idle / 2, 0.5), T).name == "idle_but_allocated"
    assert judge(view(idle / 2, 0.5), replace(T, **{idle_key: idle / 4})).name == "not_instrumented"
    (work_key,) = BY_ROW["unused"].keys
    memory = getattr(T, work_key) / 2
    assert judge(view(0.5, memory, processes=0), T).name == "unused"
    assert judge(view(0.5, memory, processes=0), replace(T, **{work_key: memory / 2})).name == "not_instrumented"
    low_key, target_key = BY_ROW["not_instrumented"].keys
    between = (getattr(T, low_key) + getattr(T, target_key)) / 2
    assert judge(view(between, 0.5), T).title == "below target: not instrumented"
    assert judge(view(between, 0.5), replace(T, **{low_key: between + 0.01})).title == "not instrumented"
    (healthy_key,) = BY_ROW["healthy"].keys
    assert judge(view(between, 0.5), replace(T, **{healthy_key: between})).name == "healthy"


class FakePrometheus:
    """Answers instant queries from a table; anything else is empty (as Prometheus is without the series)."""

    base = "http://prometheus.invalid"

    def __init__(self, answers: dict[str, list[tuple[dict[str, str], float]]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def require(self, metric: str, window: str) -> None:
        pass

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """The table's answer; ``max by (a, b) (X)`` as Prometheus gives it: X's, with only labels a and b."""
        self.asked.append(expr)
        by = re.fullmatch(r"max by \(([^)]*)\) \((.*)\)", expr)
        if by is None or expr in self.answers:  # an inline fragment (efficiency's) is answered whole
            return [(dict(labels), value) for labels, value in self.answers.get(expr, [])]
        kept = by.group(1).split(", ")
        return [({k: v for k, v in labels.items() if k in kept}, value)
                for labels, value in self.answers.get(by.group(2), [])]

    def query_many(self, exprs: list[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
        return {expr: self.query(expr) for expr in exprs}


def _gpu(cluster: str, **extra: str) -> dict[str, str]:
    return {"cluster": cluster, "uuid": "GPU-same", "gpu": "0", "node": f"node-{cluster}", **extra}


def _fleet() -> dict[str, list[tuple[dict[str, str], float]]]:
    """Two clusters, each with a GPU of the same UUID: busy in eu; in us input-bound run r holds it at 10%."""
    run = _gpu("us", run="r", rank="0")
    return {
        "gpu_info": [(_gpu("eu", name="H100"), 1.0), (_gpu("us", name="H100"), 1.0)],
        "gpu:gpu_utilization:avg5m": [(_gpu("eu"), 0.93), (_gpu("us"), 0.10)],
        "rate(gpu_busy_seconds_total[600s])": [(_gpu("eu"), 0.93), (_gpu("us"), 0.10)],
        "gpu:gpu_memory_used:ratio": [(_gpu("eu"), 0.6), (_gpu("us"), 0.5)],
        "gpu_process_memory_used_bytes": [(_gpu("us", pid="7", process_name="python"), 2.0 ** 33)],
        "run:gpu_training_phase:share5m": [({**run, "phase": "data"}, 0.85), ({**run, "phase": "compute"}, 0.15)],
        "gpu_training_phase_seconds_total": [({**run, "phase": "data"}, 85.0), ({**run, "phase": "compute"}, 15.0)],
        "increase(gpu_training_phase_seconds_total[600s])": [({**run, "phase": "data"}, 85.0),
                                                           ({**run, "phase": "compute"}, 15.0)],
        "gpu_training_current_phase == 1": [({**run, "phase": "compute"}, 1.0)],
        "run:gpu_useful_utilization:avg5m": [(run, 0.10)],
        "run:gpu_training_cause:share": [({**run, "cause": "input_bound", "level": "low"}, 0.85)],
        "run:gpu_training_cause:projected_utilization": [({**run, "cause": "input_bound"}, 0.67)],
    }


def _verdicts(readings: Any) -> dict[str, tuple[str, str, int]]:
    views = build_views(readings, T, 300.0)
    return {v.cluster: (v.uuid, judge(v, T).name, len(v.runs)) for v in views}


def test_fleet_mode_keeps_two_clusters_with_the_same_gpu_uuid_apart() -> None:
    prom: Any = FakePrometheus(_fleet())
    expected = {"eu": ("GPU-same", "healthy", 0), "us": ("GPU-same", "input_bound", 1)}
    assert _verdicts(from_prometheus(prom, cluster_label=T.cluster_label)) == expected
    assert _verdicts(from_prometheus_window(prom, 600.0, cluster_label=T.cluster_label)) == expected
    # Keyed by uuid alone (the old behaviour) the two GPUs would share one key: the test can tell.
    merged = build_views(from_prometheus(prom, cluster_label=""), T, 300.0)
    assert {judge(v, T).name for v in merged} == {"input_bound"}


def test_the_launches_are_read_only_when_asked_for() -> None:
    """diagnose reads the runs' start times only to choose among launches of a name (``--run``, ``--run-id``): a
    fleet-wide read skips their query, and the verdicts stay the same."""
    start = catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS.name
    answers = {**_fleet(), start: [(_gpu("us", run="r", rank="0", run_id="job-1"), 1000.0)]}
    asked: Any = FakePrometheus(answers)
    readings = from_prometheus(asked, cluster_label=T.cluster_label)
    assert readings.launches == {("r", "0", "us/GPU-same"): ("job-1", 1000.0)}
    skipped: Any = FakePrometheus(answers)
    fleet_wide = from_prometheus(skipped, cluster_label=T.cluster_label, launches=False)
    assert fleet_wide.launches == {} and not [e for e in skipped.asked if start in e]
    assert any(start in e for e in asked.asked)
    assert _verdicts(fleet_wide) == _verdicts(readings)


def test_from_prometheus_a_gpu_level_cause_is_the_one_the_rules_found() -> None:
    """diagnose --prometheus-url takes the GPU-level cause the recording rules found (gpu:gpu_busy_not_effective:ratio,
    what the alerts hold), as it takes the run causes: here the rules found memory-bound while the 5m DRAM mean diagnose
    reads beside it is below the line (a GPU whose kernels turned memory-bound a minute ago, or rules whose windows
    differ from diagnose's 5m). Over any other window (--window) diagnose judges with the table itself."""
    from gpu_exporter.verdict.efficiency import dram_query, for_cluster, sm_query, tensor_query

    gpu = _gpu("eu")
    busy, sm, tensor, dram = 0.96, 0.3, 0.2, 0.3  # SM low, DRAM below dram_bound_ratio, memory used: ineffective here
    answers = {
        "gpu_info": [(_gpu("eu", name="H100"), 1.0)],
        "gpu:gpu_utilization:avg5m": [(gpu, busy)], "rate(gpu_busy_seconds_total[600s])": [(gpu, busy)],
        "gpu:gpu_memory_used:ratio": [(gpu, 0.6)],
        "gpu_process_memory_used_bytes": [(_gpu("eu", pid="7", process_name="python"), 2.0 ** 35)],
        "gpu:gpu_sm_active:avg5m": [({**gpu, "source": "gpm"}, sm)],
        for_cluster(tensor_query(), T.cluster_label): [(gpu, tensor)],
        for_cluster(dram_query(), T.cluster_label): [(gpu, dram)],
        for_cluster(sm_query("600s"), T.cluster_label): [({**gpu, "source": "gpm"}, sm)],
        for_cluster(tensor_query("600s"), T.cluster_label): [(gpu, tensor)],
        for_cluster(dram_query("600s"), T.cluster_label): [(gpu, dram)],
    }
    recorded = {**answers, catalog.GPU_BUSY_NOT_EFFECTIVE_RATIO.name: [({**gpu, "cause": "memory_bound"}, busy - sm)]}
    for fleet, window, verdict in ((recorded, None, "memory_bound"), (answers, None, "ineffective"),
                                   (recorded, 600.0, "ineffective")):
        prom: Any = FakePrometheus(fleet)
        readings = (from_prometheus(prom, cluster_label=T.cluster_label) if window is None
                    else from_prometheus_window(prom, window, cluster_label=T.cluster_label))
        (view,) = build_views(readings, T, 300.0)
        got = judge(view, T)
        assert (got.name, view.dram_active) == (verdict, dram), (window, got)
        assert got.worth is not None and abs(got.worth - (busy - sm)) < 1e-9


def test_below_target_verdicts_link_the_alert_that_speaks_at_their_level() -> None:
    from gpu_exporter.verdict.views import GpuView, Process

    from monitoring import build

    model = build()
    for utilization, alert in ((0.1, "GpuUtilizationLow"), (0.5, "GpuUtilizationBelowTarget")):
        view = GpuView("GPU-x", "0", "NVIDIA H100", "n1", utilization, 0.5, 1, (), (), (Process("7", "python", 4e10),))
        verdict = judge(view, T)
        assert verdict.name == "not_instrumented", verdict
        assert verdict.runbook == T.runbook_url(model.alert(alert).anchor), (utilization, verdict.runbook)


def test_a_busy_rank_waiting_in_collectives_is_judged_at_its_useful_utilization() -> None:
    """On a real GPU an NCCL kernel spins while its rank waits: 95% busy, yet 65% of the step in collectives.
    The judge reads the level at min(u, 1 - communication share) (useful 35%: below target, ST, not healthy),
    the projection starts there, and the reason says both figures."""
    from gpu_exporter.verdict.views import Readings

    def key(rank: str) -> tuple[str, str, str]:
        return ("ddp", rank, f"GPU-{rank}")

    readings = Readings(info=[{"uuid": "GPU-0", "gpu": "0"}, {"uuid": "GPU-1", "gpu": "1"}],
                        utilization={"GPU-0": 0.95, "GPU-1": 0.3}, memory_ratio={"GPU-0": 0.5, "GPU-1": 0.5},
                        phase_total={key("0"): {"compute": 35.0, "communication": 65.0},
                                     key("1"): {"data": 60.0, "compute": 35.0, "communication": 5.0}},
                        live={key("0"), key("1")}, cluster_label="")
    waiting, straggler = build_views(readings, T, 300.0)
    verdict = judge(waiting, T)
    assert (verdict.name, verdict.level, verdict.title) == ("straggler", "target",
                                                              "below target: waiting for a straggler (ST)")
    assert verdict.reason.startswith("35% useful (95% busy, 65% of the step in collectives) now, at most ~87% if "
                                     "rank 1 kept up"), verdict.reason
    assert judge(straggler, T).name == "input_bound"
    # The same GPU whose run spends 5% in collectives is healthy, and says its utilization as before.
    readings.phase_total[key("0")] = {"compute": 95.0, "communication": 5.0}
    readings.phase_total[key("1")] = {"compute": 95.0, "communication": 5.0}
    readings.utilization["GPU-1"] = 0.95
    healthy = judge(build_views(readings, T, 300.0)[0], T)
    assert (healthy.name, healthy.reason) == ("healthy", "95% utilization, at or above the 85% target; how well its "
                                              "kernels use the SMs is unknown (no SM activity source).")
    # 95% busy with a quarter of the step in collectives and no cause: below target, saying why.
    readings.phase_total[key("0")] = {"compute": 75.0, "communication": 25.0}
    readings.phase_total[key("1")] = {"compute": 75.0, "communication": 25.0}
    below = judge(build_views(readings, T, 300.0)[0], T)
    assert (below.name, below.level) == ("underutilized", "target")
    assert below.reason.startswith("75% useful utilization (95% busy, 25% of the step in collectives) (target 85%)")


def test_two_clusters_runs_of_one_name_are_two_runs() -> None:
    """Run ``ddp`` in eu and in us, on GPUs of the same UUIDs: in eu rank 0 waits for input-bound rank 1 (ST), in
    us both ranks are balanced and healthy. The ranks are compared, and the runs listed, per cluster and run."""
    from gpu_exporter.verdict import ranks
    from gpu_exporter.verdict.views import Readings

    def key(cluster: str, rank: str) -> tuple[str, str, str]:
        return ("ddp", rank, f"{cluster}/GPU-{rank}")

    eu = {key("eu", "0"): {"compute": 35.0, "communication": 65.0},
          key("eu", "1"): {"data": 60.0, "compute": 35.0, "communication": 5.0}}
    us = {key("us", rank): {"compute": 95.0, "communication": 5.0} for rank in ("0", "1")}
    readings = Readings(
        info=[{"cluster": c, "uuid": f"GPU-{r}", "gpu": r, "node": f"{c}-node"} for c in ("eu", "us") for r in "01"],
        utilization={"eu/GPU-0": 0.95, "eu/GPU-1": 0.3, "us/GPU-0": 0.95, "us/GPU-1": 0.95},
        memory_ratio={f"{c}/GPU-{r}": 0.5 for c in ("eu", "us") for r in "01"},
        phase_total={**eu, **us}, live={*eu, *us}, cluster_label="cluster")
    results = [(v, judge(v, T)) for v in build_views(readings, T, 300.0)]
    verdicts = {(v.cluster, v.gpu): verdict for v, verdict in results}
    assert {k: v.name for k, v in verdicts.items()} == {
        ("eu", "0"): "straggler", ("eu", "1"): "input_bound", ("us", "0"): "healthy", ("us", "1"): "healthy"}
    assert "rank 1 is input-bound" in verdicts["eu", "0"].reason, verdicts["eu", "0"].reason
    runs = ranks.distributed_runs(results)
    assert [(d.cluster, d.run, len(d.ranks), d.straggler) for d in runs] == [("eu", "ddp", 2, "1"),
                                                                            ("us", "ddp", 2, "")]
    assert [d["cluster"] for d in ranks.to_doc(runs)] == ["eu", "us"]
    assert "Run ddp in cluster eu: 2 of 2 ranks reporting" in ranks.render_text(runs)


def _uninstrumented(window: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Two clusters, one UUID, no training run: in us pid 7's main thread is runnable 97% of the window with no
    worker (the evidence row, main_busy); in eu pid 7 mostly sleeps (plain "not instrumented"). ``window``: the
    raw counters' rates over it (``300s`` also answers the evidence rules' 5m series, as the rules compute them)."""
    proc = {cluster: _gpu(cluster, pid="7") for cluster in ("eu", "us")}
    states = {"us": {"running": 0.97, "sleeping": 0.03}, "eu": {"running": 0.05, "sleeping": 0.95}}
    cores = {"us": 0.98, "eu": 0.05}
    answers: dict[str, list[tuple[dict[str, str], float]]] = {
        "gpu_info": [(_gpu("eu", name="H100"), 1.0), (_gpu("us", name="H100"), 1.0)],
        "gpu:gpu_utilization:avg5m": [(_gpu("eu"), 0.2), (_gpu("us"), 0.1)],
        f"rate(gpu_busy_seconds_total[{window}])": [(_gpu("eu"), 0.2), (_gpu("us"), 0.1)],
        "gpu:gpu_memory_used:ratio": [(_gpu("eu"), 0.5), (_gpu("us"), 0.5)],
        "gpu_memory_used_bytes": [(_gpu("eu"), 4e10), (_gpu("us"), 4e10)],
        "gpu_memory_total_bytes": [(_gpu("eu"), 8e10), (_gpu("us"), 8e10)],
        "gpu_process_memory_used_bytes": [({**proc[c], "process_name": "python"}, 4e10) for c in proc],
        "gpu_process_child_processes": [(proc[c], 0.0) for c in proc],
        f"rate(gpu_process_cpu_seconds_total[{window}])": [(proc[c], cores[c]) for c in proc],
        f"rate(gpu_process_children_cpu_seconds_total[{window}])": [(proc[c], 0.0) for c in proc],
        f"rate(gpu_process_read_bytes_total[{window}])": [(proc[c], 0.0) for c in proc],
        f"rate(gpu_process_main_thread_state_seconds_total[{window}])": [
            ({**proc[c], "state": s}, v) for c in proc for s, v in states[c].items()],
    }
    if window == "300s":  # the evidence rules' series over the same 5m (monitoring/evidence.py)
        answers.update({
            catalog.PROCESS_CPU_RATE5M.name: [(proc[c], cores[c]) for c in proc],
            catalog.PROCESS_CHILDREN_CPU_RATE5M.name: [(proc[c], 0.0) for c in proc],
            catalog.PROCESS_READ_BYTES_RATE5M.name: [(proc[c], 0.0) for c in proc],
            catalog.PROCESS_MAIN_THREAD_STATE_SHARE5M.name: [
                ({**proc[c], "state": s}, v) for c in proc for s, v in states[c].items()],
            catalog.PROCESS_HINT_VALUE.name: [({**proc["us"], "hint": "main_busy", "code": "M1"}, 0.97)],
        })
    return answers


def test_a_window_read_from_raw_counters_says_the_evidence_of_an_uninstrumented_gpu() -> None:
    """from_prometheus_window reads the processes' counters over the window (their rates, as the evidence rules
    compute them for 5m) and the evidence table finds the hint: the same verdict, hint and evidence as the rules'
    series give from_prometheus, per cluster."""
    def said(readings: Any) -> dict[str, tuple[str, str, str, str, tuple[Any, ...]]]:
        views = build_views(readings, T, 300.0)
        return {v.cluster: (judge(v, T).name, judge(v, T).code, judge(v, T).title, v.evidence_hint, v.evidence)
                for v in views}

    expected = {"us": ("not_instrumented", "M1", "not instrumented: likely input-bound (M1)", "main_busy"),
                "eu": ("not_instrumented", "", "not instrumented", "")}
    prom: Any = FakePrometheus(_uninstrumented("600s"))
    window = said(from_prometheus_window(prom, 600.0, cluster_label=T.cluster_label))
    assert {c: v[:4] for c, v in window.items()} == expected
    assert [(p.pid, p.name, p.cpu_cores, p.child_processes, dict(p.states)) for p in window["us"][4]] == [
        ("7", "python", 0.98, 0, {"running": 0.97, "sleeping": 0.03})]
    prom = FakePrometheus(_uninstrumented("300s"))
    assert said(from_prometheus_window(prom, 300.0, cluster_label=T.cluster_label)) == said(
        from_prometheus(prom, cluster_label=T.cluster_label)) == window
    # Each query is trimmed to the labels read (max by), the states' to (uuid, pid, state) and the cluster.
    assert "max by (uuid, pid, state, cluster) (rate(gpu_process_main_thread_state_seconds_total[300s]))" in prom.asked


def test_a_busy_gpu_is_judged_by_its_sm_activity_and_never_called_effective_without_a_source() -> None:
    """The efficiency rows (verdict/efficiency.py) come before "healthy": a GPU 96% busy whose SMs are 25% active
    with memory left is M3 of the SMs, worth busy - SM activity; every verdict states the effective-use line, with
    the compute phase's SM activity where a run reports phases; with no SM source the line says so."""
    from gpu_exporter.verdict.efficiency import EFFICIENCY, UNKNOWN
    from gpu_exporter.verdict.views import GpuView, RunView

    rows = [row.name for row in LADDER]
    assert rows[1:6] == [*(c.cause for c in EFFICIENCY), "healthy"]
    run = RunView("r", "0", {"data": 0.2, "compute": 0.8}, 60.0, False, None, 0.0, 0.0)

    def view(sm: float | None, memory: float = 0.2, source: str | None = "gpm", busy: float = 0.96,
             tensor: float | None = 0.3, dram: float | None = 0.1) -> GpuView:
        return GpuView("GPU-1", "0", "NVIDIA H100", "n1", busy, memory, 1, (), (run,), sm_active=sm,
                       tensor_active=tensor, dram_active=dram, sm_source=source)

    small = judge(view(0.25), T)
    assert (small.name, small.code, small.below_target) == ("sm_batch_too_small", "M3", False)
    assert small.worth is not None and abs(small.worth - 0.71) < 1e-9 and small.projected == 0.96
    assert small.effective == ("effective utilization (SM activity, GPM) 25% while 96% busy; tensor pipe 30%, DRAM 10%;"
                               " compute phase (80% of the step) 31% SM activity")
    assert small.runbook.endswith("#gpusmbatchtoosmall") and "batch size" in small.remedy
    assert judge(view(0.25, dram=0.7), T).name == "memory_bound"  # memory-bound first, even with memory left
    assert judge(view(0.25, memory=0.7), T).name == "ineffective"  # memory used, DRAM not saturated
    assert judge(view(0.7, tensor=0.0), T).name == "tensor_cores_idle"
    assert judge(view(0.7, tensor=None), T).name == "healthy"  # no tensor pipe reported: no TC
    assert judge(view(0.25, busy=0.6), T).name != "sm_batch_too_small"  # below the target: the run causes speak
    healthy = judge(view(0.9, tensor=0.6, dram=0.3), T)
    assert (healthy.name, healthy.worth) == ("healthy", None) and "SMs are 90% active" in healthy.reason
    unknown = judge(view(None, source=None, tensor=None, dram=None), T)
    assert unknown.name == "healthy" and unknown.effective == UNKNOWN and "effective" not in unknown.reason


def test_tensor_cores_idle_names_the_dcgm_fp_pipe_that_carries_the_math() -> None:
    """dcgm-exporter's fp pipe fields, read by the node path (verdict.readings.dcgm) beside its SM, tensor and DRAM
    fields: the busiest pipe is the evidence in the reason of tensor cores idle and says what the math does (fp64:
    check the dtype; fp16: half precision on the CUDA cores), every pipe served is in the effective line and the
    view; a GPU without the fields reads as before. Only evidence: the verdict is TC either way."""
    from gpu_exporter.verdict import readings as node_readings
    from gpu_exporter.verdict.samples import Snapshot
    from gpu_exporter.verdict.views import Readings, gpu_key

    pipes = {"fp64": (0.02, 0.0, 0.4), "fp16": (0.05, 0.45, 0.0), "fp32": (0.4, 0.0, 0.0), "none": None}
    info = [{"uuid": f"GPU-{name}", "gpu": str(i), "name": "NVIDIA A100", "node": "n1"}
            for i, name in enumerate(pipes)]
    readings = Readings(info=info, cluster_label="")
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for i, (name, fp) in enumerate(pipes.items()):
        readings.utilization[gpu_key("", f"GPU-{name}")] = 0.96
        readings.memory_ratio[gpu_key("", f"GPU-{name}")] = 0.6
        fields = [catalog.DCGM_SM_ACTIVE, catalog.DCGM_TENSOR_ACTIVE, catalog.DCGM_DRAM_ACTIVE]
        values = [0.78, 0.0, 0.3]
        if fp is not None:
            fields += [catalog.DCGM_FP32_ACTIVE, catalog.DCGM_FP16_ACTIVE, catalog.DCGM_FP64_ACTIVE]
            values += fp
        for field, value in zip(fields, values, strict=True):
            series.setdefault(field.name, []).append(({"UUID": f"GPU-{name}", "gpu": str(i)}, value))
    node_readings.dcgm(readings, Snapshot(series, at=0.0, wall=0.0))
    judged = {v.uuid: (v, judge(v, T)) for v in build_views(readings, T, 300.0)}
    assert {u: verdict.name for u, (_, verdict) in judged.items()} == dict.fromkeys(judged, "tensor_cores_idle")

    view, fp64 = judged["GPU-fp64"]
    assert (view.fp32_active, view.fp16_active, view.fp64_active) == (0.02, 0.0, 0.4)
    assert ("its tensor pipe only 0% and its FP64 pipe 40% (DCGM): its math runs in float64 and the tensor cores "
            "idle: check the tensors' dtype first (numpy arrays default to float64 and torch.from_numpy keeps it)"
            in fp64.reason), fp64.reason
    assert "tensor pipe 0%, FP32 pipe 2%, FP16 pipe 0%, FP64 pipe 40%, DRAM 30%" in fp64.effective, fp64.effective
    _, fp16 = judged["GPU-fp16"]
    assert ("its FP16 pipe 45% (DCGM): its half-precision math runs on the CUDA cores and the tensor cores idle "
            "(elementwise fp16 ops, or matmul shapes the tensor cores cannot take)" in fp16.reason), fp16.reason
    assert "FP16 pipe 45%" in fp16.effective and "float64" not in fp16.reason
    _, fp32 = judged["GPU-fp32"]
    assert "its FP32 pipe 40% (DCGM): its math runs on the fp32 pipes and the tensor cores idle" in fp32.reason
    view, none = judged["GPU-none"]
    assert (view.fp32_active, view.fp16_active, view.fp64_active) == (None, None, None)
    assert "pipe only 0%: its math runs on the fp32 pipes" in none.reason and "FP" not in none.reason + none.effective


def test_diagnose_prometheus_reads_the_dcgm_fp_pipes_per_cluster() -> None:
    """The Prometheus paths send each fp pipe's query (verdict.efficiency.FP_PIPES, dcgm-exporter's field by UUID)
    beside the tensor and DRAM ones: the same GPU in two clusters gets its own pipes, and the busiest names the math."""
    from gpu_exporter.verdict.efficiency import DRAM, FP_PIPES, TENSOR, for_cluster

    fp = {"us": {"fp32": 0.01, "fp16": 0.0, "fp64": 0.38}, "eu": {"fp32": 0.41, "fp16": 0.0, "fp64": 0.0}}
    answers: dict[str, list[tuple[dict[str, str], float]]] = {
        "gpu_info": [(_gpu(c, name="A100"), 1.0) for c in fp],
        "gpu:gpu_utilization:avg5m": [(_gpu(c), 0.96) for c in fp],
        "gpu:gpu_memory_used:ratio": [(_gpu(c), 0.6) for c in fp],
        catalog.GPU_SM_ACTIVE_AVG5M.name: [(_gpu(c, source="dcgm"), 0.78) for c in fp],
        for_cluster(TENSOR, T.cluster_label): [(_gpu(c), 0.0) for c in fp],
        for_cluster(DRAM, T.cluster_label): [(_gpu(c), 0.3) for c in fp],
        **{for_cluster(p.query(), T.cluster_label): [(_gpu(c), fp[c][p.key]) for c in fp] for p in FP_PIPES}}
    prom: Any = FakePrometheus(answers)
    views = {v.cluster: v for v in build_views(from_prometheus(prom, cluster_label=T.cluster_label), T, 300.0)}
    assert {c: (v.fp32_active, v.fp16_active, v.fp64_active) for c, v in views.items()} == {
        c: (p["fp32"], p["fp16"], p["fp64"]) for c, p in fp.items()}
    us, eu = judge(views["us"], T), judge(views["eu"], T)
    assert (us.name, eu.name) == ("tensor_cores_idle", "tensor_cores_idle")
    assert "its FP64 pipe 38% (DCGM): its math runs in float64" in us.reason, us.reason
    assert "its FP32 pipe 41% (DCGM): its math runs on the fp32 pipes" in eu.reason, eu.reason
