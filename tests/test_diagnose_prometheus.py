"""``gpu-exporter diagnose --prometheus-url``: the same verdicts from a real Prometheus, filters, errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from servers import promql, run_exporter, run_prometheus, wait_until
from test_diagnose import EXPECTED, RUNS, SCENARIOS, push_runs
from test_query import run_cli


def _scrape_config(exporter_url: str) -> str:
    return f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: gpu-exporter
    static_configs:
      - targets: ["{urlsplit(exporter_url).netloc}"]
        labels: {{node: node-a}}
"""


@pytest.fixture(scope="module")
def prometheus() -> Iterator[str]:
    """Prometheus scraping an exporter on diagnose-node.yaml every second, with the training runs pushing."""
    with run_exporter(["--simulate", str(SCENARIOS / "diagnose-node.yaml"), "--poll-interval", "0.2"]) as exporter:
        stop = threading.Event()
        thread = threading.Thread(target=push_runs, args=(exporter, stop), daemon=True)
        thread.start()
        try:
            with run_prometheus(_scrape_config(exporter)) as prom:
                wait_until(lambda: len(promql(prom, "increase(gpu_training_phase_seconds_total[10s]) > 0"))
                           >= 4 * len(RUNS) and promql(prom, "count_over_time(gpu_info[10s]) > 7"), 30,
                           what="eight scrapes with training runs")
                yield prom
        finally:
            stop.set()
            thread.join()


def test_same_verdicts_as_from_the_exporter(prometheus: str) -> None:
    result = run_cli("diagnose", "--prometheus-url", prometheus, "--window", "5s", "--output", "json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert {g["uuid"]: g["verdict"]["verdict"] for g in doc["gpus"]} == EXPECTED
    assert {g["node"] for g in doc["gpus"]} == {"node-a"}
    assert doc["window_seconds"] == 5.0 and doc["gpus_below_target"] == 7
    loader = next(g for g in doc["gpus"] if g["uuid"] == "GPU-diag-input")
    assert loader["utilization"] == pytest.approx(0.15, abs=0.02)
    assert loader["runs"][0]["shares"]["data"] == pytest.approx(0.6, abs=0.05)


def test_node_and_run_filters(prometheus: str) -> None:
    result = run_cli("diagnose", "--prometheus-url", prometheus, "--window", "5s", "--node", "node-a",
                     "--run", "loader")
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("GPU 1  NVIDIA H100 80GB HBM3  GPU-diag-input  on node-a\n")
    assert "  verdict      input-bound (M1): run loader rank 0 spends 6" in result.stdout
    assert result.stdout.endswith("1 of 1 GPU(s) below the 30% utilization target.\n")
    result = run_cli("diagnose", "--prometheus-url", prometheus, "--window", "4500ms", "--namespace", "ml-team")
    assert result.returncode == 2
    assert result.stderr == f"gpu-exporter: error: no GPU matches --namespace ml-team at {prometheus}\n"


def test_prometheus_without_gpu_metrics_is_one_sentence_and_exit_2() -> None:
    with run_prometheus("global: {scrape_interval: 1s}\nscrape_configs: []\n") as prom:
        result = run_cli("diagnose", "--prometheus-url", prom)
        assert result.returncode == 2
        assert result.stderr == (f"gpu-exporter: error: Prometheus at {prom} has no gpu_info series in the last 15m: "
                                 "is it scraping a gpu-exporter (see its Targets page)?\n")
        # Prometheus's own /metrics is a metrics page, but not an exporter's.
        result = run_cli("diagnose", "--url", prom)
        assert result.returncode == 2
        assert result.stderr == (f"gpu-exporter: error: {prom}/metrics serves no gpu-exporter metrics "
                                 "(gpu_exporter_build_info is missing): point --url at a gpu-exporter\n")
        result = run_cli("diagnose", "--prometheus-url", prom, "--window", "5x")
        assert result.returncode == 2
        assert result.stderr == "gpu-exporter: error: --window: '5x' is not a duration like 30s, 15m, 1h or 1d\n"
