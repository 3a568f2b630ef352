"""A real `gpu-exporter` process on simulated GPUs, scraped over HTTP; startup errors."""

from __future__ import annotations

import ctypes.util
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testbed import exporter_env, free_port, http_get, http_status, run_exporter

pytestmark = pytest.mark.slow  # end-to-end: real processes


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    with run_exporter(["--simulate", "--poll-interval", "0.2"]) as url:
        yield url


def test_metrics_parse_and_cover_every_gpu(exporter: str) -> None:
    text = http_get(exporter + "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["gpu"] for s in families["gpu_info"].samples} == {"0", "1", "2", "3"}
    assert families["gpu_busy_seconds"].type == "counter"
    assert families["gpu_exporter_gpus"].samples[0].value == 4
    for family in families.values():
        for sample in family.samples:
            assert "hostname" not in sample.labels and "job" not in sample.labels


def test_promtool_check_metrics_accepts_a_real_scrape(exporter: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run the README's test command"
    text = http_get(exporter + "/metrics")
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_health_endpoints(exporter: str) -> None:
    assert http_status(exporter + "/healthz") == (200, "ok\n")
    status, body = http_status(exporter + "/readyz")
    assert status == 200 and body.startswith("ok")
    assert http_status(exporter + "/")[0] == 200
    assert http_status(exporter + "/nope")[0] == 404
    assert http_status(exporter + "/api/v1/nope", data=b"{}")[0] == 404


def test_busy_counter_advances_between_scrapes(exporter: str) -> None:
    def busy() -> float:
        fams = text_string_to_metric_families(http_get(exporter + "/metrics"))
        return next(s.value for f in fams for s in f.samples if s.name == "gpu_busy_seconds_total"
                    and s.labels["gpu"] == "0")
    first = busy()
    time.sleep(1.0)
    assert busy() > first


def test_custom_telemetry_path_and_config_file(tmp_path: object) -> None:
    from pathlib import Path

    cfg = Path(str(tmp_path)) / "c.yaml"
    cfg.write_text("web:\n  telemetry_path: /gpu-metrics\npoll_interval: 0.5\n")
    with run_exporter(["--simulate", "--config", str(cfg)]) as url:
        assert "gpu_info" in http_get(url + "/gpu-metrics")
        assert http_status(url + "/metrics")[0] == 404


def _run_cli(args: list[str], timeout: float = 30) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", *args], capture_output=True, text=True,
                          env=exporter_env(), timeout=timeout)
    return proc.returncode, proc.stderr.strip(), time.monotonic() - started


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver")
def test_without_driver_exits_fast_with_one_sentence() -> None:
    code, err, elapsed = _run_cli(["--web.listen-address", f"127.0.0.1:{free_port()}"])
    assert code == 1
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "NVIDIA driver was not found" in lines[0] and "--simulate" in lines[0]
    assert elapsed < 10


def test_address_in_use_is_one_sentence() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err, _ = _run_cli(["--simulate", "--web.listen-address", f"127.0.0.1:{port}"])
    assert code == 1
    assert err.splitlines()[-1] == (f"gpu-exporter: error: cannot listen on 127.0.0.1:{port}: the address is "
                                   "already in use; stop the other process or choose another with "
                                   "--web.listen-address")
    assert len(err.splitlines()) == 1, err


def test_bad_scenario_is_one_line_exit_2(tmp_path: object) -> None:
    from pathlib import Path

    bad = Path(str(tmp_path)) / "bad.yaml"
    bad.write_text("gpus:\n  - name: x\n    architecture: pentium\n    memory_gib: 8\n")
    code, err, _ = _run_cli(["--simulate", str(bad)])
    assert code == 2
    assert len(err.splitlines()) == 1 and "architecture" in err and "bad.yaml" in err, err


def test_sigterm_stops_cleanly() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpu_exporter", "--simulate", "--web.listen-address",
                             f"127.0.0.1:{port}"], env=exporter_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if http_status(f"http://127.0.0.1:{port}/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        proc.terminate()
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()


def test_web_config_headers_are_sent(tmp_path: object) -> None:
    import urllib.request
    from pathlib import Path

    web = Path(str(tmp_path)) / "web.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    with run_exporter(["--simulate", "--web.config.file", str(web)]) as url, \
            urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        assert resp.headers["X-Frame-Options"] == "deny"
