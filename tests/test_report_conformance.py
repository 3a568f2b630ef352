"""``report`` and ``diagnose`` say the same thing about the same moment, for every row of the ladder.

One Prometheus holds 20 minutes of data, backfilled with promtool (``tsdb create-blocks-from openmetrics``:
no scrape to wait for): GPUs each held steady in the state of one ladder row (unknown, healthy, unused,
each cause M1 ... CM, idle but allocated, not instrumented, underutilized), a distributed run with a
straggler, a communication-bound run, and two clusters whose GPUs share one UUID (one input-bound at 8%, the
other healthy at 90%: keyed by UUID alone, the report read the busy time of both). For each run,
``report --run R`` over the range and ``diagnose --prometheus-url --run R --window W --at T`` (W: the report's
window) must give each GPU the same verdict and utilization at the point T (and at an earlier point, when
every run was live). The row "not instrumented" with /proc evidence is said by both from the processes' raw
gpu_process_* counters over the window (a main thread runnable 97% of the time, no worker: main_busy, M1); as
its verdict is "not instrumented" like the plain row's, the report's own moments (report_sources.readings_over ->
Timeline, what ``report`` renders) must also give each GPU diagnose's title, code and evidence hint. The twin runs
are launches (run ids): ``report --list`` lists each on its own GPU key with its own busy and wall time.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from gpu_exporter import cli
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.report_sources import readings_over
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.ladder import BY_ROW, LADDER
from gpu_exporter.verdict.timeline import Timeline
from gpu_exporter.verdict.views import GpuKey

from testbed import run_prometheus

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None or shutil.which("prometheus") is None,
                                reason="promtool/prometheus not installed (apt-get install prometheus)")

T = load_thresholds()
STEP = 60
WINDOW = 4 * STEP
"""The report's window: WINDOW_STEPS steps (gpu_exporter.commands.report_sources)."""
SPAN = 20 * 60
STOP = 8 * 60
"""Runs that are not live at the moment stop reporting a current phase (and their timers stop) here."""
MOMENT = 16 * 60
"""The moment both commands judge, from the range's start: a point of the report's grid."""
EARLIER = 5 * 60
"""A moment at which the runs that stop at STOP were still live."""


@dataclass(frozen=True)
class Gpu:
    """One GPU held steady and a run on it; ``row``: the ladder row expected at the moment."""

    row: str
    utilization: float | None
    memory: float
    shares: dict[str, float]
    run: str = ""
    rank: str = "0"
    live: bool = True
    process: bool = False
    retries: float = 0.0
    """Allocator retries per minute."""
    cluster: str = ""
    uuid: str = field(default="")
    run_id: str = ""
    """Its launch's run id (gpu_training_run_info, the start timestamp): ``report --list`` lists it."""
    busy_main: bool = False
    """Its process (``process``) has /proc counters: a main thread runnable 97% of the time, one core, no worker."""
    gpm: tuple[float, float, float] | None = None
    """Its GPM gauges (whole GPU): SM, tensor pipe and DRAM activity (the efficiency rows, verdict/efficiency.py)."""
    code: dict[str, float] = field(default_factory=dict)
    """The stack sampler's shares of the step by class of code (framework, host: the FO and HW rows)."""

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.gpu_uuid}" if self.cluster else self.gpu_uuid

    @property
    def gpu_uuid(self) -> str:
        return self.uuid or f"GPU-{self.row}-{self.run_name}-{self.rank}"

    @property
    def run_name(self) -> str:
        return self.run or f"r-{self.row}"


