"""``gpu-exporter report`` without Prometheus: the projection formula (verdict/timeline.py), cause stretches,
durations, the idle time's split over a run (timeline.idle_over, from readings judged point by point) and the four
renderings of one report (commands/report_render.py; the end-to-end test with a real
run is tests/test_report.py)."""

from __future__ import annotations

import json

import pytest
from gpu_exporter.commands import report_render as rp
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict import timeline
from gpu_exporter.verdict.code import IdleSplit
from gpu_exporter.verdict.views import GpuKey, Readings

RUN = ("lightning-tiny", "0", "GPU-0")
SHARES = {"compute": 0.40, "other": 0.35, "data": 0.25}  # a Lightning loop around a tiny model (test_idle_split's)


def sample() -> rp.Report:
    """A 2-hour run of one rank on one GPU: data 60%, compute 30%, input-bound for the second hour."""
    start, step = 1_800_000_000.0, 600.0
    times = [start + step * i for i in range(1, 13)]
    span = rp.CauseSpan("input_bound", "M1", "input-bound (M1)", 3600.0, [(start + 3600, start + 7200)],
                        "more DataLoader workers", ["0"])
    return rp.Report(run="resnet", source="http://prometheus:9090", start=start, end=start + 7200,
                     wall_seconds=7200.0, gpus=["GPU-a"],
                     ranks=[{"rank": "0", "uuid": "GPU-a", "wall_seconds": 7200.0, "utilization": 0.25,
                             "shares": {"data": 0.6, "compute": 0.3, "other": 0.1}}],
                     mean_utilization=0.25, shares={"data": 0.6, "compute": 0.3, "other": 0.1}, gpu_hours=2.0,
                     gpu_hours_below_target=2.0, causes=[span], main_cause="input_bound",
                     projected_wall_seconds=7200.0 * (1 - 0.6), projection_share=0.6, step=step, times=times,
                     utilization={"GPU-a": [0.25] * 12},
                     phase_series={"data": [0.6] * 12, "compute": [0.3] * 12, "other": [0.1] * 12})


def _span(cause: str, ranks: list[str]) -> rp.CauseSpan:
    return rp.CauseSpan(cause, "", cause, 60.0, [(0.0, 60.0)], "", ranks)


def _share(span: rp.CauseSpan, deltas: dict[tuple[str, str], dict[str, float]], util: float) -> float | None:
    keyed = {(rank, GpuKey("", uuid)): phases for (rank, uuid), phases in deltas.items()}
    return timeline.projection_share(span.cause, span.ranks, keyed, util)


def test_projection_share_is_the_main_causes_share_of_the_wall_time() -> None:
    one = {("0", "GPU-a"): {"data": 60.0, "compute": 30.0, "other": 10.0}}
    assert _share(_span("input_bound", ["0"]), one, 0.25) == pytest.approx(0.6)
    assert _share(_span("batch_too_small", ["0"]), one, 0.25) == pytest.approx(0.05)  # idle in compute
    assert _share(_span("allocator", ["0"]), one, 0.25) is None


def test_projection_of_a_distributed_run_takes_the_ranks_the_cause_applied_to() -> None:
    # Rank 1 loads 80% of the time; rank 0 waits for it in all-reduce (70% communication, 5% its own).
    run = {("0", "GPU-a"): {"data": 5.0, "compute": 20.0, "communication": 75.0},
           ("1", "GPU-b"): {"data": 80.0, "compute": 15.0, "communication": 5.0}}
    assert _share(_span("input_bound", ["1"]), run, 0.2) == pytest.approx(0.8)  # not the mean 0.425
    assert _share(_span("straggler", ["0"]), run, 0.2) == pytest.approx(0.7)  # 0.75 - rank 1's 0.05
    assert _share(_span("input_bound", ["0", "1"]), run, 0.2) == pytest.approx(0.425)


def test_cause_stretches_and_durations() -> None:
    assert timeline.intervals([10.0, 11.0, 12.0, 20.0], 1.0) == [(9.0, 12.0), (19.0, 20.0)]
    assert [rp.duration(s) for s in (29160, 754, 25.04)] == ["8.1 h", "12.6 min", "25.0 s"]


