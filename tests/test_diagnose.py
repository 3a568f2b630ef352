"""``gpu-exporter diagnose`` against a real exporter: one simulated GPU per verdict, exit codes, errors.

tests/scenarios/diagnose-node.yaml holds one GPU per verdict; a pusher thread sends training
snapshots for the instrumented ones over HTTP, like the training library does.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e import run_clis
from gpu_exporter.cli import SUBCOMMANDS, build_parser
from gpu_exporter.commands.client_cli import without_gc
from gpu_exporter.commands.diagnose_render import render_text
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.causes import find_causes
from gpu_exporter.verdict.join import build_views
from gpu_exporter.verdict.ladder import INSTRUMENT_SNIPPET, judge
from gpu_exporter.verdict.readings import from_snapshots
from gpu_exporter.verdict.samples import Snapshot
from gpu_exporter.verdict.signals import RunSignals
from gpu_exporter.verdict.views import GpuView, Process, RunView
from test_query import run_cli, run_cli_closed

from testbed import REPO, free_port, http_get, run_exporter, wait_until

SCENARIOS = Path(__file__).parent / "scenarios"
RUNBOOKS = load_thresholds().runbook_url("").rstrip("#")
STANDARD = ("data", "compute", "metrics", "checkpoint", "other")


def _shares(data: float, compute: float, metrics: float, checkpoint: float) -> dict[str, float]:
    return dict(zip(STANDARD, (data, compute, metrics, checkpoint, 1 - data - compute - metrics - checkpoint),
                    strict=True))


# uuid -> (run, phase shares while the test runs, phase seconds before, allocator retries per second)
RUNS: dict[str, tuple[str, dict[str, float], dict[str, float], float]] = {
    # 1000 s of compute before the window: since the run started it looks compute-bound, in the window it waits
    # for data. diagnose must judge the window.
    "GPU-diag-input": ("loader", _shares(0.6, 0.3, 0.05, 0.0), {"compute": 1000.0}, 0.0),
    "GPU-diag-metrics": ("evaluator", _shares(0.1, 0.4, 0.45, 0.0), {}, 0.0),
    "GPU-diag-batch": ("tiny", _shares(0.1, 0.8, 0.05, 0.0), {}, 0.0),
    "GPU-diag-allocator": ("fragmented", _shares(0.1, 0.8, 0.05, 0.0), {}, 10.0),
    "GPU-diag-unclear": ("balanced", _shares(0.25, 0.5, 0.15, 0.1), {}, 0.0),
}
EXPECTED = {
    "GPU-diag-healthy": "healthy",
    "GPU-diag-input": "input_bound",
    "GPU-diag-metrics": "metrics_bound",
    "GPU-diag-batch": "batch_too_small",
    "GPU-diag-allocator": "allocator",
    "GPU-diag-idle": "idle_but_allocated",
    "GPU-diag-blind": "not_instrumented",
    "GPU-diag-free": "unused",
    "GPU-diag-unclear": "underutilized",
    "GPU-diag-mig": "unknown",
}


def push(url: str, body: dict[str, Any]) -> None:
    """POST one training snapshot to the exporter's ingest endpoint."""
    req = urllib.request.Request(url + "/api/v1/training", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 202


def push_runs(url: str, stop: threading.Event) -> None:
    """Push a snapshot of every run in RUNS every 0.2 s until ``stop`` is set."""
    started = time.time()
    while not stop.is_set():
        elapsed = time.time() - started
        for uuid, (run, shares, before, retries_per_s) in RUNS.items():
            phases = {p: before.get(p, 0.0) + share * elapsed for p, share in shares.items()}
            push(url, {"version": 1, "run": run, "rank": "0", "uuid": uuid, "started_at": started - 1200,
                       "phases": phases, "current_phase": "compute", "steps": int(elapsed * 10),
                       "samples": int(elapsed * 40), "batch_size": 4, "finished": False,
                       "allocator": {"allocated_bytes": 2e9, "reserved_bytes": 6e9,
                                     "retries": int(elapsed * retries_per_s), "ooms": 0}})
        stop.wait(0.2)


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    """A running exporter on diagnose-node.yaml with its training runs pushing."""
    with run_exporter(["--simulate", str(SCENARIOS / "diagnose-node.yaml"), "--poll-interval", "0.2"]) as url:
        stop = threading.Event()
        thread = threading.Thread(target=push_runs, args=(url, stop), daemon=True)
        thread.start()
        try:
            wait_until(lambda: http_get(url + "/metrics").count('gpu_training_batch_size{') == len(RUNS), 10,
                       what="every run to be pushed")
            yield url
        finally:
            stop.set()
            thread.join()


@pytest.mark.slow  # end-to-end: real processes
def test_one_gpu_per_verdict_json(node: str) -> None:
    result = run_cli("diagnose", "--url", node, "--window", "3", "--output", "json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    verdicts = {g["uuid"]: g["verdict"]["verdict"] for g in doc["gpus"]}
    assert verdicts == EXPECTED
    assert doc["utilization_target"] == 0.85 and doc["window_seconds"] == 3.0
    # unused and unknown GPUs do not count as below target; healthy does not either.
    assert doc["gpus_below_target"] == 7
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    loader = gpus["GPU-diag-input"]["runs"][0]
    assert loader["run"] == "loader" and not loader["since_start"]
    assert loader["shares"]["data"] == pytest.approx(0.6, abs=0.05)  # the window, not the 1000 s before
    assert gpus["GPU-diag-input"]["utilization"] == pytest.approx(0.15, abs=0.02)
    # The 2 s window's ends are timed by this client (scrape midpoint minus sample age), so on a
    # busy machine one 0.2 s poll more or less lands in it: +-10% of the value. Assert what the
    # verdict rests on: at or above the 0.85 target, at most 1.
    assert 0.85 <= gpus["GPU-diag-healthy"]["utilization"] <= 1.0
    assert gpus["GPU-diag-batch"]["memory_used_ratio"] == pytest.approx(0.1)
    assert gpus["GPU-diag-mig"]["utilization"] is None
    for uuid, verdict in EXPECTED.items():
        v = gpus[uuid]["verdict"]
        assert v["below_target"] is (verdict not in ("healthy", "unused", "unknown"))
        if verdict not in ("healthy", "unused", "unknown"):
            assert v["remedy"] and v["runbook"].startswith(RUNBOOKS + "#"), v


@pytest.mark.slow  # end-to-end: real processes
@pytest.mark.parametrize("output", ["text", "json"])
def test_a_reader_that_went_away_is_no_traceback(node: str, output: str) -> None:
    """``diagnose ... | head`` where head quit first: the exit status a shell gives a program SIGPIPE ended, and
    nothing on stderr but the wait for the second reading."""
    status, err = run_cli_closed("diagnose", "--url", node, "--window", "1", "--output", output)
    assert status == 141 and err == f"diagnose: second reading of {node}/metrics in 1s ...\n", err


@pytest.mark.slow  # end-to-end: real processes
def test_text_report_names_remedy_and_runbook(node: str) -> None:
    result = run_cli("diagnose", "--url", node, "--window", "3")
    assert result.returncode == 1, result.stderr
    # while it waits out the window, one progress line on stderr (rewritten in place on a terminal)
    assert re.fullmatch(rf"diagnose: second reading of {node}/metrics in [1-3]s \.\.\.\n", result.stderr), result.stderr
    text = result.stdout
    for title in ("healthy", "input-bound (M1)", "metrics-bound (M2)", "batch too small (M3)",
                  "allocator trouble (M4)", "idle but allocated", "not instrumented", "underutilized", "unused"):
        assert f"  verdict      {title}: " in text
    assert "  run          loader (rank 0): data 6" in text
    assert "DataLoader(num_workers=N, pin_memory=True" in text
    assert "expandable_segments:True" in text
    for line in INSTRUMENT_SNIPPET.splitlines():  # the not-instrumented GPU gets the snippet
        assert line in text
    assert text.rstrip().endswith("7 of 10 GPU(s) below the 85% utilization target.")
    # Every cause verdict states its projection; the idle one names the process holding the GPU.
    # the GPU runs at 15%; measured over two scrapes 3 s apart on a loaded machine it may read a point off
    assert re.search(r"^  verdict      input-bound \(M1\): 1[3-7]% now, at most ~", text, re.M), text
    assert "if loading overlapped compute." in text
    assert "idle but allocated: 0% utilization while pid 71005 jupyter-kernel (30.0 GiB) holds the GPU." in text


def test_every_runbook_link_has_its_section() -> None:
    headings = re.findall(r"^## (\S+)", (REPO / "docs" / "runbooks.md").read_text(), flags=re.M)
    anchors = {h.lower() for h in headings}
    t = load_thresholds()
    views = [_view(0.1, 0.3, runs=(_run({"data": 0.9, "compute": 0.1}),)),
             _view(0.1, 0.3, runs=(_run({"metrics": 0.9, "compute": 0.1}),)),
             _view(0.1, 0.1, runs=(_run({"compute": 1.0}),)), _view(0.1, 0.3, runs=(_run({"compute": 1}, ooms=1),)),
             _view(0.0, 0.3), _view(0.1, 0.3), _view(0.1, 0.9, runs=(_run({"compute": 1.0}),))]
    links = [judge(v, t).runbook for v in views]
    assert all(link.startswith(RUNBOOKS + "#") for link in links)
    assert {link.rpartition("#")[2] for link in links} <= anchors


@pytest.mark.slow  # end-to-end: real processes
def test_filters_and_exit_0_when_every_gpu_is_at_target(node: str) -> None:
    loader, at_target, nope = run_clis([  # side by side, each over its own window
        ["diagnose", "--url", node, "--window", "1", "--run", "loader", "--output", "json"],
        ["diagnose", "--url", node, "--window", "3", "--id", "GPU-diag-healthy,7"],
        ["diagnose", "--url", node, "--window", "1", "--run", "nope"]])
    result = loader
    assert result.returncode == 1
    assert [g["uuid"] for g in json.loads(result.stdout)["gpus"]] == ["GPU-diag-input"]
    result = at_target
    assert result.returncode == 0, result.stdout
    assert "No GPU with work is below the 85% utilization target (2 GPU(s) checked)." in result.stdout
    result = nope
    assert result.returncode == 2
    assert result.stderr.endswith(f"gpu-exporter: error: no GPU matches --run nope at {node}/metrics\n")


@pytest.mark.slow  # end-to-end: real processes
def test_healthy_node_exits_0() -> None:
    with run_exporter(["--simulate", str(SCENARIOS / "diagnose-healthy.yaml"), "--poll-interval", "0.2"]) as url:
        result = run_cli("diagnose", "--url", url, "--window", "3s", "--output", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [g["verdict"]["verdict"] for g in json.loads(result.stdout)["gpus"]] == ["healthy", "healthy", "unused"]


@pytest.mark.slow  # end-to-end: real processes
@pytest.mark.parametrize(("args", "message"), [
    (["--url", "http://127.0.0.1:x"], "'http://127.0.0.1:x' is not a valid exporter URL: use http://HOST:PORT"),
    (["--url", "127.0.0.1:{port}"], "cannot connect to the exporter at http://127.0.0.1:{port}/metrics: connection "
                                    "refused (is gpu-exporter running there?)"),
    (["--prometheus-url", "127.0.0.1:{port}"], "cannot connect to the Prometheus server at http://127.0.0.1:{port}/api/v1/"
                                               "query: connection refused (is it running there?)"),
    (["--url", "127.0.0.1:{port}", "--window", "soon"],
     "--window: 'soon' is not a duration like 1s, 500ms, 1m30s, 2h, or seconds"),
    (["--node", "a"], "--node needs --prometheus-url (an exporter only knows its own node)"),
    (["--thresholds", "/nonexistent.yml"], "/nonexistent.yml cannot be read: No such file or directory"),
])
def test_errors_are_one_sentence_and_exit_2(args: list[str], message: str) -> None:
    port = str(free_port())
    result = run_cli("diagnose", *(a.replace("{port}", port) for a in args))
    assert result.returncode == 2
    assert result.stderr == f"gpu-exporter: error: {message.replace('{port}', port)}\n"
    assert result.stdout == ""


def test_the_fleet_commands_pause_the_garbage_collector_and_give_it_back() -> None:
    """diagnose and report run with Python's cyclic GC paused (a fleet read keeps every series it makes to the end)
    and turn it back on when they return or raise; serve and query, which may run for long, keep it."""
    seen: list[bool] = []

    def probe(args: argparse.Namespace) -> int:
        seen.append(gc.isenabled())
        raise KeyError(args)

    with pytest.raises(KeyError):
        without_gc(probe)(argparse.Namespace())
    assert seen == [False] and gc.isenabled()
    build_parser()
    paused = {name for name, (_, _, run) in SUBCOMMANDS.items() if hasattr(run, "__wrapped__")}
    assert paused == {"diagnose", "report"}


def _run(shares: dict[str, float], retries: float = 0.0, ooms: float = 0.0, live: bool = True) -> RunView:
    return RunView("r", "0", shares, 60.0, False, 8.0, retries, ooms, live)


def _view(util: float | None, memory: float, processes: int = 1, runs: tuple[RunView, ...] = (),
          window: float = 60.0) -> GpuView:
    """A GPU view whose live runs carry the causes build_views would find for them."""
    t = load_thresholds()
    judged = tuple(RunView(**{**r.__dict__, "findings": tuple(find_causes(
        util, memory, RunSignals(r.shares, r.allocator_retries, r.allocator_ooms, r.batch_size), t, window))})
        if r.live and util is not None else r for r in runs)
    procs = tuple(Process(str(70000 + i), "python train.py", 2**31) for i in range(processes))
    return GpuView("GPU-x", "0", "T", "", util, memory, processes, (), judged, procs)


def test_judge_thresholds_come_from_the_rules_file() -> None:
    t = load_thresholds()
    assert judge(_view(0.85, 0.5), t).name == "healthy"  # at target counts as at target
    assert judge(_view(0.84, 0.5), t).title == "below target: not instrumented"
    assert judge(_view(0.29, 0.5), t).title == "not instrumented"
    idle = judge(_view(0.01, 0.5), t)
    assert (idle.name, idle.reason) == (
        "idle_but_allocated", "1% utilization while pid 70000 python train.py (2.0 GiB) holds the GPU.")
    assert judge(_view(0.01, 0.01, processes=0), t).name == "unused"
    # a live run on the GPU is work even without a process or memory; a finished one is not
    assert judge(_view(0.01, 0.01, processes=0, runs=(_run({"compute": 1.0}),)), t).name == "batch_too_small"
    assert judge(_view(0.01, 0.01, processes=0, runs=(_run({"compute": 1.0}, live=False),)), t).name == "unused"
    assert judge(_view(0.2, 0.5, runs=(_run({"data": 0.30, "compute": 0.7}),)), t).name == "underutilized"
    assert judge(_view(0.2, 0.5, runs=(_run({"data": 0.31, "compute": 0.69}),)), t).name == "input_bound"
    assert judge(_view(0.2, 0.5, runs=(_run({"metrics": 0.21, "compute": 0.79}),)), t).name == "metrics_bound"
    assert judge(_view(0.2, 0.5, runs=(_run({"checkpoint": 0.72, "compute": 0.28}),)), t).name == "checkpoint"
    # M3: busy for less than half the compute phase, memory below batch_memory_used_ratio (0.5)
    m3 = judge(_view(0.2, 0.49, runs=(_run({"compute": 0.9}),)), t)
    assert (m3.name, m3.projected, m3.code, m3.level) == ("batch_too_small", 0.9, "M3", "low")
    assert judge(_view(0.2, 0.5, runs=(_run({"compute": 0.9}),)), t).name == "underutilized"
    assert judge(_view(0.5, 0.3, runs=(_run({"compute": 0.9}),)), t).title == "below target: no single cause"
    # M4: more than 3 retries per 10m; a longer window scales the limit; any OOM counts below target
    assert judge(_view(0.2, 0.5, runs=(_run({"compute": 1}, retries=3),)), t).name == "underutilized"
    assert judge(_view(0.2, 0.5, runs=(_run({"compute": 1}, retries=4),)), t).name == "allocator"
    assert judge(_view(0.2, 0.5, runs=(_run({"compute": 1}, retries=4),), window=3600), t).name == "underutilized"
    oom = judge(_view(0.5, 0.5, runs=(_run({"compute": 1}, ooms=1),)), t)
    assert oom.title == "below target: allocator trouble (M4)"
    assert judge(_view(None, 0.5), t).name == "unknown"


def test_below_target_names_the_cause_with_its_projection() -> None:
    t = load_thresholds()
    verdict = judge(_view(0.4, 0.5, runs=(_run({"data": 0.05, "compute": 0.4, "metrics": 0.55}),)), t)
    assert verdict.title == "below target: metrics-bound (M2)"
    assert verdict.reason.startswith("40% now, at most ~89% if metrics ran off the training path. ")
    assert verdict.below_target and verdict.level == "target"
    mixed = judge(_view(0.25, 0.5, runs=(_run({"data": 0.38, "compute": 0.28, "metrics": 0.34}),)), t)
    assert mixed.title == "input-bound (M1)"
    assert mixed.reason.endswith("Also metrics-bound (M2): 34% (at most ~38% without it).")
    # a finished run next to a live one: only the live run is judged
    finished = _run({"data": 0.9, "compute": 0.1}, live=False)
    live = RunView("live", "0", {"metrics": 0.6, "compute": 0.4}, 60.0, False, 8.0, 0.0, 0.0)
    assert judge(_view(0.2, 0.5, runs=(finished, live)), t).name == "metrics_bound"


def _snap(phases: dict[str, float], at: float) -> Snapshot:
    labels = {"run": "r", "rank": "0", "uuid": "GPU-x"}
    return Snapshot({"gpu_info": [({"gpu": "0", "uuid": "GPU-x", "name": "T"}, 1.0)],
                     "gpu_training_phase_seconds_total": [({**labels, "phase": p}, v) for p, v in phases.items()]},
                    at=at, wall=0.0)


def test_window_shares_fall_back_to_the_run_totals_without_a_push_in_the_window() -> None:
    pushed = build_views(from_snapshots(_snap({"data": 10, "compute": 10}, 0), _snap({"data": 40, "compute": 20}, 5)))
    assert pushed[0].runs[0].shares == {"data": 0.75, "compute": 0.25} and not pushed[0].runs[0].since_start
    quiet = build_views(from_snapshots(_snap({"data": 10, "compute": 30}, 0), _snap({"data": 10, "compute": 30}, 5)))
    assert quiet[0].runs[0].shares == {"data": 0.25, "compute": 0.75} and quiet[0].runs[0].since_start
    # a restarted run (counters went down) counts from zero
    restarted = build_views(from_snapshots(_snap({"data": 50, "compute": 50}, 0), _snap({"data": 1, "compute": 3}, 5)))
    assert restarted[0].runs[0].shares == {"data": 0.25, "compute": 0.75}


def test_only_live_runs_are_judged_and_runs_without_a_uuid_are_listed() -> None:
    """A finished run (no current phase) and a run that stopped pushing do not count; a UUID-less run is listed."""
    from gpu_exporter.verdict.join import unjoined_runs

    def snap(at: float, wall: float, total: float) -> Snapshot:
        runs = {"live": ("GPU-x", 1.0, wall), "finished": ("GPU-x", 0.0, wall), "stale": ("GPU-x", 1.0, wall - 120),
                "nouuid": ("", 1.0, wall)}
        phases, current, pushed = [], [], []
        for run, (uuid, phase_on, last) in runs.items():
            labels = {"run": run, "rank": "0", "uuid": uuid}
            share = {"live": {"data": 0.1, "compute": 0.9}}.get(run, {"data": 0.9, "compute": 0.1})
            phases += [({**labels, "phase": p}, s * total) for p, s in share.items()]
            current += [({**labels, "phase": "compute"}, phase_on), ({**labels, "phase": "data"}, 0.0)]
            pushed.append((labels, last))
        return Snapshot({"gpu_info": [({"gpu": "0", "uuid": "GPU-x", "name": "T"}, 1.0)],
                         "gpu_busy_seconds_total": [({"uuid": "GPU-x"}, 0.2 * at)],
                         "gpu_memory_used_bytes": [({"uuid": "GPU-x"}, 10.0)],
                         "gpu_memory_total_bytes": [({"uuid": "GPU-x"}, 100.0)],
                         "gpu_training_phase_seconds_total": phases, "gpu_training_current_phase": current,
                         "gpu_training_last_push_timestamp_seconds": pushed}, at=at, wall=wall)
    t = load_thresholds()
    readings = from_snapshots(snap(0.0, 1000.0, 100.0), snap(10.0, 1010.0, 110.0))
    (view,) = build_views(readings, t, 10.0)
    assert {r.run: r.live for r in view.runs} == {"live": True, "finished": False, "stale": False}
    # the finished and stale runs wait on data 90% of the time, yet only the live one is judged
    verdict = judge(view, t)
    assert verdict.name == "batch_too_small" and "run live rank 0" in verdict.reason, verdict
    assert unjoined_runs(readings) == [("nouuid", "0")]


def test_help_states_the_exit_statuses() -> None:
    result = run_cli("diagnose", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps the epilog
    assert re.search(r"exit status: 0 no GPU below the target .*, 1 a GPU with work below the target, 2 an error",
                     text), result.stdout


def test_a_concrete_remedy_is_printed_once() -> None:
    """The run's suggestion (its numbers) leads the remedy; the verdict line does not repeat it."""
    t = load_thresholds()
    tip = "num_workers=2 with 16 cores available: try num_workers=8"
    run = RunView("r", "0", {"data": 0.5, "compute": 0.5}, 60.0, False, 8.0, 0.0, 0.0,
                  suggestions={"input_bound": tip})
    view = _view(0.2, 0.5, runs=(run,))
    verdict = judge(view, t)
    assert (verdict.name, verdict.suggestion) == ("input_bound", tip)
    assert verdict.remedy.startswith(tip + ".\n") and tip not in verdict.reason
    out = io.StringIO()
    render_text([(view, verdict)], "5m", t, out)
    assert out.getvalue().count(tip) == 1, out.getvalue()


def test_a_gpu_whose_run_ended_is_not_told_to_instrument_it() -> None:
    """Below target with only finished runs: the verdict says the run ended, not 'instrument the job'."""
    t = load_thresholds()
    ended = judge(_view(0.2, 0.5, runs=(_run({"data": 0.9, "compute": 0.1}, live=False),)), t)
    assert (ended.name, ended.title) == ("not_instrumented", "run r ended or stopped pushing"), ended
    assert ended.remedy.startswith("Run r ended or stopped pushing: it was instrumented.")
    assert "Instrument the job" not in ended.remedy and INSTRUMENT_SNIPPET not in ended.remedy
    above_low = judge(_view(0.5, 0.5, runs=(_run({"compute": 1.0}, live=False),)), t)
    assert above_low.title == "below target: run r ended or stopped pushing"
    never = judge(_view(0.2, 0.5), t)  # no run ever reported: instrument it
    assert never.title == "not instrumented" and INSTRUMENT_SNIPPET in never.remedy
