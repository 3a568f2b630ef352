"""The cause table has one meaning: the generated PromQL and the Python judge agree on every case.

Each case below is one training run on one GPU (utilization, memory, phase shares, allocator
events, live or finished, optional cluster label). The same cases are fed to

* promtool: a rule unit test generated here feeds them as input series to the shipped rules and
  expects ``run:gpu_training_cause:share`` and ``run:gpu_training_cause:projected_utilization`` to
  hold exactly the findings of the judge (labels cause/code/remedy/level and values);
* the judge, :func:`gpu_exporter.verdict.causes.find_causes`, whose findings are those expectations.

promtool fails the test on any disagreement in either direction. The cases cover every cause at
both levels, the healthy band, finished runs, thresholds not passed, two clusters that reuse
one GPU UUID, and distributed runs (cases sharing a ``run``, one per rank): a straggler whose
waiting ranks are named ST (never M3, even with little memory used), and balanced ranks that are not;
balanced ranks that all sit in collectives (communication-bound, CM, on every rank), and a straggler
run whose common communication is CM and whose waiting ranks' excess is ST (the same time never both).
Busy but waiting: on a real GPU an NCCL kernel spins while its rank waits, so the GPU reads ~95% busy on
a rank waiting for a straggler or on every rank of a communication-bound run; both sides judge the level
at the useful utilization min(u, 1 - communication share), so ST and CM are still named there.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.causes import CAUSES, find_causes
from gpu_exporter.verdict.kinds import Finding
from gpu_exporter.verdict.levels import LOW, TARGET
from gpu_exporter.verdict.signals import RunSignals

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "prometheus" / "rules"
promtool = shutil.which("promtool")


@dataclass(frozen=True)
class Case:
    """One run on one GPU, held steady for the whole test (20 minutes at 1-minute samples)."""

    name: str
    utilization: float
    memory: float
    shares: dict[str, float]
    retries: float = 0.0
    ooms: float = 0.0
    live: bool = True
    cluster: str = ""
    uuid: str = field(default="")
    run: str = ""
    rank: str = "0"
    code: dict[str, float] = field(default_factory=dict)
    """The stack sampler's shares of the step by class of code (framework, host; FO, HW)."""

    @property
    def gpu_uuid(self) -> str:
        return self.uuid or f"GPU-{self.name}"

    @property
    def run_labels(self) -> dict[str, str]:
        return {"run": self.run or self.name, "rank": self.rank}


