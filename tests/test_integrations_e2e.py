"""End to end for the one-line integrations: real CPU jobs under training.watch, the Lightning callback
and the Transformers callback -> real exporter (--simulate) -> real Prometheus with the shipped rules
-> the cause, from the alerts and from both diagnose paths.

Each job (tests/integration_loops.py) runs in its own process on its own simulated GPU
(tests/scenarios/integrations-e2e.yaml, ``device: true``). The GPU does its own work: the job runs on
an ops-mode simulated device, busy exactly while the job is inside torch operators and idle
otherwise, whatever the integration says the job is doing. A phase the integration counts wrongly
(Python in ``training_step`` called ``compute``) therefore shows as a wrong verdict here:

=============  ==================  ======================================================  ================
integration    loop                what the job does per step                              expected cause
=============  ==================  ======================================================  ================
watch          input_bound         waits 0.3 s for its batch, computes 0.05 s              input-bound M1
lightning      checkpoint_heavy    ModelCheckpoint every step, 0.3 s to slow storage       checkpoint CK
transformers   metrics_heavy       evaluates every step, compute_metrics takes 0.3 s       metrics-bound M2
lightning      step_metric         a macro F1 in Python inside training_step, 0.15 s       metrics-bound M2
transformers   callback_metric     its own callback updates a Python F1 metric, 0.15 s     metrics-bound M2
lightning      callback_save       its own callback torch.saves (0.05 s), then hashes the  checkpoint CK
                                   file it wrote for 0.1 s in the same hook
=============  ==================  ======================================================  ================

Besides the verdicts, what each integration counted is checked against the device's own account
(``truth``, written by the job with the run's phase seconds over the same window): the compute share
against the share of time the GPU was busy (and idle only between the operators of the job's compute
work), and the other phases against the time the job itself marked for that work. The rules are the
shipped files shrunk 60-fold (test_alerting_e2e.fast_rules: ``[5m]`` -> ``[5s]``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import firing_causes, run_clis, shipped_fast_rules, wait_for_causes
from gpu_exporter.verdict.causes import BY_ID
from test_integrations import LOOPS, gpu_work

from testbed import exporter_env, run_exporter, run_prometheus, scrape_config

pytestmark = pytest.mark.slow

SCENARIO = LOOPS.parent / "scenarios" / "integrations-e2e.yaml"
ALERTS = {"input_bound": "GpuTrainingInputBound", "checkpoint": "GpuTrainingCheckpointBound",
          "metrics_bound": "GpuTrainingMetricsBound"}
JOBS = {  # (integration, loop) -> the cause diagnose and the alerts name for its GPU
    ("watch", "input_bound"): "input_bound",
    ("lightning", "checkpoint_heavy"): "checkpoint",
    ("transformers", "metrics_heavy"): "metrics_bound",
    ("lightning", "step_metric"): "metrics_bound",
    ("transformers", "callback_metric"): "metrics_bound",
    ("lightning", "callback_save"): "checkpoint",
}
TRUTH_TOLERANCE = 0.05
"""How far (share of wall time) a reported phase may be from the device's account of it: compute from
the GPU work (busy, and the gaps between the operators of the job's compute boxes), the others from the
time the job marked for that work."""
COMPUTE_HOST_EDGES = 0.08
"""How far compute may be above the device's account: an integration times the framework's step as a whole, so its
compute also holds the host time before the step's first operator and after its last, which the device never sees
(+0.02 to +0.056 in quiet runs on 2 cores)."""


def run_name(integration: str, loop: str) -> str:
    return f"{integration}-{loop}".replace("_", "-")


def uuid_of(integration: str, loop: str) -> str:
    return f"GPU-int-{run_name(integration, loop)}"


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str, Path]]:
    """The exporter, Prometheus with the shipped rules, and the jobs running; yields (exporter, prom, job dir)."""
    files = shipped_fast_rules()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GPU_SIM_DEVICE_DIR": f"{tmp}/channel"}  # the devices write, the exporter's GPUs read
        with run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.2"], env=env) as exporter, \
                run_prometheus(scrape_config(exporter, "int-node"), files) as prom:
            jobs = {key: subprocess.Popen([sys.executable, str(LOOPS), *key, exporter, uuid_of(*key), "300",
                                           f"{tmp}/{run_name(*key)}.json"], env=exporter_env(env),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    for key in JOBS}
            try:
                yield exporter, prom, Path(tmp)
                for key, job in jobs.items():  # still training when the checks are done: none crashed
                    assert job.poll() is None, (key, job.communicate()[1][-3000:])
            finally:
                for job in jobs.values():
                    job.terminate()
                for job in jobs.values():
                    job.communicate(timeout=30)


def test_each_integration_gets_its_cause_from_alerts_and_both_diagnose_paths(stack: tuple[str, str, Path]) -> None:
    exporter, prom, _ = stack
    wanted = {uuid_of(*key): {(ALERTS[cause], cause)} for key, cause in JOBS.items()}
    wait_for_causes(prom, wanted, 180, "every job's cause alert to fire")
    firing = firing_causes(prom)
    for uuid, alerts in wanted.items():
        assert firing.get(uuid) == alerts, (uuid, firing)

    sources: tuple[tuple[str, str, list[str]], ...] = (("--url", exporter, ["--window", "5s"]),
                                                       ("--prometheus-url", prom, []))
    results = run_clis([["diagnose", option, source, *extra, "--output", "json"] for option, source, extra in sources])
    for (option, _, _), result in zip(sources, results, strict=True):
        assert result.returncode == 1, result.stderr
        gpus = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
        for key, cause in JOBS.items():
            got = gpus[uuid_of(*key)]
            # the cause at either level: a job whose utilization sits near the low line (30%) is judged "below
            # target: <cause>" by a read that lands just above it (ladder.Row.titled)
            label = BY_ID[cause].label
            assert got["verdict"]["verdict"] == cause, (option, key, got)
            assert got["verdict"]["title"] in (label, f"below target: {label}"), (option, key, got)
            assert [r["run"] for r in got["runs"]] == [run_name(*key)], (option, got["runs"])


def test_what_each_integration_counted_matches_the_device(stack: tuple[str, str, Path]) -> None:
    """Compute is the device's GPU work; data, metrics and checkpoint the time the job spent on them."""
    _, _, folder = stack
    table = {}
    for key in JOBS:
        written = json.loads((folder / f"{run_name(*key)}.json").read_text())
        reported, truth = written["reported"], written["truth"]
        total, wall = sum(reported.values()), truth["wall"]
        assert wall > 10 and abs(total - wall) < 0.1, (key, total, wall)  # the same window
        table[key] = {"compute": (reported["compute"] / total, gpu_work(truth))} | {
            phase: (reported[phase] / total, truth["cpu"].get(phase, 0.0) / wall)
            for phase in ("data", "metrics", "checkpoint")}
    print("\nphase -> (share the integration counted, share by the device's account)")
    for key, shares in table.items():
        print(f"  {run_name(*key)}: " + ", ".join(f"{p} {r:.3f}/{t:.3f}" for p, (r, t) in shares.items()))
    for key, shares in table.items():
        for phase, (counted, truth) in shares.items():
            above = COMPUTE_HOST_EDGES if phase == "compute" else TRUTH_TOLERANCE
            assert -TRUTH_TOLERANCE <= counted - truth <= above, (key, phase, table[key])
