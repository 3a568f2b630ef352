"""The live status page at ``/``: rendered by a real exporter, drawn by a real headless Chromium.

tests/scenarios/status-page.yaml holds an input-bound GPU, a healthy one, one idle but allocated
and an unused one; a thread pushes training snapshots for the first two, as the library does.
The browser test loads the page, lets its script poll the JSON, dumps the DOM and takes the
screenshot that docs/screenshots/ and the README show (set GPU_EXPORTER_SCREENSHOTS=DIR to write
them there).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
from gpu_exporter import status_page
from gpu_exporter.status_page import STATUS_PATH, StatusPage
from gpu_exporter.thresholds import load_thresholds

from testbed import http_get, http_status, run_exporter, wait_until

SCENARIO = Path(__file__).parent / "scenarios" / "status-page.yaml"
STANDARD = ("data", "compute", "metrics", "checkpoint", "communication", "other")
RUNS = {  # uuid -> (run, phase shares)
    "GPU-page-input": ("loader", (0.70, 0.22, 0.03, 0.0, 0.0, 0.05)),
    "GPU-page-healthy": ("bert", (0.02, 0.93, 0.01, 0.0, 0.02, 0.02)),
}
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars")


def push_runs(url: str, stop: threading.Event, headers: dict[str, str]) -> None:
    """Push a snapshot of every run in RUNS every 0.2 s until ``stop`` is set."""
    started = time.time()
    while not stop.is_set():
        elapsed = time.time() - started
        for uuid, (run, shares) in RUNS.items():
            body = {"version": 1, "run": run, "rank": "0", "uuid": uuid, "started_at": started - 60,
                    "phases": {p: s * elapsed for p, s in zip(STANDARD, shares, strict=True)},
                    "current_phase": "data" if shares[0] > 0.5 else "compute", "steps": int(elapsed * 10),
                    "samples": int(elapsed * 320), "batch_size": 32, "finished": False}
            req = urllib.request.Request(url + "/api/v1/training", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", **headers})
            with urllib.request.urlopen(req, timeout=5) as resp:
                assert resp.status == 202
        stop.wait(0.2)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A running exporter on status-page.yaml behind basic auth, its runs pushing; (url, auth header)."""
    directory = tmp_path_factory.mktemp("page")
    web = directory / "web.yml"
    hashed = bcrypt.hashpw(b"page-secret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"basic_auth_users:\n  viewer: '{hashed}'\n")
    auth = {"Authorization": "Basic " + base64.b64encode(b"viewer:page-secret").decode()}
    with run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.5", "--web.config.file", str(web)]
                      ) as url:
        stop = threading.Event()
        thread = threading.Thread(target=push_runs, args=(url, stop, {}), daemon=True)
        thread.start()
        try:
            wait_until(lambda: http_get(url + "/metrics", headers=auth).count("gpu_training_batch_size{") == 2, 15,
                       what="both runs to be pushed")
            # the page averages over the readings it has seen: give it a few seconds of them
            for _ in range(4):
                http_get(url + STATUS_PATH, headers=auth)
                time.sleep(1.1)
            yield url, auth
        finally:
            stop.set()
            thread.join()


@pytest.mark.slow
def test_status_json_judges_each_gpu_like_diagnose(node: tuple[str, dict[str, str]]) -> None:
    url, auth = node
    doc = json.loads(http_get(url + STATUS_PATH, headers=auth))
    t = load_thresholds()
    assert doc["thresholds"] == {"utilization_low_threshold": t.utilization_low_threshold,
                                 "utilization_target": t.utilization_target, "sm_active_low": t.sm_active_low}
    assert doc["measured_seconds"] >= 3  # a mean over seconds of readings, not the last poll
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    verdicts = {uuid: (g["verdict"]["verdict"], g["verdict"]["code"]) for uuid, g in gpus.items()}
    assert verdicts["GPU-page-input"] == ("input_bound", "M1")
    assert verdicts["GPU-page-healthy"][0] == "healthy"
    assert verdicts["GPU-page-idle"][0] == "idle_but_allocated"
    assert verdicts["GPU-page-free"][0] == "unused"
    loader = gpus["GPU-page-input"]
    assert loader["utilization"] == pytest.approx(0.18, abs=0.05)
    assert loader["verdict"]["remedy"] and loader["verdict"]["runbook"].startswith("http")
    (run,) = loader["runs"]
    assert run["run"] == "loader" and dict(run["phases"])["data"] == pytest.approx(0.70, abs=0.05)
    (bert,) = gpus["GPU-page-healthy"]["runs"]  # every standard phase, in the training protocol's order
    assert [p for p, _ in bert["phases"]] == list(STANDARD), bert
    assert [p["pid"] for p in gpus["GPU-page-idle"]["processes"]] == ["52003"]
    assert gpus["GPU-page-idle"]["memory_used_ratio"] == pytest.approx(30 / 80)
    # effective utilization beside busy: the Hopper GPUs' SM activity from GPM (never above busy), the A100s none
    for uuid in ("GPU-page-input", "GPU-page-healthy"):
        g = gpus[uuid]
        assert g["sm_source"] == "gpm" and 0 < g["sm_active"] <= g["utilization"] + 0.05, g
    for uuid in ("GPU-page-idle", "GPU-page-free"):
        assert gpus[uuid]["sm_active"] is None and gpus[uuid]["sm_source"] is None