CASES = [
    Case("input_low", 0.08, 0.5, {"data": 0.9, "compute": 0.1}),
    Case("input_target", 0.45, 0.5, {"data": 0.4, "compute": 0.6}),
    Case("metrics_low", 0.2, 0.5, {"data": 0.05, "compute": 0.4, "metrics": 0.55}),
    Case("metrics_target", 0.4, 0.5, {"data": 0.05, "compute": 0.4, "metrics": 0.55}),
    Case("mixed_low", 0.25, 0.5, {"data": 0.38, "compute": 0.28, "metrics": 0.34}),
    Case("checkpoint_low", 0.2, 0.5, {"data": 0.03, "compute": 0.25, "checkpoint": 0.72}),
    Case("checkpoint_target", 0.5, 0.5, {"compute": 0.7, "checkpoint": 0.3}),
    Case("callbacks_low", 0.2, 0.5, {"compute": 0.3, "callbacks": 0.6, "other": 0.1}),
    Case("callbacks_target", 0.5, 0.5, {"compute": 0.7, "callbacks": 0.3}),
    Case("host_low", 0.2, 0.5, {"compute": 0.9, "other": 0.1}, code={"framework": 0.02, "host": 0.4}),
    Case("host_target", 0.5, 0.5, {"compute": 0.95, "other": 0.05}, code={"host": 0.3}),
    Case("framework_low", 0.2, 0.5, {"compute": 0.5, "other": 0.5}, code={"framework": 0.5, "host": 0.01}),
    Case("framework_target", 0.5, 0.5, {"compute": 0.7, "other": 0.3}, code={"framework": 0.3}),
    Case("batch_low", 0.22, 0.1, {"data": 0.05, "compute": 0.9, "metrics": 0.05}),
    Case("batch_target", 0.35, 0.1, {"data": 0.05, "compute": 0.9, "metrics": 0.05}),
    Case("batch_memory_full", 0.22, 0.8, {"data": 0.05, "compute": 0.9, "metrics": 0.05}),
    Case("allocator_low", 0.2, 0.8, {"compute": 0.9, "other": 0.1}, retries=5),
    Case("allocator_target", 0.5, 0.8, {"compute": 0.9, "other": 0.1}, ooms=1),
    Case("allocator_few_retries", 0.2, 0.8, {"compute": 0.9, "other": 0.1}, retries=2),
    Case("healthy", 0.9, 0.6, {"data": 0.04, "compute": 0.92, "metrics": 0.04}),
    Case("healthy_but_input_heavy", 0.88, 0.6, {"data": 0.5, "compute": 0.5}),
    Case("finished", 0.08, 0.5, {"data": 0.9, "compute": 0.1}, live=False),
    Case("under_every_threshold", 0.2, 0.5, {"data": 0.25, "compute": 0.5, "metrics": 0.15, "checkpoint": 0.1}),
    Case("cluster_a", 0.08, 0.5, {"data": 0.9, "compute": 0.1}, cluster="a", uuid="GPU-shared"),
    Case("cluster_b", 0.9, 0.5, {"data": 0.9, "compute": 0.1}, cluster="b", uuid="GPU-shared"),
    # Distributed runs: ranks 0 and 1 wait for rank 2 (input-bound); with their wait as compute they were M3.
    Case("ddp_wait0", 0.15, 0.1, {"data": 0.04, "compute": 0.3, "communication": 0.66}, run="ddp", rank="0"),
    Case("ddp_wait1", 0.15, 0.1, {"data": 0.05, "compute": 0.3, "communication": 0.65}, run="ddp", rank="1"),
    Case("ddp_slow2", 0.2, 0.1, {"data": 0.62, "compute": 0.3, "communication": 0.08}, run="ddp", rank="2"),
    Case("ddp_target0", 0.5, 0.5, {"compute": 0.55, "communication": 0.45}, run="ddp_target", rank="0"),
    Case("ddp_target1", 0.9, 0.5, {"compute": 0.95, "communication": 0.05}, run="ddp_target", rank="1"),
    Case("ddp_balanced0", 0.2, 0.5, {"data": 0.5, "compute": 0.3, "communication": 0.2}, run="ddp_balanced", rank="0"),
    Case("ddp_balanced1", 0.2, 0.5, {"data": 0.55, "compute": 0.3, "communication": 0.15}, run="ddp_balanced",
         rank="1"),
    # Communication-bound: both ranks spend about 2/3 of the step in the all-reduce, no straggler (CM on each).
    Case("comm0", 0.2, 0.1, {"data": 0.04, "compute": 0.3, "communication": 0.66}, run="comm", rank="0"),
    Case("comm1", 0.2, 0.1, {"data": 0.05, "compute": 0.3, "communication": 0.65}, run="comm", rank="1"),
    Case("comm_target0", 0.5, 0.5, {"compute": 0.6, "communication": 0.4}, run="comm_target", rank="0"),
    Case("comm_target1", 0.5, 0.5, {"compute": 0.62, "communication": 0.38}, run="comm_target", rank="1"),
    Case("comm_single", 0.2, 0.5, {"compute": 0.5, "communication": 0.5}, run="comm_single"),
    # A straggler (rank 2, input-bound) in a run whose all-reduce costs every rank 35%: the waiting ranks'
    # 85% splits into that common part (CM) and the wait for rank 2 beyond it (ST).
    Case("comm_wait0", 0.1, 0.5, {"compute": 0.15, "communication": 0.85}, run="comm_wait", rank="0"),
    Case("comm_wait1", 0.1, 0.5, {"compute": 0.15, "communication": 0.85}, run="comm_wait", rank="1"),
    Case("comm_slow2", 0.1, 0.5, {"data": 0.5, "compute": 0.15, "communication": 0.35}, run="comm_wait", rank="2"),
    # Busy but waiting (a real GPU: the NCCL kernel spins while the rank waits, NVML reads it busy). Rank 0
    # waits for rank 1 (input-bound) at 95% busy: ST at its useful 35%, not healthy; rank 1 is M1.
    Case("spin_wait0", 0.95, 0.5, {"compute": 0.35, "communication": 0.65}, run="spin", rank="0"),
    Case("spin_slow1", 0.3, 0.5, {"data": 0.6, "compute": 0.35, "communication": 0.05}, run="spin", rank="1"),
    # A balanced all-reduce job at 90% busy, 60% of every rank's step in collectives: CM on both (useful 40%).
    Case("spin_comm0", 0.9, 0.5, {"compute": 0.4, "communication": 0.6}, run="spin_comm", rank="0"),
    Case("spin_comm1", 0.9, 0.5, {"compute": 0.4, "communication": 0.6}, run="spin_comm", rank="1"),
    # A healthy run whose collectives are short: its useful utilization is its utilization, 95%.
    Case("spin_healthy0", 0.95, 0.5, {"compute": 0.95, "communication": 0.05}, run="spin_healthy", rank="0"),
    Case("spin_healthy1", 0.95, 0.5, {"compute": 0.95, "communication": 0.05}, run="spin_healthy", rank="1"),
]

MINUTES = 20
EVAL = "15m"