def test_every_format_says_the_same_figures() -> None:
    r = sample()
    assert r.projection_text() == "2.0 h; down to ~48.0 min if loading overlapped compute (input-bound (M1))"
    text = rp.render_text(r)
    assert "wall time               2.0 h" in text and "input-bound (M1): 1.0 h on rank(s) 0" in text
    markdown = rp.render_markdown(r)
    assert "| projection | 2.0 h; down to ~48.0 min" in markdown and "| 0 | GPU-a | 2.0 h | 25% |" in markdown
    doc = json.loads(rp.render_json(r))
    assert (doc["wall_seconds"], doc["projected_wall_seconds"], doc["main_cause"]) == (7200.0, 2880.0, "input_bound")
    assert doc["causes"][0]["applied"] == [["2027-01-15T09:00:00Z", "2027-01-15T10:00:00Z"]]
    page = rp.render_html(r)
    assert page.count("<svg") == 3 and page.count("<polyline") == 1 and page.count("<polygon") == 3
    for remote in ("<script", "<link", "<img", "src=", "href=", "url(", "@import"):
        assert remote not in page, remote


def _point(utilization: float, code: dict[str, float] | None) -> Readings:
    """One point of a range: what diagnose --prometheus-url --window W --at T reads for the run (half the memory used:
    no M3)."""
    readings = Readings(info=[{"uuid": "GPU-0", "gpu": "0"}], utilization={"GPU-0": utilization},
                        memory_ratio={"GPU-0": 0.5}, phase_total={RUN: {p: s * 100 for p, s in SHARES.items()}},
                        live={RUN}, cluster_label="")
    if code is not None:
        readings.code[RUN] = code
    return readings


def _idle(points: list[tuple[float, Readings]]) -> tuple[IdleSplit, float] | None:
    line = timeline.Timeline.judge(points, load_thresholds(), 60.0, RUN[0])
    return timeline.idle_over(line.series(line.times()), 15.0)


def test_the_idle_time_explained_over_a_run_is_the_time_weighted_mean_of_its_points_splits() -> None:
    points = [(15.0, _point(0.15, {"framework": 0.36, "host": 0.05})),
              (30.0, _point(0.25, {"framework": 0.20, "host": 0.10})),
              (45.0, _point(0.95, {"framework": 0.05, "host": 0.0}))]  # healthy: no split
    found = _idle(points)
    assert found is not None
    split, seconds = found
    assert seconds == 30.0  # the two points below target, 15 s each
    # idle = compute + other - busy: 0.60 (FO 0.36, HW 0.05, 0.19 unknown) and 0.50 (FO 0.20, HW 0.10, 0.20 unknown)
    assert split.sampled and (round(split.idle, 4), round(split.framework, 4), round(split.host, 4), split.launch,
                              round(split.unexplained, 4)) == (0.55, 0.28, 0.075, 0.0, 0.195), split
    # no sampler readings at any point: FO and HW unmeasured, all the idle time without a known cause
    found = _idle([(15.0, _point(0.15, None)), (30.0, _point(0.25, None))])
    assert found is not None and not found[0].sampled and round(found[0].unexplained, 4) == 0.55, found
    assert found[0].text().endswith("(no stack samples from the job: FO and HW unmeasured)")
    assert _idle([(15.0, _point(0.95, {"framework": 0.05}))]) is None  # never below target


def test_every_format_says_the_idle_split_and_a_run_without_one_says_nothing_new() -> None:
    r = sample()
    assert "idle time" not in rp.render_text(r) + rp.render_markdown(r) + rp.render_html(r)
    assert json.loads(rp.render_json(r))["idle"] is None
    split = IdleSplit(0.6, 0.36, 0.05, 0.0, 0.19)
    r.idle = (split, 3600.0)
    line = ("GPU idle 60% of the step in compute and between the phases, 68% of it explained: framework overhead (FO) "
            "36%, host work (HW) 5%, launch overhead (M3) 0%; no cause known for 19%; the mean over 1.0 h of GPU time "
            "below target")
    assert r.idle_text() == line
    assert f"\nidle time               {line}\n" in rp.render_text(r)
    assert f"| idle time | {line} |" in rp.render_markdown(r)
    assert f"<tr><th>idle time</th><td>{line}</td></tr>" in rp.render_html(r)
    assert json.loads(rp.render_json(r))["idle"] == {"idle": 0.6, "framework": 0.36, "host": 0.05, "launch": 0.0,
                                                     "unexplained": 0.19, "sampled": True, "gpu_seconds": 3600.0,
                                                     "text": line}
