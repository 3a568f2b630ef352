"""``gpu-exporter report`` on a real, finished CPU training run recorded by a real Prometheus.

A real PyTorch run of two ranks (tests/cause_loops.py ``mixed``: data ~54%, metrics ~29%, compute ~17%;
one process per rank, each on its own ops-mode simulated GPU, ``device: true``: busy exactly while the rank
is inside torch operators, whatever it reports) reports to a real exporter that Prometheus scrapes every
second; the ranks end (``run.close()``), then ``report`` reads the run. Its figures are checked against the
ranks' own timers (perf_counter around the run and each phase) and their devices' own account:
wall time within 2%, phase shares within 0.05, utilization within 0.04 of the device's busy share, and the
projection by the documented formula (wall x (1 - share of the main cause)). Every format is rendered;
the HTML must be self-contained, and headless Chromium renders it to a PNG.

Set REPORT_OUTPUT=DIR to keep every format and the screenshot (docs/cli.md and
docs/screenshots/report.png show them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_query import run_cli

from testbed import exporter_env, http_status, promql, run_exporter, run_prometheus, scrape_config, wait_until

pytestmark = pytest.mark.slow

SCENARIO = """gpus:
  - {name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: "GPU-e2e-mixed", device: true,
     processes: [{pid: 74001, name: "python train.py --slow-loader --f1-every-step", memory_gib: 30}]}
  - {name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: "GPU-e2e-checkpoint", device: true,
     processes: [{pid: 74002, name: "python train.py --slow-loader --f1-every-step", memory_gib: 30}]}
  - {name: "NVIDIA A100-SXM4-80GB", architecture: ampere, memory_gib: 80, uuid: "GPU-e2e-uninstrumented",
     utilization: 0.4, processes: [{pid: 74003, name: "python serve.py", memory_gib: 20}]}
"""
LOOPS = Path(__file__).with_name("cause_loops.py")
REUSED = Path(__file__).with_name("reused_name_loop.py")
SECONDS = 20
GPUS = ("GPU-e2e-mixed", "GPU-e2e-checkpoint")
"""Rank 0 and rank 1 of the run, each on its own simulated GPU."""
UNINSTRUMENTED = "GPU-e2e-uninstrumented"
"""A GPU 40% busy with a process and no training run: the fleet report's "not instrumented" time."""
PRICES = "currency: EUR\ngpu_hour:\n  NVIDIA H100 80GB HBM3: 4.0\n  default: 2.0\n"


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str, Path]]:
    """A simulated exporter and a Prometheus that scrapes it every second; yields (exporter URL, Prometheus URL,
    a temp dir)."""
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "report.yaml"
        scenario.write_text(SCENARIO)
        # The ranks' devices write their busy intervals to the channel directory tmp (_run gives them it too).
        with run_exporter(["--simulate", str(scenario), "--poll-interval", "0.2"],
                          env={"GPU_SIM_DEVICE_DIR": tmp}) as exporter, \
                run_prometheus(scrape_config(exporter, "report-node", rule_files=())) as prom:
            yield exporter, prom, Path(tmp)


@pytest.fixture(scope="module")
def recorded(stack: tuple[str, str, Path]) -> tuple[str, dict[str, Any], Path]:
    """Prometheus holding the finished two-rank run ``mixed``; (Prometheus URL, the ranks' timers by GPU, a temp
    dir). Its ranks are separate processes without torchrun, so each draws a run id of its own: the report by
    name takes them as one job (they started together on different ranks)."""
    exporter, prom, tmp = stack
    return prom, _run(exporter, prom, tmp), tmp