def judged(case: Case) -> list[Finding]:
    communication = {c.rank: c.shares["communication"] for c in CASES
                     if c.run_labels["run"] == case.run_labels["run"] and c.live and "communication" in c.shares}
    run = RunSignals(case.shares, allocator_retries=case.retries, allocator_ooms=case.ooms,
                     communication=communication, code=case.code)
    return find_causes(case.utilization, case.memory, run, load_thresholds()) if case.live else []


def _labels(case: Case, **extra: str) -> dict[str, str]:
    labels = {"instance": "n1:9445", "job": "gpu-exporter", "node": "n1", "uuid": case.gpu_uuid, **extra}
    if case.cluster:
        labels["cluster"] = case.cluster
    return labels


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _ramp(per_minute: float) -> str:
    """A counter growing by ``per_minute`` each 1-minute sample."""
    return f"0+{per_minute:g}x{MINUTES}"


def input_series(index: int, case: Case) -> list[dict[str, str]]:
    run = case.run_labels
    out = [
        {"series": _series("gpu_info", _labels(case, gpu=str(index), name="NVIDIA H100")), "values": f"1x{MINUTES}"},
        {"series": _series("gpu_busy_seconds_total", _labels(case, gpu=str(index))),
         "values": _ramp(case.utilization * 60)},
        {"series": _series("gpu_memory_used_bytes", _labels(case, gpu=str(index))),
         "values": f"{case.memory * 80e9:g}x{MINUTES}"},
        {"series": _series("gpu_memory_total_bytes", _labels(case, gpu=str(index))), "values": f"80e9x{MINUTES}"},
        {"series": _series("gpu_training_last_push_timestamp_seconds", _labels(case, **run)),
         "values": f"0+60x{MINUTES}"},
        {"series": _series("gpu_training_allocator_retries_total", _labels(case, **run)),
         "values": _ramp(case.retries / 10)},
        {"series": _series("gpu_training_allocator_ooms_total", _labels(case, **run)),
         "values": _ramp(case.ooms / 10)},
    ]
    for phase, share in case.shares.items():
        out.append({"series": _series("gpu_training_phase_seconds_total", _labels(case, phase=phase, **run)),
                    "values": _ramp(share * 60)})
        out.append({"series": _series("gpu_training_current_phase", _labels(case, phase=phase, **run)),
                    "values": f"{1 if case.live and phase == 'compute' else 0}x{MINUTES}"})
    for part, share in case.code.items():
        out.append({"series": _series("gpu_training_code_seconds_total", _labels(case, part=part, **run)),
                    "values": _ramp(share * 60)})
    return out


def rounded(value: float) -> float:
    """PromQL's ``round(value, 0.0001)``, computed the way Prometheus does (floor(v * 1e4 + 0.5) / 1e4)."""
    return math.floor(value * 10000 + 0.5) / 10000


def expectations(case: Case) -> list[dict[str, Any]]:
    """promtool expectations from the judge; values compared at 4 decimals (float noise is not a verdict)."""
    run = case.run_labels
    shares, projected = [], []
    for f in judged(case):
        straggler = {"straggler_rank": f.straggler} if f.straggler else {}
        labels = _series("", _labels(case, cause=f.cause.cause, code=f.cause.code, remedy=f.cause.remedy,
                                     level=f.level, **run, **straggler))
        shares.append({"labels": labels, "value": rounded(f.value)})
        if f.projected is not None:
            projected.append({"labels": labels, "value": rounded(f.projected)})
    selector = _series("", {"uuid": case.gpu_uuid, **run})
    return [{"expr": f"round(run:gpu_training_cause:share{selector}, 0.0001)", "eval_time": EVAL,
             "exp_samples": shares},
            {"expr": f"round(run:gpu_training_cause:projected_utilization{selector}, 0.0001)", "eval_time": EVAL,
             "exp_samples": projected}]


