"""End to end: real processes standing in for uninstrumented GPU jobs -> real exporter (--simulate, the
scenario's GPU processes are the stand-ins' real pids) -> real Prometheus with the shipped rules ->
the evidence verdict from the alert and from both diagnose paths.

=========  ====================================================  ======================================
GPU        the process on it (tests/evidence_standins.py)         expected verdict
=========  ====================================================  ======================================
GPU-cpu    main process in a busy loop, no worker                 not instrumented: likely input-bound (M1)
GPU-io     main process reading 8 MiB O_DIRECT chunks (state D)   ... likely input-bound on storage (M1)
=========  ====================================================  ======================================

The busy loop's main thread is runnable (state R) all the time even when a loaded machine gives it
less than a core, and the O_DIRECT reads keep the other one in disk wait, so the shipped thresholds
hold here. Windows are shrunk 60-fold as in test_causes_e2e. EVIDENCE_E2E_OUTPUT=DIR keeps the outputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import keep_output, run_clis, shipped_fast_rules
from evidence_standins import direct_io_works

from testbed import http_get, promql, run_exporter, run_prometheus, scrape_config, wait_until

pytestmark = pytest.mark.slow

STANDINS = Path(__file__).with_name("evidence_standins.py")
EXPECTED = {"GPU-cpu": ("main_busy", "not instrumented: likely input-bound (M1)"),
            "GPU-io": ("storage_wait", "not instrumented: likely input-bound on storage (M1)")}


def _keep(name: str, text: str) -> None:
    keep_output("EVIDENCE_E2E_OUTPUT", name, text)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str]]:
    """Stand-ins, exporter and Prometheus with the shipped rules; yields (exporter, prom)."""
    files = shipped_fast_rules()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        data = d / "data.bin"
        if not direct_io_works(data):
            pytest.skip(f"{tmp} does not take O_DIRECT reads: no process can be held in disk wait here")
        standins = {"GPU-cpu": subprocess.Popen([sys.executable, str(STANDINS), "cpu", "300"]),
                    "GPU-io": subprocess.Popen([sys.executable, str(STANDINS), "io", "300", str(data)])}
        gpus = "".join(f"  - {{name: NVIDIA A100-SXM4-80GB, architecture: ampere, memory_gib: 80, uuid: {uuid}, "
                       f"utilization: {{constant: 0.05}}, "
                       f"processes: [{{pid: {p.pid}, name: python, memory_gib: 20}}]}}\n"
                       for uuid, p in standins.items())
        scenario = d / "evidence.yaml"
        scenario.write_text("gpus:\n" + gpus)
        try:
            with run_exporter(["--simulate", str(scenario), "--poll-interval", "0.2"]) as exporter, \
                    run_prometheus(scrape_config(exporter, "evidence-node"), files) as prom:
                yield exporter, prom
        finally:
            for p in standins.values():
                p.terminate()
                p.wait(timeout=30)


def test_uninstrumented_jobs_get_their_evidence_verdict(stack: tuple[str, str]) -> None:
    exporter, prom = stack

    def firing() -> dict[str, str] | None:
        got = {r["metric"]["uuid"]: r["metric"]["hint"] for r in
               promql(prom, 'ALERTS{alertname="GpuUninstrumentedInputBound", alertstate="firing"}')}
        return got if all(got.get(u) == h for u, (h, _) in EXPECTED.items()) else None
    try:
        wait_until(firing, 120, interval=1.0, what="GpuUninstrumentedInputBound for both stand-ins")
    except TimeoutError as err:
        seen = [(r["metric"].get("uuid"), r["metric"].get("state"), r["value"][1]) for r in
                promql(prom, "process:gpu_process_main_thread_state:share5m")]
        raise AssertionError(f"{err}: readings {seen}") from None
    _keep("alerts.json", http_get(prom + "/api/v1/alerts"))

    # Every call at once (run_clis): each --url one still judges its own 4 s window.
    sources: tuple[tuple[str, str, list[str]], ...] = (("url", exporter, ["--window", "4s"]), ("prometheus", prom, []))
    calls = [["diagnose", "--url" if flag == "url" else "--prometheus-url", source, *extra, *tail]
             for flag, source, extra in sources for tail in (["--output", "json"], [])]
    results = iter(run_clis(calls))
    for flag, _, _ in sources:
        result = next(results)
        assert result.returncode == 1, result.stderr
        gpus = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
        for uuid, (hint, title) in EXPECTED.items():
            got = gpus[uuid]
            assert got["evidence_hint"] == hint and got["verdict"]["title"] == title, (flag, got["evidence"],
                                                                                        got["verdict"])
            assert got["verdict"]["verdict"] == "not_instrumented" and got["verdict"]["code"] == "M1"
            (proc,) = got["evidence"]
            if uuid == "GPU-cpu":
                assert proc["states"]["running"] >= 0.8 and proc["child_processes"] == 0, proc
            else:
                assert proc["states"]["disk"] > 0.2 and proc["read_bytes_per_second"] > 0, proc
            assert f"pid {proc['pid']}" in got["verdict"]["reason"]
        text = next(results)
        _keep(f"diagnose-{flag}.txt", text.stdout)
        assert "likely input-bound on storage (M1)" in text.stdout and "worker process" in text.stdout
