"""How much of the GPU's idle time in compute and between the phases the verdict explains (FO, HW, M3) and how much
has no known cause (gpu_exporter.verdict.code.idle_split): the same split from readings judged here (diagnose --url)
and from Prometheus' recorded series (diagnose --prometheus-url), in both renderings."""

from __future__ import annotations

import io
import json
from typing import Any

from gpu_exporter.commands.diagnose_render import render_json, render_text
from gpu_exporter.commands.diagnose_sources import from_prometheus
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.join import build_views
from gpu_exporter.verdict.ladder import judge
from gpu_exporter.verdict.views import Readings
from test_verdict import FakePrometheus

T = load_thresholds()
KEY = ("lightning-tiny", "0", "GPU-0")
SHARES = {"compute": 0.40, "other": 0.35, "data": 0.25}  # a Lightning loop around a tiny model (the e2e test's)


def _readings(code: dict[str, float] | None, memory: float = 0.5, shares: dict[str, float] = SHARES) -> Readings:
    readings = Readings(info=[{"uuid": "GPU-0", "gpu": "0"}], utilization={"GPU-0": 0.15},
                        memory_ratio={"GPU-0": memory}, phase_total={KEY: {p: s * 100 for p, s in shares.items()}},
                        live={KEY}, cluster_label="")
    if code is not None:
        readings.code[KEY] = code
    return readings


def test_the_verdict_says_how_much_of_the_idle_time_framework_host_and_launch_overhead_explain() -> None:
    (view,) = build_views(_readings({"framework": 0.36, "host": 0.05}), T, 300.0)
    verdict = judge(view, T)
    assert verdict.name == "framework_overhead", verdict
    split = verdict.idle
    assert split is not None and split.sampled
    # idle: compute + other - busy = 0.60; FO 0.36, HW 0.05, no M3 (half the memory used): 0.19 has no known cause
    assert (round(split.idle, 3), round(split.framework, 3), round(split.host, 3), split.launch,
            round(split.unexplained, 3)) == (0.6, 0.36, 0.05, 0.0, 0.19)
    assert verdict.idle is not None and verdict.idle.text() == (
        "GPU idle 60% of the step in compute and between the phases, 68% of it explained: framework overhead (FO) "
        "36%, host work (HW) 5%, launch overhead (M3) 0%; no cause known for 19%")
    text, doc = io.StringIO(), io.StringIO()
    render_text([(view, verdict)], "5m", T, text)
    assert f"  idle         {verdict.idle.text()}\n" in text.getvalue()
    render_json([(view, verdict)], "url", 300.0, T, doc)
    idle = json.loads(doc.getvalue())["gpus"][0]["verdict"]["idle"]
    assert {k: round(v, 3) for k, v in idle.items()} == {"idle": 0.6, "framework": 0.36, "host": 0.05, "launch": 0.0,
                                                        "unexplained": 0.19, "sampled": True}


def test_launch_overhead_explains_the_rest_inside_compute_where_the_run_has_m3() -> None:
    shares = {"compute": 0.6, "other": 0.2, "data": 0.2}  # most of the step in compute, memory left: M3
    (view,) = build_views(_readings({"framework": 0.15, "host": 0.05}, 0.05, shares), T, 300.0)
    verdict = judge(view, T)
    assert "batch_too_small" in {f.cause.cause for f in view.runs[0].findings}, view.runs[0].findings
    split = verdict.idle
    assert split is not None
    # idle 0.8 - 0.15 = 0.65; M3: the idle time inside compute less host work (0.6 - 0.15 - 0.05 = 0.40), at most
    # what FO and HW leave (0.45); 0.05 has no known cause
    assert (round(split.framework, 3), round(split.launch, 3), round(split.unexplained, 3)) == (0.15, 0.4, 0.05)
    # without M3 (all memory used) that part has no known cause
    (full,) = build_views(_readings({"framework": 0.15, "host": 0.05}, 0.9, shares), T, 300.0)
    split = judge(full, T).idle
    assert split is not None and (split.launch, round(split.unexplained, 3)) == (0.0, 0.45), split


def test_without_the_samplers_readings_the_split_says_so_and_explains_nothing_it_cannot_measure() -> None:
    (view,) = build_views(_readings(None), T, 300.0)
    verdict = judge(view, T)
    assert verdict.name == "underutilized", verdict
    assert verdict.idle is not None and not verdict.idle.sampled
    assert (round(verdict.idle.unexplained, 3), verdict.idle.framework) == (0.6, 0.0)
    assert verdict.idle.text().endswith("no cause known for 60% (no stack samples from the job: FO and HW unmeasured)")


def test_a_healthy_gpu_has_no_split() -> None:
    readings = _readings({"framework": 0.05, "host": 0.0})
    readings.utilization["GPU-0"] = 0.95
    (view,) = build_views(readings, T, 300.0)
    assert judge(view, T).idle is None


def test_the_prometheus_path_reads_the_recorded_code_shares_for_the_same_split() -> None:
    gpu = {"uuid": "GPU-0", "gpu": "0", "node": "n"}
    run = {**gpu, "run": "lightning-tiny", "rank": "0"}
    answers: dict[str, list[tuple[dict[str, str], float]]] = {
        "gpu_info": [({**gpu, "name": "H100"}, 1.0)],
        "gpu:gpu_utilization:avg5m": [(gpu, 0.15)],
        "gpu:gpu_memory_used:ratio": [(gpu, 0.5)],
        "run:gpu_training_phase:share5m": [({**run, "phase": p}, s) for p, s in SHARES.items()],
        "gpu_training_current_phase == 1": [({**run, "phase": "other"}, 1.0)],
        "run:gpu_useful_utilization:avg5m": [(run, 0.15)],
        "run:gpu_training_cause:share": [({**run, "cause": "framework_overhead", "level": "low"}, 0.36)],
        "run:gpu_training_code:share5m": [({**run, "part": "framework"}, 0.36), ({**run, "part": "host"}, 0.05)],
    }
    prom: Any = FakePrometheus(answers)
    (view,) = build_views(from_prometheus(prom, cluster_label=""), T, 300.0)
    verdict = judge(view, T)
    assert verdict.name == "framework_overhead", verdict
    assert verdict.idle is not None and verdict.idle.text() == (
        "GPU idle 60% of the step in compute and between the phases, 68% of it explained: framework overhead (FO) "
        "36%, host work (HW) 5%, launch overhead (M3) 0%; no cause known for 19%")