IDLE = {"data": 0.1, "compute": 0.9}
GPUS = [
    Gpu("unknown", None, 0.5, {"data": 0.9, "compute": 0.1}),
    Gpu("healthy", 0.9, 0.6, {"data": 0.04, "compute": 0.92, "metrics": 0.04}),
    Gpu("unused", 0.0, 0.0, IDLE, live=False),
    Gpu("input_bound", 0.08, 0.5, {"data": 0.9, "compute": 0.1}),
    Gpu("metrics_bound", 0.2, 0.5, {"data": 0.05, "compute": 0.4, "metrics": 0.55}),
    Gpu("checkpoint", 0.2, 0.5, {"data": 0.03, "compute": 0.25, "checkpoint": 0.72}),
    Gpu("callback_bound", 0.2, 0.5, {"data": 0.03, "compute": 0.35, "callbacks": 0.62}),
    Gpu("framework_overhead", 0.2, 0.5, {"data": 0.03, "compute": 0.5, "other": 0.47}, code={"framework": 0.5}),
    Gpu("host_work", 0.2, 0.5, {"data": 0.03, "compute": 0.9, "other": 0.07}, code={"host": 0.45}),
    Gpu("batch_too_small", 0.22, 0.1, {"data": 0.05, "compute": 0.9, "metrics": 0.05}),
    Gpu("allocator", 0.2, 0.8, {"compute": 0.9, "other": 0.1}, retries=10),
    # Ranks 0 and 1 wait for rank 2 (input-bound) in all-reduce.
    Gpu("straggler", 0.15, 0.1, {"data": 0.04, "compute": 0.3, "communication": 0.66}, run="ddp", rank="0"),
    Gpu("straggler", 0.15, 0.1, {"data": 0.05, "compute": 0.3, "communication": 0.65}, run="ddp", rank="1"),
    Gpu("input_bound", 0.2, 0.1, {"data": 0.62, "compute": 0.3, "communication": 0.08}, run="ddp", rank="2"),
    Gpu("communication_bound", 0.2, 0.1, {"data": 0.04, "compute": 0.3, "communication": 0.66}, run="comm"),
    Gpu("communication_bound", 0.2, 0.1, {"data": 0.05, "compute": 0.3, "communication": 0.65}, run="comm",
        rank="1"),
    Gpu("idle_but_allocated", 0.01, 0.3, IDLE, live=False, process=True),
    Gpu("not_instrumented", 0.1, 0.5, IDLE, live=False, process=True),
    Gpu("not_instrumented_evidence", 0.1, 0.5, IDLE, live=False, process=True, busy_main=True),
    Gpu("underutilized", 0.2, 0.6, {"data": 0.25, "compute": 0.6, "metrics": 0.15}),
    # Busy (at or above the target) but not effective, by GPM's SM, tensor and DRAM activity.
    Gpu("memory_bound", 0.96, 0.3, {"data": 0.02, "compute": 0.98}, gpm=(0.3, 0.2, 0.8)),
    Gpu("sm_batch_too_small", 0.96, 0.2, {"data": 0.02, "compute": 0.98}, gpm=(0.25, 0.3, 0.1)),
    Gpu("tensor_cores_idle", 0.95, 0.6, {"data": 0.02, "compute": 0.98}, gpm=(0.7, 0.0, 0.3)),
    Gpu("ineffective", 0.95, 0.7, {"data": 0.02, "compute": 0.98}, gpm=(0.3, 0.2, 0.2)),
    # Two clusters, one UUID: an input-bound run at 8% in cluster a, a healthy one at 90% in cluster b.
    Gpu("input_bound", 0.08, 0.5, {"data": 0.9, "compute": 0.1}, run="twin-a", cluster="a", uuid="GPU-twin",
        run_id="id-twin-a"),
    Gpu("healthy", 0.9, 0.5, {"data": 0.02, "compute": 0.98}, run="twin-b", cluster="b", uuid="GPU-twin",
        run_id="id-twin-b"),
]
EVIDENCE = {"not_instrumented_evidence": ("main_busy", "M1", "not instrumented: likely input-bound (M1)")}
"""The evidence hint, code and title of the evidence row (its verdict is "not instrumented", as the plain row's)."""