def _run(exporter: str, prom: str, tmp: Path) -> dict[str, Any]:
    """Run both ranks of ``mixed`` to their end; their timers by GPU, once Prometheus holds their last snapshots."""
    loops = {uuid: subprocess.Popen(
        [sys.executable, str(LOOPS), "mixed", exporter, f"{tmp}/ckpt{rank}.pt", str(SECONDS),
         f"{tmp}/timers{rank}.json"],
        env=exporter_env({"RANK": str(rank), "CAUSE_LOOP_UUID": uuid, "GPU_SIM_DEVICE_DIR": str(tmp)}),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rank, uuid in enumerate(GPUS)}
    for loop in loops.values():
        _, err = loop.communicate(timeout=120)
        assert loop.returncode == 0, err[-2000:]
    # The final snapshots (no current phase) have been scraped: the run is over in Prometheus too.
    wait_until(lambda: len(promql(prom, 'max by (rank) (gpu_training_current_phase{run="mixed"}) == 0')) == 2,
               20, what="the finished ranks' last snapshots in Prometheus")
    return {uuid: json.loads((tmp / f"timers{rank}.json").read_text()) for rank, uuid in enumerate(GPUS)}


def _report(prom: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("report", "--prometheus-url", prom, "--run", "mixed", "--step", "1s", *args)


def _keep(name: str, data: bytes | str) -> None:
    if os.environ.get("REPORT_OUTPUT"):
        path = Path(os.environ["REPORT_OUTPUT"]) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())


def test_a_launch_is_read_until_an_hour_after_the_next_launch_of_its_name() -> None:
    """``Launch.until`` bounds a launch's reads: an hour after the next launch of the same name started, and no
    bound for the latest (a run of more than an hour is read to its end), whatever other names start between."""
    from gpu_exporter.commands import report_sources

    starts = {("train", "a"): 1000.0, ("eval", "x"): 1500.0, ("train", "b"): 2000.0, ("train", "c"): 9000.0}

    class Fake:
        def at_time(self, at: float) -> Fake:
            return self

        def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
            if not expr.startswith("max_over_time("):
                return []
            return [({"run": run, "run_id": ident, "rank": "0", "uuid": "GPU-1"}, start)
                    for (run, ident), start in starts.items()]

    found = report_sources.launches(Fake(), 10_000.0, "1d", cluster_label="")  # type: ignore[arg-type]
    assert [(x.run, x.run_id, x.until) for x in found] == [
        ("train", "a", 5600.0), ("eval", "x", float("inf")), ("train", "b", 12600.0), ("train", "c", float("inf"))]


def test_report_figures_match_the_runs_own_timers(recorded: tuple[str, dict[str, Any], Path]) -> None:
    prom, ranks, _ = recorded
    result = _report(prom, "--output", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    # Every rank and GPU, each against its own timers; the run's wall time is its longest rank's.
    assert doc["gpus"] == sorted(GPUS)
    assert [(r["rank"], r["uuid"]) for r in doc["ranks"]] == [(str(i), u) for i, u in enumerate(GPUS)]
    for rank in doc["ranks"]:
        own = ranks[rank["uuid"]]
        assert rank["wall_seconds"] == pytest.approx(own["wall"], rel=0.02), rank
        for phase in ("data", "compute", "metrics"):
            assert rank["shares"][phase] == pytest.approx(own["phases"][phase] / own["wall"], abs=0.05), (rank, phase)
        # The simulated GPU is busy while the rank is inside torch operators: the report reads the device's busy share,
        # and the device is busy only while the rank computes.
        device = own["device"]
        assert rank["utilization"] == pytest.approx(device["busy"] / device["wall"], abs=0.04), (rank, device)
        assert device["busy"] <= device["cpu"]["compute"] - device["idle"]["compute"] + 0.01 * device["wall"], device
    wall = max(own["wall"] for own in ranks.values())
    data = sum(own["phases"]["data"] for own in ranks.values()) / sum(own["wall"] for own in ranks.values())
    assert doc["wall_seconds"] == pytest.approx(wall, rel=0.02)
    for phase in ("data", "compute", "metrics"):
        share = sum(own["phases"][phase] for own in ranks.values()) / sum(own["wall"] for own in ranks.values())
        assert doc["shares"][phase] == pytest.approx(share, abs=0.05), phase
    assert doc["gpu_hours"] == pytest.approx(2 * doc["wall_seconds"] / 3600, rel=1e-3)
    assert doc["mean_utilization"] == pytest.approx(sum(r["utilization"] for r in doc["ranks"]) / 2, abs=1e-3)
    # Causes over time: input-bound (data) the longest, metrics-bound too; below target all along.
    causes = {c["cause"]: c for c in doc["causes"]}
    assert doc["main_cause"] == "input_bound" and set(causes) >= {"input_bound", "metrics_bound"}
    assert causes["input_bound"]["seconds"] >= 0.5 * wall and causes["input_bound"]["applied"]
    assert causes["input_bound"]["ranks"] == ["0", "1"]
    assert doc["gpu_hours_below_target"] == pytest.approx(doc["gpu_hours"], rel=1e-3)  # at ~17% all along
    # Projection: wall x (1 - data share), by the report's shares and by the loop's own timers.
    assert doc["projected_wall_seconds"] == pytest.approx(doc["wall_seconds"] * (1 - doc["shares"]["data"]), rel=1e-3)
    assert doc["projected_wall_seconds"] == pytest.approx(wall * (1 - data), abs=0.05 * wall)
    assert doc["projection"].endswith("if loading overlapped compute (input-bound (M1))")
    # The idle time in compute and between the phases, split as each point's verdict splits it: the parts add up to
    # it, over every point of both GPUs (all below target).
    idle = doc["idle"]
    assert idle["gpu_seconds"] >= wall and idle["idle"] == pytest.approx(
        idle["framework"] + idle["host"] + idle["launch"] + idle["unexplained"], abs=1e-3), idle
    # The ranks' compute is nearly all torch operators: on a quiet machine their samplers see no framework or host
    # code, and the exporter exports only parts above 0 s, so the report has no readings and says so (a loaded
    # machine lets some reads land in the loop's Python).
    if not idle["sampled"]:
        assert idle["framework"] == idle["host"] == 0 and "FO and HW unmeasured" in idle["text"], idle
    _keep("report.json", result.stdout)


def test_every_format_and_a_self_contained_html(recorded: tuple[str, dict[str, Any], Path]) -> None:
    prom, _, tmp = recorded
    text = _report(prom)
    assert text.returncode == 0, text.stderr
    assert "wall time" in text.stdout and "input-bound (M1):" in text.stdout and "projection" in text.stdout
    markdown = _report(prom, "--output", "markdown")
    assert markdown.stdout.startswith("### GPU report: run `mixed`\n") and "| input-bound (M1) |" in markdown.stdout
    page = tmp / "report.html"
    html = _report(prom, "--output", "html", "--out", str(page))
    assert html.returncode == 0 and html.stdout == "", html.stderr
    body = page.read_text()
    assert body.count("<svg") == 3 and "<polyline" in body and "<polygon" in body
    for remote in ("<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import"):
        assert remote not in body, remote  # nothing to fetch: it opens without a network
    for name, out in (("report.txt", text.stdout), ("report.md", markdown.stdout), ("report.html", body)):
        _keep(name, out)

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    shot = tmp / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1000,1250", page.as_uri()], capture_output=True, timeout=120, check=False)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000  # a rendered page, not a blank one
    _keep("report.png", data)


def test_range_and_bad_input(recorded: tuple[str, dict[str, Any], Path]) -> None:
    prom, _, _ = recorded
    whole = json.loads(_report(prom, "--output", "json").stdout)
    start = whole["start"]
    # The first half of the run, by --from/--to: about half the wall time, the same kind of run.
    half = json.loads(run_cli("report", "--prometheus-url", prom, "--run", "mixed", "--step", "1s",
                              f"--from={start}", f"--to={_plus(start, whole['wall_seconds'] / 2)}",
                              "--output", "json").stdout)
    # The report reads each rank's timers at the last sample at or before --to: the rank pushes every 0.5 s and
    # Prometheus scrapes every 1 s, so that sample lags --to by up to 1.5 s (more when the machine is loaded: the
    # pushes and scrapes slip), and never leads it. Before --from (the run's start) there is no sample.
    assert whole["wall_seconds"] / 2 - 2.5 <= half["wall_seconds"] <= whole["wall_seconds"] / 2 + 0.1, half
    assert half["shares"]["data"] == pytest.approx(whole["shares"]["data"], abs=0.08)
    missing = run_cli("report", "--prometheus-url", prom, "--run", "nope")
    assert (missing.returncode, missing.stderr) == (2, f"gpu-exporter: error: Prometheus at {prom} holds no training "
                                                       "run 'nope' in the last 30d: check the name (gpu_training_last"
                                                       "_push_timestamp_seconds{run=...}) or widen --lookback\n")
    bad = run_cli("report", "--prometheus-url", prom, "--run", "mixed", "--from", "soon")
    assert (bad.returncode, bad.stderr) == (2, "gpu-exporter: error: --from: 'soon' is not a time: use now, -2h "
                                               "(before now), Unix seconds or 2026-12-03T05:00:00Z\n")


def _plus(stamp: str, seconds: float) -> str:
    from gpu_exporter.commands.client_cli import iso, parse_time
    return iso(parse_time(stamp, "t") + seconds)


def test_a_reused_name_reports_each_launch_alone(stack: tuple[str, str, Path]) -> None:
    """Issue 28: two 6 s launches of one name on one GPU and rank, one right after the other, the second 70% data.
    Each report (by run id; by name: the latest, with a note) covers that launch only: its own range, wall time
    within 2% of its own timers, its own data share, one GPU. Before run ids, the second one's report subtracted
    the first one's final totals and read wall 14.0 s, data 100% for a 20.1 s run at 70% data."""
    exporter, prom, tmp = stack
    uuid, own = GPUS[1], []
    for i, share in enumerate((0.2, 0.7)):
        out = tmp / f"reused{i}.json"
        loop = subprocess.run([sys.executable, str(REUSED), "nightly", exporter, uuid, "6", str(share), str(out)],
                              env=exporter_env(), capture_output=True, text=True, timeout=60, check=False)
        assert loop.returncode == 0, loop.stderr[-2000:]
        timers = json.loads(out.read_text())
        own.append(timers)
        final = (f'max(gpu_training_current_phase{{run="nightly"}}) == 0 '
                 f'and on() gpu_training_run_info{{run_id="{timers["run_id"]}"}}')
        wait_until(lambda q=final: promql(prom, q), 20, what=f"launch {i}'s last snapshot in Prometheus")
    assert own[0]["run_id"] != own[1]["run_id"]
    for timers in own:
        result = run_cli("report", "--prometheus-url", prom, "--run-id", timers["run_id"], "--step", "1s",
                         "--output", "json")
        assert result.returncode == 0 and result.stderr == "", result.stderr
        doc = json.loads(result.stdout)
        assert (doc["run"], doc["run_id"], doc["gpus"]) == ("nightly", timers["run_id"], [uuid])
        assert [(r["rank"], r["uuid"]) for r in doc["ranks"]] == [("0", uuid)]
        assert doc["wall_seconds"] == pytest.approx(timers["wall"], rel=0.02)
        assert doc["shares"]["data"] == pytest.approx(timers["phases"]["data"] / timers["wall"], abs=0.03)
        assert doc["shares"]["compute"] == pytest.approx(timers["phases"]["compute"] / timers["wall"], abs=0.03)
    first, second = (json.loads(run_cli("report", "--prometheus-url", prom, "--run-id", t["run_id"],
                                        "--output", "json").stdout) for t in own)
    assert first["end"] <= second["start"]  # each its own range
    by_name = run_cli("report", "--prometheus-url", prom, "--run", "nightly", "--step", "1s", "--output", "json")
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["run_id"] == own[1]["run_id"]
    assert by_name.stderr == (f"gpu-exporter: note: run name 'nightly' was reused by 2 launches in the last 30d; this "
                              f"is the latest, run id {own[1]['run_id']} (started {second['start']}); earlier: "
                              f"{own[0]['run_id']} ({first['start']}): pick one with --run-id\n")
    _keep("reused-name.json", json.dumps({"timers": own, "reports": [first, second], "note": by_name.stderr},
                                         indent=2))


def test_fleet_report_and_list_of_runs(stack: tuple[str, str, Path]) -> None:
    """Issue 28: two teams (tag team), one of them twice under one name, and a GPU no run reports. Over their
    range, the fleet report's GPU-hours by team and by cause match the jobs' own timers within 5%, the
    uninstrumented GPU's hours (and its idle share, 60%) are counted as "not instrumented", the money is idle
    GPU-hours x the price of the model, and ``--list`` shows the three launches with their tags."""
    exporter, prom, tmp = stack
    # Every GPU's busy rate over the report's window (4 steps) is there: the range starts with data.
    wait_until(lambda: len(promql(prom, "rate(gpu_busy_seconds_total[4s])")) == 3, 20, what="4 s of scrapes")
    start = time.time()

    def job(name: str, uuid: str, seconds: float, share: float, team: str, out: Path) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(REUSED), name, exporter, uuid, str(seconds), str(share), str(out)],
                                # no stack sampling: its compute is a sleep in its own code, which the sampler
                                # rightly calls host work (HW); this test is about the fleet's accounting of M1/M3
                                env=exporter_env({"GPU_EXPORTER_TAGS": f"team={team},user=ana",
                                                  "GPU_EXPORTER_STACK_SAMPLING_HZ": "0"}),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # vision: 10 s, 70% data (input-bound, M1); nlp: twice 5 s under one name, 80% compute on an idle GPU (M3).
    vision = job("fleet-vision", GPUS[0], 10, 0.7, "vision", tmp / "vision.json")
    for i in range(2):  # the next launch once Prometheus scraped the last snapshot of this one
        nlp = job("fleet-nlp", GPUS[1], 5, 0.2, "nlp", tmp / f"nlp{i}.json")
        assert nlp.wait(60) == 0, nlp.communicate()[1][-2000:]
        last = (f'max(gpu_training_current_phase{{run="fleet-nlp"}}) == 0 and on() gpu_training_run_info'
                f'{{run_id="{json.loads((tmp / f"nlp{i}.json").read_text())["run_id"]}"}}')
        wait_until(lambda q=last: promql(prom, q), 20, what=f"launch {i}'s last snapshot in Prometheus")
    assert vision.wait(60) == 0, vision.communicate()[1][-2000:]
    own = {path.stem: json.loads(path.read_text()) for path in (tmp / "vision.json", tmp / "nlp0.json",
                                                                 tmp / "nlp1.json")}
    ids = "|".join(t["run_id"] for t in own.values())
    wait_until(lambda: len(promql(prom, f'max by (run_id) (gpu_training_run_info{{run_id=~"{ids}"}}) and on() '
                                        'max(gpu_training_current_phase{run=~"fleet-.*"}) == 0')) >= 1,
               20, what="the fleet jobs' last snapshots in Prometheus")
    time.sleep(1.5)
    end = time.time()
    prices = tmp / "prices.yaml"
    prices.write_text(PRICES)
    span = ["--from", str(round(start, 3)), "--to", str(round(end, 3)), "--step", "1s"]
    result = run_cli("report", "--prometheus-url", prom, "--fleet", *span, "--prices", str(prices), "--output", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    _keep("fleet.json", result.stdout)
    seconds = doc["gpu_hours"] * 3600
    assert seconds == pytest.approx(3 * (end - start), rel=0.05), doc
    team = {row["team"]: row["gpu_hours"] * 3600 for row in doc["by_team"]}
    cause = {row["verdict"]: row for row in doc["by_cause"]}
    nlp = own["nlp0"]["wall"] + own["nlp1"]["wall"]
    assert team["vision"] == pytest.approx(own["vision"]["wall"], rel=0.05), (team, own)
    assert team["nlp"] == pytest.approx(nlp, rel=0.05), (team, own)
    assert cause["input_bound"]["gpu_hours_below_target"] * 3600 == pytest.approx(own["vision"]["wall"], rel=0.05), doc
    assert cause["batch_too_small"]["gpu_hours_below_target"] * 3600 == pytest.approx(nlp, rel=0.05)
    # The GPU no run reports: all of its time, "not instrumented", 60% of it idle.
    a100 = {row["model"]: row for row in doc["by_model"]}["NVIDIA A100-SXM4-80GB"]
    assert a100["gpu_hours"] * 3600 == pytest.approx(end - start, rel=0.05)
    assert cause["not_instrumented"]["gpu_hours"] * 3600 == pytest.approx(end - start, rel=0.05)
    assert cause["not_instrumented"]["idle_gpu_hours_below_target"] == pytest.approx(
        0.6 * cause["not_instrumented"]["gpu_hours"], rel=0.05)
    # The jobs' GPUs between their runs: a process holds them, nothing runs.
    assert cause["idle_but_allocated"]["gpu_hours"] * 3600 == pytest.approx(
        2 * (end - start) - own["vision"]["wall"] - nlp, rel=0.1, abs=2.0)
    h100 = sum(row["idle_gpu_hours_below_target"] for row in doc["by_model"] if row["model"] != a100["model"])
    assert doc["money_lost"] == pytest.approx(4.0 * h100 + 2.0 * a100["idle_gpu_hours_below_target"], rel=1e-3)
    who = {o["who"]: o for o in doc["offenders"]}
    assert any(w.startswith(f"GPU {UNINSTRUMENTED} on ") for w in who), who
    assert all(o["remedy"] for o in doc["offenders"])
    by_team = run_cli("report", "--prometheus-url", prom, "--fleet", *span, "--team", "vision", "--output", "json")
    assert json.loads(by_team.stdout)["gpu_hours"] * 3600 == pytest.approx(own["vision"]["wall"], rel=0.05)

    listed = run_cli("report", "--prometheus-url", prom, "--list", *span, "--output", "json")
    assert listed.returncode == 0, listed.stderr
    runs = {r["run_id"]: r for r in json.loads(listed.stdout)["runs"]}
    assert set(runs) == {t["run_id"] for t in own.values()}, runs
    for name, timers in own.items():
        row = runs[timers["run_id"]]
        assert row["run"] == ("fleet-vision" if name == "vision" else "fleet-nlp")
        assert row["tags"] == {"team": "vision" if name == "vision" else "nlp", "user": "ana"}
        assert row["wall_seconds"] == pytest.approx(timers["wall"], rel=0.02)
        assert row["main_cause"] == ("input_bound" if name == "vision" else "batch_too_small")
    text = run_cli("report", "--prometheus-url", prom, "--list", *span)
    assert text.returncode == 0 and "team=vision,user=ana" in text.stdout and "team=nlp,user=ana" in text.stdout
    fleet_text = run_cli("report", "--prometheus-url", prom, "--fleet", *span, "--prices", str(prices))
    assert fleet_text.returncode == 0 and "money lost" in fleet_text.stdout, fleet_text.stderr
    markdown = run_cli("report", "--prometheus-url", prom, "--fleet", *span, "--output", "markdown")
    assert markdown.stdout.startswith("### GPU fleet report\n"), markdown.stderr
    bad = tmp / "bad-prices.yaml"
    bad.write_text("currency: EUR\ngpu_hour:\n  default: cheap\n")
    refused = run_cli("report", "--prometheus-url", prom, "--fleet", *span, "--prices", str(bad))
    assert (refused.returncode, refused.stderr) == (2, f"gpu-exporter: error: --prices: {bad}:3: the price of "
                                                       "'default' must be a number of EUR per GPU-hour (0 or more), "
                                                       "not 'cheap'\n")
    page = run_cli("report", "--prometheus-url", prom, "--fleet", *span, "--prices", str(prices), "--output", "html")
    assert page.returncode == 0 and page.stdout.count("<svg") == 3, page.stderr
    for remote in ("<script", "<link", "<img", "src=", "href=", "url("):
        assert remote not in page.stdout, remote
    for name, out in (("fleet.txt", fleet_text.stdout), ("fleet.md", markdown.stdout),
                      ("fleet.html", page.stdout), ("runs.txt", text.stdout), ("runs.json", listed.stdout),
                      ("fleet-span.txt", " ".join([prom, *span])), ("fleet-timers.json", json.dumps(own, indent=2))):
        _keep(name, out)


def test_diagnose_judges_the_latest_launch_of_a_name(stack: tuple[str, str, Path]) -> None:
    """``diagnose --run NAME`` with two live launches of one name on two GPUs (two unrelated jobs, both named
    ``shared``): only the latest is judged, with a one-line note; ``--run-id`` picks either. From the exporter
    and from Prometheus."""
    exporter, prom, _ = stack
    now = time.time()
    for uuid, run_id, started in ((GPUS[0], "older-job", now - 300), (GPUS[1], "newer-job", now - 60)):
        body = {"version": 1, "run": "shared", "run_id": run_id, "rank": "0", "uuid": uuid, "started_at": started,
                "phases": {"data": 1.0, "compute": 2.0, "other": 0.1}, "current_phase": "compute", "steps": 3,
                "samples": 24, "batch_size": 8, "tags": {"team": run_id.split("-")[0]}}
        status, reason = http_status(exporter + "/api/v1/training", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        assert status == 202, reason
    wait_until(lambda: len(promql(prom, 'gpu_training_run_start_timestamp_seconds{run="shared"}')) == 2, 20,
               what="both launches in Prometheus")
    info = {r["metric"]["run_id"]: r["metric"].get("tag_team")
            for r in promql(prom, 'gpu_training_run_info{run="shared"}')}
    assert info == {"older-job": "older", "newer-job": "newer"}
    note = ("gpu-exporter: note: run name 'shared' is used by 2 live launches; judging the latest, run id newer-job; "
            "the others: older-job: pick one with --run-id\n")
    for source in (["--url", exporter, "--window", "1s"], ["--prometheus-url", prom, "--window", "30s"]):
        by_name = run_cli("diagnose", *source, "--run", "shared", "--output", "json")
        assert by_name.returncode in (0, 1) and by_name.stderr.endswith(note), by_name.stderr
        assert [g["uuid"] for g in json.loads(by_name.stdout)["gpus"]] == [GPUS[1]]
        by_id = run_cli("diagnose", *source, "--run-id", "older-job", "--output", "json")
        assert by_id.returncode in (0, 1) and "note:" not in by_id.stderr, by_id.stderr
        assert [(g["uuid"], [r["run"] for r in g["runs"]]) for g in json.loads(by_id.stdout)["gpus"]] == \
            [(GPUS[0], ["shared"])]
