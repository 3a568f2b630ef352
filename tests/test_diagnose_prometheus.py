"""``gpu-exporter diagnose --prometheus-url``: the same verdicts from a real Prometheus, filters, errors.

Prometheus runs the shipped rules, shrunk 60-fold at test time as in test_alerting_e2e (``[5m]`` ->
``[5s]``): by default diagnose reads only their recording-rule series for utilization, phases and
causes; with ``--window``/``--at`` it computes the same signals for any window ending at any time.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e import shipped_fast_rules
from test_diagnose import EXPECTED, RUNS, SCENARIOS, push_runs
from test_query import run_cli

from testbed import promql, run_exporter, run_prometheus, scrape_config, wait_until

pytestmark = pytest.mark.slow  # end-to-end: real processes


@pytest.fixture(scope="module")
def prometheus() -> Iterator[str]:
    """Prometheus scraping an exporter on diagnose-node.yaml every second, with the training runs pushing."""
    with run_exporter(["--simulate", str(SCENARIOS / "diagnose-node.yaml"), "--poll-interval", "0.2"]) as exporter:
        stop = threading.Event()
        thread = threading.Thread(target=push_runs, args=(exporter, stop), daemon=True)
        thread.start()
        try:
            files = shipped_fast_rules()
            with run_prometheus(scrape_config(exporter, "node-a"), files) as prom:
                wait_until(lambda: len(promql(prom, "increase(gpu_training_phase_seconds_total[10s]) > 0"))
                           >= 4 * len(RUNS) and promql(prom, "count_over_time(gpu_info[10s]) > 7")
                           and len(promql(prom, "run:gpu_training_cause:share")) >= 4, 40,
                           what="eight scrapes with training runs and their causes recorded")
                yield prom
        finally:
            stop.set()
            thread.join()


def test_same_verdicts_as_from_the_exporter(prometheus: str) -> None:
    result = run_cli("diagnose", "--prometheus-url", prometheus, "--output", "json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert {g["uuid"]: g["verdict"]["verdict"] for g in doc["gpus"]} == EXPECTED
    assert {g["node"] for g in doc["gpus"]} == {"node-a"}
    assert doc["window_seconds"] == 300.0 and doc["gpus_below_target"] == 7
    loader = next(g for g in doc["gpus"] if g["uuid"] == "GPU-diag-input")
    assert loader["utilization"] == pytest.approx(0.15, abs=0.02)
    assert loader["runs"][0]["shares"]["data"] == pytest.approx(0.6, abs=0.05)


def test_node_and_run_filters(prometheus: str) -> None:
    result = run_cli("diagnose", "--prometheus-url", prometheus, "--node", "node-a", "--run", "loader")
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("GPU 1  NVIDIA H100 80GB HBM3  GPU-diag-input  on node-a\n")
    assert re.search(r"  verdict      input-bound \(M1\): 1\d% now, at most ~\d+% if loading overlapped compute\. "
                     r"run loader rank 0 spends 6", result.stdout), result.stdout
    assert result.stdout.endswith("1 of 1 GPU(s) below the 85% utilization target.\n")
    result = run_cli("diagnose", "--prometheus-url", prometheus, "--namespace", "ml-team")
    assert result.returncode == 2
    assert result.stderr == f"gpu-exporter: error: no GPU matches --namespace ml-team at {prometheus}\n"


def test_a_matcher_naming_many_runs_is_escaped_and_posted(prometheus: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """any_of() escapes RE2's metacharacters, a query longer than GET_LIMIT goes to Prometheus as a POST form, and
    any_of_chunks() splits a long matcher into parts that read the same series:
    a fleet-wide diagnose names every run whose remedy it words (diagnose_sources._Fleet.remedy_inputs)."""
    from gpu_exporter.commands import client_http, client_prometheus
    from gpu_exporter.commands.client_prometheus import GET_LIMIT, Prometheus
    from gpu_exporter.commands.promql_text import any_of, any_of_chunks

    sent: list[str | None] = []
    fetch = client_http.fetch

    def recorded(*args: Any) -> bytes:
        sent.append(args[4] if len(args) > 4 else None)  # the form POSTed, None for a GET
        return fetch(*args)

    monkeypatch.setattr(client_prometheus, "fetch", recorded)
    loader = len(promql(prometheus, 'gpu_training_steps_total{run="loader"}'))
    many = ["loader", *(f"l.ader{i}+(x)|[y]" for i in range(300))]  # "l.ader" must not match "loader"
    for names in (["loader", "l.ader"], many):
        expr = f"count(gpu_training_steps_total{{{any_of('run', names)}}})"
        (answer,) = Prometheus(prometheus).query(expr)
        assert answer[1] == loader >= 1, (expr[:200], answer)
    assert sent[0] is None and sent[1] is not None and len(sent[1]) > GET_LIMIT  # short: GET; long: POST
    # split into matchers of at most 600 characters (VictoriaMetrics refuses a query over 16 KiB), the answers
    # added up read the same runs as the one matcher
    chunks = any_of_chunks("run", many, limit=600)
    assert len(chunks) > 5 and all(len(chunk) <= 600 for chunk in chunks)
    counts = Prometheus(prometheus).query_many([f"count(gpu_training_steps_total{{{c}}})" for c in chunks])
    assert sum(value for answer in counts.values() for _, value in answer) == loader


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
        result = run_cli("diagnose", "--prometheus-url", prom, "--window", "1h", "--at=-2h")
        assert result.returncode == 2
        assert result.stderr == (f"gpu-exporter: error: Prometheus at {prom} has no gpu_info series in the last 15m: "
                                 "is it scraping a gpu-exporter (see its Targets page)?\n")


def test_at_and_window_errors_are_one_sentence() -> None:
    result = run_cli("diagnose", "--url", "http://127.0.0.1:9", "--at=-1h")
    assert (result.returncode, result.stderr) == (2, "gpu-exporter: error: --at needs --prometheus-url (an exporter "
                                                     "only knows the present)\n")
    result = run_cli("diagnose", "--prometheus-url", "http://127.0.0.1:9", "--at", "yesterday")
    assert (result.returncode, result.stderr) == (2, "gpu-exporter: error: --at: 'yesterday' is not a time: use now, "
                                                     "-2h (before now), Unix seconds or 2026-12-03T05:00:00Z\n")


def test_any_window_at_any_time_gives_the_rules_verdicts(prometheus: str) -> None:
    """A window the rules do not record (10s, 3s), now and 2 s ago: the verdicts and signals of the rules."""
    rules = {g["uuid"]: g for g in json.loads(
        run_cli("diagnose", "--prometheus-url", prometheus, "--output", "json").stdout)["gpus"]}
    at = time.time() - 2
    for extra in (["--window", "10s"], ["--window", "3s", "--at", f"{at:.3f}"]):
        result = run_cli("diagnose", "--prometheus-url", prometheus, *extra, "--output", "json")
        assert result.returncode == 1, result.stderr
        doc = json.loads(result.stdout)
        assert {g["uuid"]: g["verdict"]["verdict"] for g in doc["gpus"]} == EXPECTED, extra
        assert doc["window_seconds"] == float(extra[1].rstrip("s"))
        got = {g["uuid"]: g for g in doc["gpus"]}
        for uuid in ("GPU-diag-input", "GPU-diag-metrics"):
            assert got[uuid]["utilization"] == pytest.approx(rules[uuid]["utilization"], abs=0.03), (extra, uuid)
            for phase, share in rules[uuid]["runs"][0]["shares"].items():
                assert got[uuid]["runs"][0]["shares"][phase] == pytest.approx(share, abs=0.05), (extra, uuid, phase)
    text = run_cli("diagnose", "--prometheus-url", prometheus, "--run", "loader", "--window", "10s", "--at=-1s")
    assert text.returncode == 1
    assert re.search(r"10s ending 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ \(the rules' signals over that window\)",
                     text.stdout), text.stdout
    assert "input-bound (M1)" in text.stdout


def test_prometheus_without_the_rules_is_one_sentence_and_exit_2() -> None:
    scenario = str(SCENARIOS / "diagnose-healthy.yaml")
    with run_exporter(["--simulate", scenario, "--poll-interval", "0.2"]) as exporter, \
            run_prometheus(scrape_config(exporter, "node-a", rule_files=())) as prom:
        wait_until(lambda: promql(prom, "gpu_info"), 20, what="a scrape")
        result = run_cli("diagnose", "--prometheus-url", prom)
    assert result.returncode == 2
    assert result.stderr == (f"gpu-exporter: error: Prometheus at {prom} has no gpu:gpu_utilization:avg5m series: "
                             "load the rules of prometheus/rules/*.rules.yml (rule_files) so diagnose can read the "
                             "cause series\n")
