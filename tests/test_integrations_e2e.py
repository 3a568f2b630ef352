"""End to end for the one-line integrations: real CPU jobs under training.watch, the Lightning callback
and the Transformers callback -> real exporter (--simulate) -> real Prometheus with the shipped rules
-> the cause, from the alerts and from both diagnose paths.

One representative loop per integration (tests/integration_loops.py), each in its own process on its
own simulated GPU (tests/scenarios/integrations-e2e.yaml), which follows the job's compute share:

=============  ==================  ======================================================  ================
integration    loop                what the job does per step                              expected cause
=============  ==================  ======================================================  ================
watch          input_bound         waits 0.3 s for its batch, computes 0.05 s              input-bound M1
lightning      checkpoint_heavy    ModelCheckpoint every step, 0.3 s to slow storage       checkpoint CK
transformers   metrics_heavy       evaluates every step, compute_metrics takes 0.3 s       metrics-bound M2
=============  ==================  ======================================================  ================

The rules are the shipped files shrunk 60-fold (test_alerting_e2e.fast_rules: ``[5m]`` -> ``[5s]``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest
from e2e import shipped_fast_rules
from servers import exporter_env, promql, run_exporter, run_prometheus, scrape_config, wait_until
from test_integrations import LOOPS
from test_query import run_cli

pytestmark = pytest.mark.slow

SCENARIO = LOOPS.parent / "scenarios" / "integrations-e2e.yaml"
JOBS = {  # integration -> (loop, run name, diagnose verdict, its title, the alerts that fire for its GPU)
    "watch": ("input_bound", "watch-input-bound", "input_bound", "input-bound (M1)",
              {("GpuTrainingInputBound", "input_bound")}),
    "lightning": ("checkpoint_heavy", "lightning-checkpoint-heavy", "checkpoint", "checkpoint-bound (CK)",
                  {("GpuTrainingCheckpointBound", "checkpoint")}),
    "transformers": ("metrics_heavy", "transformers-metrics-heavy", "metrics_bound", "metrics-bound (M2)",
                     {("GpuTrainingMetricsBound", "metrics_bound")}),
}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str]]:
    """The exporter, Prometheus with the shipped rules, and the three jobs running; yields (exporter, prom)."""
    files = shipped_fast_rules()
    with tempfile.TemporaryDirectory() as tmp, \
            run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.2"]) as exporter, \
            run_prometheus(scrape_config(exporter, "int-node"), files) as prom:
        jobs = {name: subprocess.Popen([sys.executable, str(LOOPS), name, loop, exporter, f"GPU-int-{name}", "300",
                                        f"{tmp}/{name}.json"], env=exporter_env(), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True)
                for name, (loop, *_) in JOBS.items()}
        try:
            yield exporter, prom
            for name, job in jobs.items():  # still training when the checks are done: none crashed
                assert job.poll() is None, (name, job.communicate()[1][-3000:])
        finally:
            for job in jobs.values():
                job.terminate()
            for job in jobs.values():
                job.communicate(timeout=30)


def _firing(prom: str) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    for r in promql(prom, 'ALERTS{alertstate="firing", cause!=""}'):
        out.setdefault(r["metric"]["uuid"], set()).add((r["metric"]["alertname"], r["metric"]["cause"]))
    return out


def test_each_integration_gets_its_cause_from_alerts_and_both_diagnose_paths(stack: tuple[str, str]) -> None:
    exporter, prom = stack
    wanted = {f"GPU-int-{name}": alerts for name, (*_, alerts) in JOBS.items()}

    def settled() -> dict[str, set[tuple[str, str]]] | None:
        firing = _firing(prom)
        return firing if all(firing.get(uuid, set()) >= alerts for uuid, alerts in wanted.items()) else None
    try:
        wait_until(settled, 180, interval=1.0, what="every job's cause alert to fire")
    except TimeoutError as err:
        shares = [(r["metric"]["run"], r["metric"]["phase"], r["value"][1])
                  for r in promql(prom, "run:gpu_training_phase:share5m > 0.01")]
        util = [(r["metric"]["uuid"], r["value"][1]) for r in promql(prom, "gpu:gpu_utilization:avg5m")]
        raise AssertionError(f"{err}: firing {_firing(prom)}; shares {shares}; utilization {util}") from None
    firing = _firing(prom)
    for uuid, alerts in wanted.items():
        assert firing[uuid] == alerts, (uuid, firing)

    for option, source, extra in (("--url", exporter, ["--window", "5s"]), ("--prometheus-url", prom, [])):
        result = run_cli("diagnose", option, source, *extra, "--output", "json")
        assert result.returncode == 1, result.stderr
        gpus = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
        for name, (_, run, verdict, title, _) in JOBS.items():
            got = gpus[f"GPU-int-{name}"]
            assert (got["verdict"]["verdict"], got["verdict"]["title"]) == (verdict, title), (option, name, got)
            assert [r["run"] for r in got["runs"]] == [run], (option, got["runs"])