def openmetrics(start: int) -> str:
    """Every series of ``GPUS`` every 15 s from 5 minutes before ``start`` to ``start + SPAN``."""
    families: dict[str, list[str]] = {}
    stamps = range(start - 300, start + SPAN + 1, 15)

    def add(name: str, gpu: Gpu, index: int, extra: dict[str, str], value: object) -> None:
        labels = {"instance": "n1:9445", "job": "gpu-exporter", "node": "n1", "uuid": gpu.gpu_uuid, **extra}
        if gpu.cluster:
            labels["cluster"] = gpu.cluster
        text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        rows = families.setdefault(name, [])
        for ts in stamps:
            v = value(ts) if callable(value) else value
            rows.append(f"{name}{{{text}}} {v:.17g} {ts}")

    for index, gpu in enumerate(GPUS):
        gpu_labels = {"gpu": str(index)}
        add("gpu_info", gpu, index, {**gpu_labels, "name": "NVIDIA H100"}, 1)
        if gpu.utilization is not None:
            add("gpu_busy_seconds_total", gpu, index, gpu_labels, lambda ts, u=gpu.utilization: u * (ts - start + 300))
        add("gpu_memory_used_bytes", gpu, index, gpu_labels, gpu.memory * 80e9)
        add("gpu_memory_total_bytes", gpu, index, gpu_labels, 80e9)
        if gpu.gpm is not None:
            for name, share in zip(("gpu_sm_active_ratio", "gpu_tensor_active_ratio",
                                    "gpu_dram_bandwidth_utilization_ratio"), gpu.gpm, strict=True):
                add(name, gpu, index, gpu_labels, share)
        if gpu.process:
            add("gpu_process_memory_used_bytes", gpu, index, {**gpu_labels, "pid": "7", "process_name": "python"},
                gpu.memory * 80e9)
        if gpu.busy_main:  # the gpu_process_* counters of collectors/evidence.py, growing steadily
            pid = {"pid": "7"}
            for name, rate in (("gpu_process_cpu_seconds_total", 0.98), ("gpu_process_children_cpu_seconds_total", 0),
                               ("gpu_process_read_bytes_total", 0)):
                add(name, gpu, index, pid, lambda ts, r=rate: r * (ts - start + 300))
            add("gpu_process_child_processes", gpu, index, pid, 0)
            for state, share in (("running", 0.97), ("sleeping", 0.03)):
                add("gpu_process_main_thread_state_seconds_total", gpu, index, {**pid, "state": state},
                    lambda ts, s=share: s * (ts - start + 300))
        run = {"run": gpu.run_name, "rank": gpu.rank}
        end = start + (SPAN + STEP if gpu.live else STOP)

        def active(ts: int, end: int = end) -> float:
            return min(ts, end) - (start - 300)
        add("gpu_training_last_push_timestamp_seconds", gpu, index, run, lambda ts, a=active: start - 300 + a(ts))
        add("gpu_training_allocator_retries_total", gpu, index, run,
            lambda ts, a=active, r=gpu.retries: r * a(ts) / 60)
        add("gpu_training_allocator_ooms_total", gpu, index, run, 0)
        if gpu.run_id:  # a launch: its info series while it runs, and its start
            add("gpu_training_run_info", gpu, index, {**run, "run_id": gpu.run_id},
                lambda ts, e=end: 1 if ts < e else math.nan)
            add("gpu_training_run_start_timestamp_seconds", gpu, index, {**run, "run_id": gpu.run_id}, start - 300)
        for phase, share in gpu.shares.items():
            add("gpu_training_phase_seconds_total", gpu, index, {**run, "phase": phase},
                lambda ts, a=active, s=share: s * a(ts))
            add("gpu_training_current_phase", gpu, index, {**run, "phase": phase},
                lambda ts, e=end, p=phase: 1 if p == "compute" and ts < e else 0)
        for part, share in gpu.code.items():
            add("gpu_training_code_seconds_total", gpu, index, {**run, "part": part},
                lambda ts, a=active, s=share: s * a(ts))
    out = []
    for name, rows in families.items():
        out += [f"# TYPE {name} gauge", *rows]
    return "\n".join([*out, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(URL of a Prometheus holding the backfilled series, the range's start)."""
    tmp = tmp_path_factory.mktemp("backfill")
    start = int(time.time()) - SPAN - 60
    (tmp / "data.om").write_text(openmetrics(start))
    made = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "data.om"),
                           str(tmp / "data")], capture_output=True, text=True, check=False, timeout=120)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    with run_prometheus("global: {scrape_interval: 15s}\n", tsdb_path=tmp / "data") as prom:
        yield prom, start


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out else {"stderr": out.err}


