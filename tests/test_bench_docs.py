"""``python -m bench --update-docs`` rewrites only its own marked regions of docs/benchmarks.md: fed a made-up run
(no bench runs here), the rewrite of the real page changes those regions and keeps every other byte, the sections
kept by hand and the regions of other benches included; the README's table made from it names that run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import doc_regions, readme, report, run
from bench.accuracy import AccuracyRow
from bench.cuda_path import CudaPath
from bench.hotspots import Hotspot, PollProfile
from bench.instrumentation import CUDA_CANDIDATES, MicroRow, TrainingAB
from bench.load import LoadPlan, LoadResult
from bench.scrape import Durations, ScrapeResult

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "benchmarks.md"
MARK = 4321.0
"""A figure no real run prints: the made-up run's phase cost (ns)."""
HAND_KEPT = ("### Before and after the change", "### How far from the goals", "### Phase cost after the seqlock change",
             "## GPU-truthful phases")
"""Sections of the page kept by hand, between the run's regions."""


def _scrape(exporter: str, gpus: int, processes: int, factor: float) -> ScrapeResult:
    return ScrapeResult(exporter=exporter, gpus=gpus, processes=processes, scrapes=60, p50_ms=2.0 * factor,
                        p99_ms=5.0 * factor, max_ms=6.0 * factor, poll_cpu_s_per_min=0.5 * factor,
                        cpu_s_per_min=1.5 * factor, sim_poll_s_per_min=0.2, sim_scraped_s_per_min=0.3,
                        cpu_ms_per_scrape=3.0 * factor, rss_mb=30.0 + factor, series=100 * gpus, wire_bytes=4000,
                        burst_p50_ms=1.0 * factor, spaced_p50_ms=1.8 * factor, spaced_p99_ms=2.5 * factor,
                        spaced_scrapes=20, floor_p50_ms=1.9 if exporter == report.OURS else float("nan"))


def fake_run(started_utc: str = "2026-12-06 20:00 UTC") -> tuple[report.Results, CudaPath]:
    """A complete made-up run: every figure the page prints, none measured."""
    nodes = ((1, 0), (8, 64), (16, 256))
    scrapes = [_scrape(name, g, p, factor) for g, p in nodes
               for name, factor in ((report.OURS, 1.0), (report.PEER, 4.0 + g / 4))]
    micro = [MicroRow("empty loop (timeit's own cost per iteration)", "pass", 10.0, 9.0, 11.0),
             MicroRow("floor: two perf_counter() calls", "perf_counter(); perf_counter()", 90.0, 80.0, 100.0),
             MicroRow("gpu_exporter.training phase, kept object", "with compute: pass", MARK, 4000.0, 4500.0),
             MicroRow('gpu_exporter.training run.phase("compute")', "with run.phase('compute'): pass", 4400.0,
                      4300.0, 4600.0),
             MicroRow("prometheus_client Histogram.time()", "with histogram.time(): pass", 15000.0, 14000.0,
                      16000.0),
             MicroRow("torch.profiler.record_function", "with record_function('compute'): pass", 50000.0,
                      48000.0, 52000.0)]
    accuracy = [AccuracyRow(interval, method, 7000, point, point * 2, 6900, point / 2, point)
                for interval in (15, 60)
                for method, point in (("busy counter (gpu-exporter)", 0.1),
                                      ("gpu_utilization_ratio gauge (gpu-exporter)", 30.0),
                                      ("instant NVML gauge (nvitop-exporter)", 40.0))]
    load = LoadResult(plan=LoadPlan(seconds=5.0), scrapes=300, pushes=320, errors=0, first_errors=(),
                      scrape_p50_ms=5.0, scrape_p99_ms=20.0, scrape_max_ms=30.0, push_p99_ms=10.0, rss_start_mb=33.0,
                      rss_end_mb=34.0, cpu_s_per_min=30.0)
    training = TrainingAB(threads=1, steps_per_rep=100, a=[300.0, 310.0, 305.0], b=[301.0, 299.0, 306.0])
    results = report.Results(
        mode="full", command="PYTHONPATH=exporter python -m bench --full --update-docs", started_utc=started_utc,
        elapsed_s=900.0, load_before=(1.0, 1.0, 1.0), load_after=(2.0, 2.0, 2.0),
        durations=Durations(warmup=1.0, idle=1.0, scrape=2.0, rate=4.0, burst=10, spaced=20, floor=20),
        scrape=scrapes, simulation_rss_mb={node: 9.0 for node in nodes},
        profile=PollProfile(polls=3, poll_ms=10.0, simulation_percent=40.0,
                            top=[Hotspot("pynvml.py:1 f", 100, 5.0)]),
        profile_node=nodes[-1], accuracy=accuracy, accuracy_seconds=3600, micro=micro, micro_number=1000,
        micro_repeat=3, training=training, load=load, load_node=(8, 64))
    cuda_micro = [MicroRow(name, code, 1000.0 * (i + 1), 900.0 * (i + 1), 1100.0 * (i + 1))
                  for i, (name, code) in enumerate(CUDA_CANDIDATES)]
    cuda = CudaPath(micro=cuda_micro, number=1000, repeat=3, training=training, started_utc=started_utc,
                    commit="abc1234", load_before=(1.0, 1.0, 1.0), load_after=(2.0, 2.0, 2.0), elapsed_s=30.0)
    return results, cuda