@pytest.mark.slow
def test_page_is_behind_the_same_auth_as_metrics(node: tuple[str, dict[str, str]]) -> None:
    url, auth = node
    for path in ("/metrics", "/", STATUS_PATH):
        assert http_status(url + path)[0] == 401, path
        assert http_status(url + path, headers={"Authorization": "Basic " + base64.b64encode(b"viewer:no").decode()}
                           )[0] == 401, path
    status, body = http_status(url + "/", headers=auth)
    assert status == 200 and "<main id=\"gpus\"" in body
    # server-rendered: the verdicts are in the HTML before any script runs, and no external asset is referenced
    assert "input-bound" in body and "idle but allocated" in body
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", body.split("<script>")[0].replace(
        load_thresholds().runbook_url("").split("#")[0], "")), "the page loads nothing from elsewhere"


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("Debian package chromium is missing: bash tests/run.sh installs it")
    return found


def _browser(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_headless_chromium_renders_and_updates_the_page(node: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, auth = node
    user_pass = base64.b64decode(auth["Authorization"].split()[1]).decode()
    page_url = url.replace("http://", f"http://{user_pass}@") + "/"
    # --virtual-time-budget lets the page's timers run (its script polls every 2 s) before the DOM is dumped
    dom = _browser(["--virtual-time-budget=7000", "--dump-dom", page_url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout.split("<script>")[0]  # the drawn DOM, not the script's own text
    polls = re.search(r'<body[^>]*data-polls="(\d+)"', html)
    assert polls is not None and int(polls.group(1)) >= 1, "the script did not poll the JSON: " + html[:3000]
    updated = re.search(r'<span id="updated">([^<]*)</span>', html)
    assert updated is not None and re.match(r"updated \d", updated.group(1)), updated
    cards = re.findall(r'<section class="gpu" data-uuid="([^"]+)"', html)
    assert cards == ["GPU-page-input", "GPU-page-healthy", "GPU-page-idle", "GPU-page-free"]
    assert re.search(r'class="verdict input_bound bad".*?<span class="code">M1</span>', html, re.S)
    assert 'class="verdict healthy"' in html and 'class="verdict idle_but_allocated bad"' in html
    assert "run <b>loader</b>" in html and re.search(r"</i>data 7\d%", html)  # data 70% +- the window's edges
    legend = re.search(r"run <b>bert</b>.*?<span class=\"legend\">(.*?)</span>", html, re.S)
    assert legend is not None and re.findall(r'<i class="ph (\w+)"></i>', legend.group(1)) == list(STANDARD), legend
    # the effective-utilization row of each card: SM activity from GPM on the H100s, unknown on the A100s
    rows = dict(re.findall(r'<section class="gpu" data-uuid="([^"]+)".*?<div class="row sm">(.*?)</small></div>', html,
                           re.S))
    assert re.search(r'<b class="num">\d+%</b></div><div class="row sm-note"><small>SM activity \(GPM\)',
                     rows["GPU-page-healthy"]), rows
    assert "SM activity unknown" in rows["GPU-page-idle"] and "SM activity unknown" in rows["GPU-page-free"]
    assert "SM activity unknown" not in rows["GPU-page-input"]

    out = Path(os.environ.get("GPU_EXPORTER_SCREENSHOTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    shot = out / "status-page.png"
    taken = _browser(["--virtual-time-budget=5000", "--window-size=1280,720", f"--screenshot={shot}", page_url],
                     tmp_path / "profile-shot")
    assert taken.returncode == 0, taken.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a real, non-blank picture


def test_page_is_rendered_from_the_collectors_families_alone(tmp_path: Path) -> None:
    """StatusPage reads nothing but the metric families the collectors hold: no NVML, no driver, no exporter."""
    from prometheus_client.parser import text_string_to_metric_families

    gib = 2 ** 30
    text = ("gpu_info{gpu=\"0\",uuid=\"GPU-x\",name=\"T\",pci_bus_id=\"0\",driver_version=\"1\"} 1\n"
            "gpu_busy_seconds_total{gpu=\"0\",uuid=\"GPU-x\"} %s\n"
            "gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-x\"} 0.5\n"
            f"gpu_memory_used_bytes{{gpu=\"0\",uuid=\"GPU-x\"}} {30 * gib}\n"
            f"gpu_memory_total_bytes{{gpu=\"0\",uuid=\"GPU-x\"}} {80 * gib}\n"
            f"gpu_process_memory_used_bytes{{gpu=\"0\",uuid=\"GPU-x\",pid=\"7\",process_name=\"nb\"}} {30 * gib}\n"
            "gpu_exporter_last_sample_age_seconds 0\n")
    clock = [100.0]
    busy = [0.0]
    page = StatusPage(lambda: text_string_to_metric_families(text % busy[0]), load_thresholds(),
                      clock=lambda: clock[0], wall=lambda: 0.0)
    first = page.status()
    assert first["measured_seconds"] == 0 and first["gpus"][0]["utilization"] == 0.5  # the last poll's mean
    clock[0], busy[0] = 100.5, 0.0
    assert page.status() is first  # within REFRESH_SECONDS: the cached answer, nothing re-read
    clock[0], busy[0] = 110.0, 0.0
    doc: dict[str, Any] = page.status()
    assert doc["measured_seconds"] == 10 and doc["gpus"][0]["utilization"] == 0.0
    assert doc["gpus"][0]["verdict"]["verdict"] == "idle_but_allocated"
    html = page.html().decode()
    assert "<script>" in html and "{{" not in html and "idle but allocated" in html
    embedded = re.search(r'<script id="status-doc" type="application/json">(.*?)</script>', html, re.S)
    assert embedded is not None and json.loads(embedded.group(1))["gpus"][0]["processes"][0]["name"] == "nb"
    t = load_thresholds()
    assert doc["levels"] == [{"level": "low", "key": "utilization_low_threshold", "below": t.utilization_low_threshold},
                             {"level": "target", "key": "utilization_target", "below": t.utilization_target}]
    assert "pynvml" not in Path(status_page.__file__).read_text()


_ONE_GPU = ("gpu_info{gpu=\"0\",uuid=\"GPU-x\",name=\"T\",pci_bus_id=\"0\",driver_version=\"1\"} 1\n"
            "gpu_busy_seconds_total{gpu=\"0\",uuid=\"GPU-x\"} %s\n"
            "gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-x\"} 0.5\n"
            "gpu_exporter_last_sample_age_seconds 0\n")


def test_an_unvisited_page_still_judges_the_last_window() -> None:
    """Busy 30 s, then idle 30 s with nobody looking: the next view judges the idle window, not the minute."""
    from prometheus_client.parser import text_string_to_metric_families

    clock = [100.0]

    def busy() -> float:  # fully busy from 100 to 130 s, idle after
        return min(clock[0], 130.0) - 100.0

    page = StatusPage(lambda: text_string_to_metric_families(_ONE_GPU % busy()), load_thresholds(),
                      clock=lambda: clock[0], wall=lambda: 0.0)
    assert page.status()["measured_seconds"] == 0  # the first view: one reading
    while clock[0] < 160.0:  # the poller records after each one-second poll; nobody views the page
        clock[0] += 1.0
        page.record()
    doc = page.status()
    window = doc["window_seconds"]
    assert window - status_page.RECORD_SECONDS <= doc["measured_seconds"] <= window  # not the 60 s since the view
    assert doc["gpus"][0]["utilization"] == 0.0  # the idle half alone (over 60 s it would read 0.5)


def test_a_view_after_a_gap_in_readings_does_not_average_over_the_gap() -> None:
    """No reading for longer than the window (polls stopped): the view judges the last poll, not the gap."""
    from prometheus_client.parser import text_string_to_metric_families

    clock = [100.0]
    page = StatusPage(lambda: text_string_to_metric_families(_ONE_GPU % (clock[0] - 100.0)), load_thresholds(),
                      clock=lambda: clock[0], wall=lambda: 0.0)
    page.status()
    clock[0] = 100.0 + 3 * status_page.WINDOW_SECONDS
    doc = page.status()
    assert doc["measured_seconds"] == 0 and doc["gpus"][0]["utilization"] == 0.5  # the last poll's own mean