def test_the_cases_reach_every_row_of_the_ladder() -> None:
    assert {g.row for g in GPUS} == {row.name for row in LADDER}
    assert all(BY_ROW[row].verdict == "not_instrumented" for row in EVIDENCE)


def test_report_and_diagnose_agree_on_every_row_at_one_moment(backfilled: tuple[str, int],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    prom, start = backfilled
    seen = set()
    for run in dict.fromkeys(g.run_name for g in GPUS):
        gpus = {g.key: g for g in GPUS if g.run_name == run}
        code, report = _cli(capsys, "report", "--prometheus-url", prom, "--run", run, "--from", str(start),
                            "--to", str(start + SPAN), "--step", f"{STEP}s", "--output", "json")
        assert code == 0, report
        assert report["gpus"] == sorted(gpus), (run, report["gpus"])
        series = report["series"]
        # The report's moments themselves (what it renders: report_sources.readings_over -> Timeline)
        grid = [start + k * STEP for k in range(SPAN // STEP + 1)]
        timeline = Timeline.judge(readings_over(Prometheus(prom), grid, STEP, WINDOW, T.cluster_label,
                                                sorted(GpuKey(g.cluster, g.gpu_uuid) for g in gpus.values())),
                                  T, WINDOW, run)
        moments = {key: {m.time: m for m in ms} for key, ms in timeline.moments.items()}
        for when in (EARLIER, MOMENT):  # at EARLIER every run is live; at MOMENT each GPU is in its row's state
            code, diagnosed = _cli(capsys, "diagnose", "--prometheus-url", prom, "--run", run, "--window",
                                   f"{WINDOW}s", "--at", str(start + when), "--output", "json")
            assert code in (0, 1), diagnosed
            at = series["times"].index(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + when)))
            said = {(f"{g['cluster']}/{g['uuid']}" if g["cluster"] else g["uuid"]): g for g in diagnosed["gpus"]}
            assert sorted(said) == sorted(gpus), (run, when, sorted(said))
            for key, gpu in gpus.items():
                verdict = said[key]["verdict"]["verdict"]
                assert series["verdicts"][key][at] == verdict, (run, when, key, series["verdicts"][key], verdict)
                moment = moments[key][start + when]
                assert (moment.verdict.name, moment.verdict.title, moment.verdict.code, moment.view.evidence_hint) == (
                    verdict, said[key]["verdict"]["title"], said[key]["verdict"]["code"], said[key]["evidence_hint"]), (
                    run, when, key)
                util = series["utilization"][key][at]
                if gpu.utilization is None:
                    assert util is None and said[key]["utilization"] is None
                else:
                    assert util == pytest.approx(said[key]["utilization"], abs=1e-4)
                    assert util == pytest.approx(gpu.utilization, abs=1e-3)
                if when == MOMENT:
                    assert verdict == BY_ROW[gpu.row].verdict, (run, key, said[key]["verdict"])
                    hint, code, title = EVIDENCE.get(gpu.row, ("", said[key]["verdict"]["code"],
                                                               said[key]["verdict"]["title"]))
                    assert (said[key]["evidence_hint"], said[key]["verdict"]["code"],
                            said[key]["verdict"]["title"]) == (hint, code, title), (run, key, said[key])
                    seen.add(gpu.row)
    assert seen == {row.name for row in LADDER}


def test_a_report_says_the_causes_and_verdicts_of_its_range(backfilled: tuple[str, int],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The report's cause spans and verdict spans: a run that stopped is idle but allocated after its end; the run
    of cluster a is input-bound at 8% all along, whatever the GPU of cluster b with the same UUID did."""
    prom, start = backfilled
    span = ["--from", str(start), "--to", str(start + SPAN), "--step", f"{STEP}s", "--output", "json"]
    _, twin = _cli(capsys, "report", "--prometheus-url", prom, "--run", "twin-a", *span)
    assert twin["main_cause"] == "input_bound" and twin["mean_utilization"] == pytest.approx(0.08, abs=0.01)
    assert [v["verdict"] for v in twin["verdicts"]] == ["input_bound"]
    _, idle = _cli(capsys, "report", "--prometheus-url", prom, "--run", "r-idle_but_allocated", *span)
    verdicts = {v["verdict"]: v for v in idle["verdicts"]}
    assert set(verdicts) >= {"idle_but_allocated"} and verdicts["idle_but_allocated"]["gpus"] == [
        "GPU-idle_but_allocated-r-idle_but_allocated-0"]
    # After its run ended, the GPU whose processes' /proc points at M1 is "not instrumented" with that hint, as
    # diagnose says it: the span names the hint (its title and code), apart from "not instrumented" without one.
    _, hinted = _cli(capsys, "report", "--prometheus-url", prom, "--run", "r-not_instrumented_evidence", *span)
    _, code, title = EVIDENCE["not_instrumented_evidence"]
    spans = {(v["verdict"], v["code"], v["title"]) for v in hinted["verdicts"]}
    assert ("not_instrumented", code, title) in spans, spans
    assert [(v["code"], v["title"]) for v in twin["verdicts"]] == [("M1", "input-bound (M1)")]
    # Busy but not effective: the run's GPU at 96% busy with 25% SM activity and memory left (M3, SM form): the
    # verdict span with its remedy, the effective utilization beside the busy one, and the GPU-hours between them.
    _, small = _cli(capsys, "report", "--prometheus-url", prom, "--run", "r-sm_batch_too_small", *span)
    (m3,) = [v for v in small["verdicts"] if v["verdict"] == "sm_batch_too_small"]
    assert (m3["code"], m3["title"]) == ("M3", "batch too small for the SMs (M3)")
    eff = small["effective_utilization"]
    assert eff["sm_activity"] == pytest.approx(0.25, abs=1e-3)
    assert eff["busy_utilization"] == pytest.approx(0.96, abs=1e-2)
    assert eff["sources"] == ["gpm"] and eff["compute_phase_sm_activity"] == pytest.approx(0.25 / 0.98, abs=1e-2)
    wall_hours = small["wall_seconds"] / 3600
    assert eff["gpu_hours_busy_not_effective"] == pytest.approx(wall_hours * 0.71, rel=0.05)
    assert 0 < eff["worth_gpu_hours"]["sm_batch_too_small"] <= eff["gpu_hours_busy_not_effective"] + 1e-9
    assert small["effective"].startswith("25% SM activity (GPM) beside 96% busy")
    # A GPU with no SM source: never said to be effective.
    assert twin["effective_utilization"] is None and twin["effective"].startswith("SM activity unknown")


def test_the_list_of_runs_keeps_two_clusters_with_one_gpu_uuid_apart(backfilled: tuple[str, int],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``report --list``: each twin run on its own GPU key, with its own busy time (8% and 90%) and wall time."""
    prom, start = backfilled
    code, listed = _cli(capsys, "report", "--prometheus-url", prom, "--list", "--from", str(start), "--to",
                        str(start + SPAN), "--step", f"{STEP}s", "--output", "json")
    assert code == 0, listed
    runs = {r["run"]: r for r in listed["runs"]}
    assert {run: (r["run_id"], r["gpus"], r["main_cause"]) for run, r in runs.items()} == {
        "twin-a": ("id-twin-a", ["a/GPU-twin"], "input_bound"), "twin-b": ("id-twin-b", ["b/GPU-twin"], "healthy")}
    assert runs["twin-a"]["mean_utilization"] == pytest.approx(0.08, abs=0.01)
    assert runs["twin-b"]["mean_utilization"] == pytest.approx(0.9, abs=0.01)
    assert [runs[r]["wall_seconds"] for r in runs] == pytest.approx([SPAN, SPAN], abs=STEP)
