"""``gpu-exporter report`` without Prometheus: the projection formula (verdict/timeline.py), cause stretches,
durations and the four renderings of one report (commands/report_render.py; the end-to-end test with a real
run is tests/test_report.py)."""

from __future__ import annotations

import json

import pytest
from gpu_exporter.commands import report_render as rp
from gpu_exporter.verdict import timeline
from gpu_exporter.verdict.views import GpuKey


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