def _outside(page: str, names: set[str]) -> str:
    """``page`` with each region of ``names`` cut down to its markers: what a rewrite must leave as it was."""
    return doc_regions.REGION.sub(
        lambda m: doc_regions.begin(m["name"]) + doc_regions.end(m["name"]) if m["name"] in names else m.group(0),
        page)


@pytest.fixture(scope="module")
def rewritten() -> tuple[str, str]:
    """(the page as committed, the page after a rewrite by the made-up run)."""
    old = PAGE.read_text()
    results, cuda = fake_run()
    return old, run.write(old, results, cuda, results.command)


def test_a_rewrite_changes_only_the_regions_the_run_writes(rewritten: tuple[str, str]) -> None:
    old, new = rewritten
    ours = {f"bench.run.{name}" for name in report.REGIONS} | {"bench.spaced", "bench.cuda_path"}
    assert ours <= set(doc_regions.regions(old))
    assert _outside(new, ours) == _outside(old, ours)  # every byte outside the run's regions, in place
    fresh, before = doc_regions.regions(new), doc_regions.regions(old)
    assert list(fresh) == list(before)
    for name in ours:
        assert fresh[name] != before[name], name
    for name in set(before) - ours:  # the regions of other benches: bench.sampling, bench.fleet_scale, ...
        assert fresh[name] == before[name], name
    assert f"timing a training phase costs {MARK:.0f} ns" in fresh["bench.run.headline"]
    assert "abc1234" in fresh["bench.cuda_path"]


def test_a_rewrite_keeps_the_sections_kept_by_hand(rewritten: tuple[str, str]) -> None:
    old, new = rewritten
    for heading in HAND_KEPT:
        assert old.count(heading + "\n") == 1, heading
        start = old.index(heading + "\n")
        # the section up to the next marker or heading of its level, byte for byte
        level = heading.split(" ")[0]
        following = re.compile(rf"^(<!-- |#{{1,{len(level)}}} )", re.M).search(old, start + len(heading))
        section = old[start:following.start() if following else len(old)]
        assert len(section) > 200 and section in new, heading


def test_a_second_rewrite_changes_nothing_more(rewritten: tuple[str, str]) -> None:
    _, new = rewritten
    results, cuda = fake_run()
    assert run.write(new, results, cuda, results.command) == new


def test_an_empty_file_gets_the_whole_page() -> None:
    results, cuda = fake_run()
    page = run.write("", results, cuda, results.command)
    assert page.startswith("# Benchmarks\n\n<!-- bench.run.intro: begin -->\n")
    names = list(doc_regions.regions(page))
    assert names[:6] == ["bench.run.intro", "bench.run.headline", "bench.run.machine", "bench.run.method",
                         "bench.run.scrape", "bench.spaced"]
    assert names.index("bench.run.training") + 1 == names.index("bench.cuda_path") == names.index("bench.run.load") - 1


def test_the_readme_table_names_the_rewriting_run(rewritten: tuple[str, str]) -> None:
    """Every row says the date and commit it was measured at: after the rewrite, the full run's rows name the
    made-up run, the CUDA path's its own run, and the older seqlock run's row (its section kept) is left out."""
    _, new = rewritten
    commit = re.search(r"\| gpu-exporter \| [^|]*\(commit ([0-9a-f]{7,}|unknown[^)]*)\)", new)
    assert commit is not None
    made = {claim: run_cell for claim, _, run_cell, _ in readme.rows(new)}
    assert readme.SEQLOCK + "\n" in new and "training library, later" not in made
    assert "CPU of polling, later" not in made  # the spaced region is this run's now
    for claim, cell in made.items():
        expected = "abc1234" if claim == "training library, CUDA path" else commit.group(1)
        assert cell == f"2026-12-06, {expected}", claim


def test_markers_that_do_not_close_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"region bench\.x has no end marker of its own"):
        doc_regions.update("<!-- bench.x: begin -->\nold\n", doc_regions.region("bench.x", "new"))
    twice = doc_regions.region("bench.x", "a") + doc_regions.region("bench.x", "b")
    with pytest.raises(ValueError, match=r"region bench\.x is marked twice"):
        doc_regions.update(twice, doc_regions.region("bench.x", "new"))