def promtool_test() -> dict[str, Any]:
    series = [s for i, case in enumerate(CASES) for s in input_series(i, case)]
    return {"rule_files": [str(p) for p in sorted(RULES.glob("*.rules.yml"))],
            "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "promql_expr_test": [e for case in CASES for e in expectations(case)]}]}


def test_cases_cover_every_cause_at_both_levels_and_no_cause() -> None:
    seen = {(f.cause.cause, f.level) for case in CASES for f in judged(case)}
    assert seen == {(c.cause, lvl) for c in CAUSES for lvl in (LOW, TARGET)}
    assert [c.name for c in CASES if not judged(c)] == [
        "batch_memory_full", "allocator_few_retries", "healthy", "healthy_but_input_heavy", "finished",
        "under_every_threshold", "cluster_b", "ddp_target1", "spin_healthy0", "spin_healthy1"]


def test_waiting_ranks_name_the_straggler_and_are_never_launch_bound() -> None:
    by_name = {c.name: c for c in CASES}
    for waiting in ("ddp_wait0", "ddp_wait1"):
        found = judged(by_name[waiting])
        assert [(f.cause.code, f.straggler) for f in found] == [("ST", "2")], found
        assert found[0].value == pytest.approx(by_name[waiting].shares["communication"] - 0.08)
    assert [f.cause.code for f in judged(by_name["ddp_slow2"])] == ["M1"]
    # The same waiting rank with its wait counted as compute (no communication phase) was called M3.
    as_compute = Case("x", 0.15, 0.1, {"data": 0.04, "compute": 0.96})
    assert [f.cause.code for f in judged(as_compute)] == ["M3"]
    assert [f.cause.code for c in ("ddp_balanced0", "ddp_balanced1") for f in judged(by_name[c])] == ["M1", "M1"]
    (target,) = judged(by_name["ddp_target0"])
    assert (target.cause.code, target.level, target.straggler) == ("ST", TARGET, "1")


def test_communication_bound_is_what_every_rank_pays_and_never_the_straggler_wait() -> None:
    by_name = {c.name: c for c in CASES}
    # Balanced: CM on every rank, valued at the run's lowest share, no ST.
    for name in ("comm0", "comm1"):
        (found,) = judged(by_name[name])
        assert (found.cause.code, found.level, found.value, found.straggler) == ("CM", LOW, 0.65, "")
        assert found.projected == pytest.approx(0.2 / 0.35)
    assert [(f.cause.code, f.level) for c in ("comm_target0", "comm_target1") for f in judged(by_name[c])] == [
        ("CM", TARGET), ("CM", TARGET)]
    assert [(f.cause.code, f.value) for f in judged(by_name["comm_single"])] == [("CM", 0.5)]
    # A straggler run where the straggler waits little: no CM anywhere (its lowest share is 8%).
    assert not [f for c in CASES if c.run == "ddp" for f in judged(c) if f.cause.code == "CM"]
    # Straggler and common communication: the waiting ranks' share is split once, CM + ST = their share.
    for name in ("comm_wait0", "comm_wait1"):
        codes = {f.cause.code: f for f in judged(by_name[name])}
        assert sorted(codes) == ["CM", "ST"] and codes["ST"].straggler == "2"
        assert codes["CM"].value == 0.35
        assert codes["CM"].value + codes["ST"].value == pytest.approx(by_name[name].shares["communication"])
    assert [f.cause.code for f in judged(by_name["comm_slow2"])] == ["M1", "CM"]


def test_a_busy_rank_that_waits_in_collectives_is_judged_at_its_useful_utilization() -> None:
    by_name = {c.name: c for c in CASES}
    # 95% busy, but 65% of the step in a spinning all-reduce: useful 35%, below target, waiting for rank 1.
    (st,) = judged(by_name["spin_wait0"])
    assert (st.cause.code, st.level, st.straggler) == ("ST", TARGET, "1")
    assert st.value == pytest.approx(0.6) and st.projected == pytest.approx(0.35 / 0.4)
    assert st.projection(0.95, by_name["spin_wait0"].shares).startswith(
        "35% useful (95% busy, 65% of the step in collectives) now, at most ~87% if rank 1 kept up")
    assert [(f.cause.code, f.level) for f in judged(by_name["spin_slow1"])] == [("M1", TARGET)]
    # Balanced, 90% busy, 60% in collectives on every rank: CM on both, from useful 40% to at most 100%.
    for name in ("spin_comm0", "spin_comm1"):
        (cm,) = judged(by_name[name])
        assert (cm.cause.code, cm.level, cm.value, cm.projected) == ("CM", TARGET, 0.6, 1.0)
    # Without the cap the same ranks were healthy (u alone is above the target): nothing was named.
    t = load_thresholds()
    assert all(c.utilization >= t.utilization_target for c in CASES if c.name.startswith(("spin_wait", "spin_comm")))
    assert not judged(by_name["spin_healthy0"]) and not judged(by_name["spin_healthy1"])


def test_judge_names_the_biggest_cause_first_with_its_projection() -> None:
    (mixed,) = [c for c in CASES if c.name == "mixed_low"]
    found = judged(mixed)
    assert [f.cause.code for f in found] == ["M1", "M2"]
    assert found[0].summary(mixed.utilization) == (
        "input-bound (M1): 25% now, at most ~40% if loading overlapped compute")
    (batch,) = [c for c in CASES if c.name == "batch_low"]
    (m3,) = judged(batch)
    assert (round(m3.value, 6), m3.projected) == (0.68, 0.9)


@pytest.mark.skipif(promtool is None, reason="promtool not installed (apt-get install prometheus)")
def test_promql_and_judge_agree_on_every_case(tmp_path: Path) -> None:
    path = tmp_path / "conformance.test.yml"
    path.write_text(yaml.safe_dump(promtool_test(), sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "SUCCESS" in proc.stdout


# --- the rest of the ladder: every verdict that is not a cause ------------------------------------
# The same check for the rows of gpu_exporter.verdict.ladder.LADDER that are not causes. Each case is
# one GPU (memory, a process or not, a run or not). PromQL side: the shipped expressions each row
# names in its ``promql`` field (the alerts' expressions read verbatim from the rules files, the
# gpu:gpu_has_work:bool and cause recording rules), combined with ``or on (cluster, uuid)`` in the
# ladder's order, so the first that holds names the GPU's verdict, as the judge's first row does.
# Python side: the judge on the same GPU. Rows not_instrumented and underutilized name one alert per
# level (GpuUtilizationLow below the low line, GpuUtilizationBelowTarget between it and the target),
# so both sides must agree at both levels; the evidence rows are checked against their PromQL by
# tests/test_evidence.py.

from gpu_exporter.verdict.ladder import BY_ROW, judge  # noqa: E402
from gpu_exporter.verdict.levels import LOW as LOW_LEVEL  # noqa: E402
from gpu_exporter.verdict.levels import TARGET as TARGET_LEVEL  # noqa: E402
from gpu_exporter.verdict.levels import level  # noqa: E402
from gpu_exporter.verdict.views import GpuView, Process, RunView  # noqa: E402

CAUSE_IDS = {c.cause for c in CAUSES}


@dataclass(frozen=True)
class GpuCase:
    """One GPU held steady: its utilization, memory, an optional process and an optional run."""

    name: str
    utilization: float
    memory: float
    process: bool = False
    shares: dict[str, float] | None = None
    live: bool = True
    cluster: str = ""
    uuid: str = ""

    @property
    def gpu_uuid(self) -> str:
        return self.uuid or f"GPU-{self.name}"

    def labels(self, **extra: str) -> dict[str, str]:
        labels = {"instance": "n1:9445", "job": "gpu-exporter", "node": "n1", "uuid": self.gpu_uuid, **extra}
        if self.cluster:
            labels["cluster"] = self.cluster
        return labels


GPU_CASES = [
    GpuCase("unused", 0.1, 0.01),
    GpuCase("unused_idle", 0.0, 0.0),
    GpuCase("idle_process", 0.01, 0.3, process=True),
    GpuCase("idle_memory_only", 0.0, 0.4),
    GpuCase("idle_run", 0.01, 0.6, shares={"data": 0.1, "compute": 0.8, "other": 0.1}),
    GpuCase("not_instrumented", 0.1, 0.5, process=True),
    GpuCase("underutilized", 0.2, 0.6, shares={"data": 0.25, "compute": 0.6, "metrics": 0.15}),
    GpuCase("input_bound", 0.08, 0.5, shares={"data": 0.9, "compute": 0.1}),
    GpuCase("healthy", 0.9, 0.5, process=True),
    GpuCase("target_not_instrumented", 0.5, 0.5, process=True),
    GpuCase("target_underutilized", 0.5, 0.6, shares={"data": 0.2, "compute": 0.8}),
    GpuCase("cluster_a", 0.01, 0.3, process=True, cluster="a", uuid="GPU-shared-ladder"),
    GpuCase("cluster_b", 0.9, 0.3, process=True, cluster="b", uuid="GPU-shared-ladder"),
    # 95% busy, a quarter of its run's step in a spinning all-reduce (no cause passes): useful 75%, below target.
    GpuCase("target_underutilized_collectives", 0.95, 0.6, shares={"compute": 0.75, "communication": 0.25}),
    GpuCase("healthy_run_collectives", 0.95, 0.6, shares={"compute": 0.95, "communication": 0.05}),
]


def ladder_verdict(case: GpuCase) -> str:
    """The judge's verdict on ``case``, in the words the PromQL side can say (see the section comment)."""
    t = load_thresholds()
    runs: tuple[RunView, ...] = ()
    if case.shares is not None:
        found = find_causes(case.utilization, case.memory, RunSignals(case.shares), t) if case.live else []
        runs = (RunView("r-" + case.name, "0", case.shares, 60.0, False, None, 0.0, 0.0, live=case.live,
                        findings=tuple(found)),)
    procs = (Process("7", "python", case.memory * 80e9),) if case.process else ()
    view = GpuView(case.gpu_uuid, "0", "NVIDIA H100", "n1", case.utilization, case.memory, len(procs), (), runs,
                   procs, cluster=case.cluster)
    verdict = judge(view, t)
    if verdict.name in CAUSE_IDS:
        return "cause"
    if verdict.name == "healthy":
        return "none"
    return verdict.name


def _alert_expr(name: str) -> str:
    for path in sorted(RULES.glob("*.rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == name:
                    return str(rule["expr"]).strip()
    raise AssertionError(f"no alert {name} in {RULES}")


def ladder_promql() -> str:
    """The shipped expressions of the non-cause rows, first that holds wins (the ladder's order)."""
    (idle_alert,) = BY_ROW["idle_but_allocated"].alerts
    idle = _alert_expr(idle_alert)
    names = BY_ROW["not_instrumented"].alerts
    assert BY_ROW["underutilized"].alerts == names == ("GpuUtilizationLow", "GpuUtilizationBelowTarget"), names
    # One alert per level: the low line's and the target's, either names the row.
    low = "\nor on (cluster, uuid)\n".join(f"group by (cluster, uuid) (\n{_alert_expr(n)}\n)" for n in names)
    has_work = BY_ROW["unused"].promql
    steps = [("cause", "run:gpu_training_cause:share"),
             ("idle_but_allocated", idle),
             ("not_instrumented", f'({low})\nand on (cluster, uuid) gpu:gpu_workload:info{{run=""}}'),
             ("underutilized", low),
             ("unused", has_work),
             ("none", "gpu_info")]
    return "\nor on (cluster, uuid)\n".join(
        f'label_replace(group by (cluster, uuid) (\n{expr}\n), "verdict", "{verdict}", "", "")'
        for verdict, expr in steps)


def gpu_series(index: int, case: GpuCase) -> list[dict[str, str]]:
    gpu = {"gpu": str(index)}
    out = [
        {"series": _series("gpu_info", case.labels(name="NVIDIA H100", **gpu)), "values": f"1x{MINUTES}"},
        {"series": _series("gpu_busy_seconds_total", case.labels(**gpu)), "values": _ramp(case.utilization * 60)},
        {"series": _series("gpu_memory_used_bytes", case.labels(**gpu)), "values": f"{case.memory * 80e9:g}x{MINUTES}"},
        {"series": _series("gpu_memory_total_bytes", case.labels(**gpu)), "values": f"80e9x{MINUTES}"},
    ]
    if case.process:
        out.append({"series": _series("gpu_process_memory_used_bytes", case.labels(pid="7", process_name="python",
                                                                                   **gpu)),
                    "values": f"{case.memory * 80e9:g}x{MINUTES}"})
    if case.shares is not None:
        run = {"run": "r-" + case.name, "rank": "0"}
        out.append({"series": _series("gpu_training_last_push_timestamp_seconds", case.labels(**run)),
                    "values": f"0+60x{MINUTES}"})
        for phase, share in case.shares.items():
            out.append({"series": _series("gpu_training_phase_seconds_total", case.labels(phase=phase, **run)),
                        "values": _ramp(share * 60)})
            out.append({"series": _series("gpu_training_current_phase", case.labels(phase=phase, **run)),
                        "values": f"{1 if case.live and phase == 'compute' else 0}x{MINUTES}"})
    return out


def test_gpu_cases_reach_every_non_cause_row() -> None:
    seen = {ladder_verdict(c) for c in GPU_CASES}
    assert seen == {"cause", "idle_but_allocated", "not_instrumented", "underutilized", "unused", "none"}
    # ... at both levels below target: the PromQL side must then say the same at the target level.
    by_name = {c.name: c for c in GPU_CASES}
    t = load_thresholds()
    for name, verdict in (("not_instrumented", "not_instrumented"), ("target_not_instrumented", "not_instrumented"),
                          ("underutilized", "underutilized"), ("target_underutilized", "underutilized")):
        assert ladder_verdict(by_name[name]) == verdict, name
        assert level(by_name[name].utilization, t) == (TARGET_LEVEL if name.startswith("target_") else LOW_LEVEL)
    # The GPU's level is its useful utilization's: busy at 95%, yet below target with its run in collectives.
    assert level(by_name["target_underutilized_collectives"].utilization, t) is None
    assert ladder_verdict(by_name["target_underutilized_collectives"]) == "underutilized"
    assert ladder_verdict(by_name["healthy_run_collectives"]) == "none"


@pytest.mark.skipif(promtool is None, reason="promtool not installed (apt-get install prometheus)")
def test_promql_and_judge_agree_on_every_row_of_the_ladder(tmp_path: Path) -> None:
    _promtool_ladder(tmp_path, GPU_CASES)


@pytest.mark.skipif(promtool is None, reason="promtool not installed (apt-get install prometheus)")
def test_a_gpu_whose_run_finished_is_not_instrumented_on_both_sides(tmp_path: Path) -> None:
    _promtool_ladder(tmp_path, [GpuCase("finished", 0.1, 0.5, shares={"data": 0.9, "compute": 0.1}, live=False)])


def _promtool_ladder(tmp_path: Path, cases: list[GpuCase]) -> None:
    series = [s for i, case in enumerate(cases) for s in gpu_series(i, case)]
    expected = [{"labels": _series("", {**({"cluster": c.cluster} if c.cluster else {}), "uuid": c.gpu_uuid,
                                        "verdict": ladder_verdict(c)}), "value": 1}
                for c in cases]
    test = {"rule_files": [str(p) for p in sorted(RULES.glob("*.rules.yml"))], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
                {"expr": f"count by (cluster, uuid, verdict) (\n{ladder_promql()}\n)", "eval_time": EVAL,
                 "exp_samples": expected}]}]}
    path = tmp_path / "ladder.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "SUCCESS" in proc.stdout


# --- busy but not effective: the GPU-level causes of SM activity -----------------------------------
# The rows of gpu_exporter.verdict.efficiency.EFFICIENCY (memory-bound, batch too small for the SMs, tensor cores
# idle, busy but ineffective). Each case is one GPU held steady: its busy utilization, memory, and the SM, tensor
# and DRAM activity its GPM gauges (the exporter's, whole GPU) and/or its dcgm-exporter series (by UUID) report.
# PromQL side: the four shipped alerts' expressions, read verbatim from the rules files, in the table's order
# (the first that holds names the verdict; they exclude each other, which the count below also checks). Python
# side: the same readings through the node path's sources (verdict.readings.gpm, then .dcgm: GPM wins), the join
# and the judge.

from gpu_exporter.verdict import readings as node_readings  # noqa: E402
from gpu_exporter.verdict.efficiency import EFFICIENCY, EFFICIENCY_BY_ID  # noqa: E402
from gpu_exporter.verdict.join import build_views  # noqa: E402
from gpu_exporter.verdict.samples import Snapshot  # noqa: E402
from gpu_exporter.verdict.views import Readings, gpu_key  # noqa: E402

Triple = tuple[float, float | None, float | None]
"""SM, tensor pipe and DRAM activity (None: the source does not report that field)."""
GPM_NAMES = ("gpu_sm_active_ratio", "gpu_tensor_active_ratio", "gpu_dram_bandwidth_utilization_ratio")
DCGM_NAMES = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")


@dataclass(frozen=True)
class SmCase:
    """One GPU: busy utilization, memory used, and what GPM and/or dcgm-exporter say its SMs do."""

    name: str
    utilization: float
    memory: float
    gpm: Triple | None = None
    dcgm: Triple | None = None
    cluster: str = ""
    uuid: str = ""

    @property
    def gpu_uuid(self) -> str:
        return self.uuid or f"GPU-sm-{self.name}"

    def labels(self, **extra: str) -> dict[str, str]:
        labels = {"instance": "n1:9445", "job": "gpu-exporter", "node": "n1", "uuid": self.gpu_uuid, **extra}
        if self.cluster:
            labels["cluster"] = self.cluster
        return labels

    def dcgm_labels(self, index: int) -> dict[str, str]:
        labels = {"instance": "n1:9400", "job": "dcgm-exporter", "gpu": str(index), "UUID": self.gpu_uuid,
                  "Hostname": "n1", "modelName": "NVIDIA A100-SXM4-80GB", "device": f"nvidia{index}"}
        if self.cluster:
            labels["cluster"] = self.cluster
        return labels


SM_CASES = [
    SmCase("memory_bound", 0.96, 0.3, gpm=(0.3, 0.2, 0.8)),
    SmCase("memory_bound_at_the_line", 0.96, 0.3, gpm=(0.3, 0.2, 0.6)),
    SmCase("memory_bound_dcgm", 0.96, 0.7, dcgm=(0.2, 0.1, 0.9)),
    SmCase("batch_small", 0.96, 0.2, gpm=(0.25, 0.3, 0.1)),
    SmCase("batch_small_gpm_wins", 0.96, 0.2, gpm=(0.25, 0.3, 0.1), dcgm=(0.9, 0.6, 0.3)),
    SmCase("healthy_gpm_wins", 0.96, 0.2, gpm=(0.9, 0.6, 0.3), dcgm=(0.2, 0.0, 0.1)),
    SmCase("tensor_idle_dcgm", 0.95, 0.6, dcgm=(0.7, 0.0, 0.3)),
    SmCase("tensor_idle_gpm", 0.95, 0.6, gpm=(0.7, 0.01, 0.3)),
    SmCase("tensor_unreported", 0.95, 0.6, dcgm=(0.7, None, 0.3)),
    SmCase("sm_at_the_line", 0.95, 0.6, gpm=(0.5, 0.4, 0.3)),
    SmCase("ineffective", 0.95, 0.7, gpm=(0.3, 0.2, 0.2)),
    SmCase("ineffective_dcgm", 0.95, 0.7, dcgm=(0.3, 0.2, None)),
    SmCase("healthy", 0.95, 0.6, gpm=(0.85, 0.5, 0.3)),
    SmCase("below_target", 0.6, 0.2, gpm=(0.2, 0.1, 0.1)),
    SmCase("no_source", 0.96, 0.2),
    SmCase("no_work", 0.96, 0.01, gpm=(0.2, 0.1, 0.1)),
    SmCase("cluster_a", 0.96, 0.2, gpm=(0.25, 0.3, 0.1), cluster="a", uuid="GPU-sm-shared"),
    SmCase("cluster_b", 0.96, 0.2, gpm=(0.9, 0.6, 0.3), cluster="b", uuid="GPU-sm-shared"),
]


def sm_verdict(case: SmCase) -> str:
    """The judge's verdict on ``case``: an efficiency verdict, or "none"."""
    t = load_thresholds()
    labels = case.labels(gpu="0", name="NVIDIA H100")
    readings = Readings(info=[labels], cluster_label="cluster")
    key = gpu_key(case.cluster, case.gpu_uuid)
    readings.utilization[key] = case.utilization
    readings.memory_ratio[key] = case.memory
    gpm = {name: [(case.labels(gpu="0"), v)] for name, v in zip(GPM_NAMES, case.gpm or (), strict=False)
           if v is not None}
    dcgm = {name: [(case.dcgm_labels(0), v)] for name, v in zip(DCGM_NAMES, case.dcgm or (), strict=False)
            if v is not None}
    node_readings.gpm(readings, Snapshot(gpm, at=0.0, wall=0.0))
    if not case.cluster:  # diagnose --dcgm-url reads one node (no cluster label)
        node_readings.dcgm(readings, Snapshot(dcgm, at=0.0, wall=0.0))
    (view,) = build_views(readings, t, 300.0)
    verdict = judge(view, t)
    return verdict.name if verdict.name in EFFICIENCY_BY_ID else "none"


def sm_series(index: int, case: SmCase) -> list[dict[str, str]]:
    gpu = {"gpu": str(index)}
    out = [
        {"series": _series("gpu_info", case.labels(name="NVIDIA H100", **gpu)), "values": f"1x{MINUTES}"},
        {"series": _series("gpu_busy_seconds_total", case.labels(**gpu)), "values": _ramp(case.utilization * 60)},
        {"series": _series("gpu_memory_used_bytes", case.labels(**gpu)), "values": f"{case.memory * 80e9:g}x{MINUTES}"},
        {"series": _series("gpu_memory_total_bytes", case.labels(**gpu)), "values": f"80e9x{MINUTES}"},
    ]
    for names, triple, labels in ((GPM_NAMES, case.gpm, case.labels(**gpu)), (DCGM_NAMES, case.dcgm,
                                                                              case.dcgm_labels(index))):
        for name, value in zip(names, triple or (), strict=False):
            if value is not None:
                out.append({"series": _series(name, labels), "values": f"{value:g}x{MINUTES}"})
    return out


def efficiency_promql() -> str:
    """The shipped efficiency alerts' expressions, each labelled with its verdict (the table's order), or none."""
    steps = [(c.cause, _alert_expr(c.alert)) for c in EFFICIENCY] + [("none", "gpu_info")]
    return "\nor on (cluster, uuid)\n".join(
        f'label_replace(group by (cluster, uuid) (\n{expr}\n), "verdict", "{verdict}", "", "")'
        for verdict, expr in steps)


def test_sm_cases_reach_every_efficiency_row_and_none() -> None:
    seen = {sm_verdict(c) for c in SM_CASES}
    assert seen == {c.cause for c in EFFICIENCY} | {"none"}
    by_name = {c.name: c for c in SM_CASES}
    assert sm_verdict(by_name["batch_small_gpm_wins"]) == "sm_batch_too_small"  # DCGM's 90% is ignored
    assert sm_verdict(by_name["healthy_gpm_wins"]) == "none"  # DCGM's 20% is ignored
    assert [sm_verdict(by_name[n]) for n in ("below_target", "no_source", "no_work", "tensor_unreported")] == [
        "none"] * 4


@pytest.mark.skipif(promtool is None, reason="promtool not installed (apt-get install prometheus)")
def test_promql_and_judge_agree_on_every_efficiency_case(tmp_path: Path) -> None:
    series = [s for i, case in enumerate(SM_CASES) for s in sm_series(i, case)]
    expected = [{"labels": _series("", {**({"cluster": c.cluster} if c.cluster else {}), "uuid": c.gpu_uuid,
                                        "verdict": sm_verdict(c)}), "value": 1} for c in SM_CASES]
    # count by verdict: a GPU two alerts held would show twice (the rows must exclude each other)
    fired = "\nor on (cluster, uuid)\n".join(
        f'label_replace(group by (cluster, uuid) (\n{_alert_expr(c.alert)}\n), "verdict", "{c.cause}", "", "")'
        for c in EFFICIENCY)
    test = {"rule_files": [str(p) for p in sorted(RULES.glob("*.rules.yml"))], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
                {"expr": f"count by (cluster, uuid, verdict) (\n{efficiency_promql()}\n)", "eval_time": EVAL,
                 "exp_samples": expected},
                {"expr": f"count by (cluster, uuid) (\n{fired.replace('or on (cluster, uuid)', 'or')}\n) > 1",
                 "eval_time": EVAL, "exp_samples": []}]}]}
    path = tmp_path / "efficiency.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "SUCCESS" in proc.stdout
