"""End to end on GPUs that do their own work: asynchronous training loops -> real exporter (--simulate) -> real
Prometheus with the shipped rules -> the cause, from the alerts and from both diagnose paths, and the library's
phases against the device's own truth.

Nine loops (tests/async_loops.py) run side by side, each in its own process on its own asynchronous simulated
GPU (gpu_exporter.simulate.device.AsyncDevice: kernels run after launch returns, ``.item()`` waits for them).
The exporter's simulated GPUs (tests/scenarios/causes-e2e.yaml, ``device: true``) are busy exactly while those
devices run the loops' work; what a loop reports has no say in it, so a phase counted wrongly shows as a wrong
verdict. The library sees CUDA through gpu_exporter.simulate.torch_cuda and runs its default path:
GPU-truthful phases from events at phase changes, no synchronize.

===============  ===================================================  ==========================================
loop             per step                                             expected cause
===============  ===================================================  ==========================================
input_item       0.11 s waiting for data, 0.04 s of kernels, .item()  input-bound M1 (not M2: .item() waits for
                                                                      the kernels), warning
healthy_item     0.5 s of kernels, the previous step's .item()        healthy, no alert
metrics_cpu      0.08 s of kernels, .cpu() then 0.09 s Python F1      below target (info): metrics-bound M2
mixed            0.12 s data, 0.04 s kernels, 0.06 s Python F1        input-bound M1 and metrics-bound M2
launch_bound     250 tiny kernels, each costing more CPU to issue     batch too small M3, warning
checkpoint_copy  state_dict() to the CPU, then torch.save for 0.17 s  checkpoint-bound CK, warning
hover30          data 0.09 s / 0.14 s switching every 3.5 s           input-bound M1, held across 30% (hysteresis)
ddp 0 and 1      2 ranks, emulated NCCL all-reduce queued async, its   rank 0: waiting for rank 1 (ST), never M3,
                 kernel busy while it waits; rank 1 waits 0.2 s for   though its GPU reads ~95% busy; rank 1:
                 its data                                             input-bound M1
===============  ===================================================  ==========================================

The rules are the shipped files shrunk 60-fold at test time (test_alerting_e2e.fast_rules: ``[5m]`` -> ``[5s]``,
``for: 10m`` -> ``10s``). Set CAUSES_E2E_OUTPUT=DIR to keep the diagnose outputs and the alerts (docs/runbooks.md
and docs/cli.md show them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from async_loops import PLANS
from e2e import firing_causes, keep_output, run_clis, running_jobs, shipped_fast_rules, wait_for_causes
from gpu_exporter.thresholds import load_thresholds

from testbed import http_get, promql, run_exporter, run_prometheus, scrape_config

pytestmark = pytest.mark.slow

SCENARIO = Path(__file__).parent / "scenarios" / "causes-e2e.yaml"
LOOPS = Path(__file__).with_name("async_loops.py")
SINGLE = [name for name in PLANS if not name.startswith("ddp")]
DDP = {"GPU-async-ddp-0": ("ddp_fast", "0"), "GPU-async-ddp-1": ("ddp_slow", "1")}
EXPECTED = {  # uuid -> (run, diagnose verdict, its title, the alerts that fire for its GPU)
    "GPU-async-input_item": ("input_item", "input_bound", "input-bound (M1)",
                             {("GpuTrainingInputBound", "input_bound")}),
    "GPU-async-healthy_item": ("healthy_item", "healthy", "healthy", set()),
    "GPU-async-metrics_cpu": ("metrics_cpu", "metrics_bound", "below target: metrics-bound (M2)",
                              {("GpuTrainingBelowTarget", "metrics_bound")}),
    "GPU-async-mixed": ("mixed", "input_bound", "input-bound (M1)", {("GpuTrainingInputBound", "input_bound"),
                                                                    ("GpuTrainingMetricsBound", "metrics_bound")}),
    "GPU-async-launch_bound": ("launch_bound", "batch_too_small", "batch too small (M3)",
                               {("GpuBatchTooSmall", "batch_too_small")}),
    "GPU-async-checkpoint_copy": ("checkpoint_copy", "checkpoint", "checkpoint-bound (CK)",
                                  {("GpuTrainingCheckpointBound", "checkpoint")}),
    "GPU-async-hover30": ("hover30", "input_bound", "input-bound (M1)", {("GpuTrainingInputBound", "input_bound")}),
    "GPU-async-ddp-0": ("ddp", "straggler", "waiting for a straggler (ST)", {("GpuTrainingStraggler", "straggler")}),
    "GPU-async-ddp-1": ("ddp", "input_bound", "input-bound (M1)", {("GpuTrainingInputBound", "input_bound")}),
}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str, Path, list[subprocess.Popen[str]]]]:
    """The exporter, Prometheus with the shipped rules, and the loops running; yields (exporter, prom, dir, jobs)."""
    files = shipped_fast_rules()
    with tempfile.TemporaryDirectory() as tmp:
        channel = {"GPU_SIM_DEVICE_DIR": f"{tmp}/channel"}
        with run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.2"], env=channel) as exporter, \
                run_prometheus(scrape_config(exporter, "e2e-node"), files) as prom:
            commands = [[sys.executable, str(LOOPS), name, exporter, "300", f"{tmp}/{name}.json"] for name in SINGLE]
            for uuid, (loop, rank) in DDP.items():
                commands.append(["env", f"RANK={rank}", "WORLD_SIZE=2", "ASYNC_LOOP_GROUP=ddp", "ASYNC_LOOP_RUN=ddp",
                                 f"ASYNC_LOOP_UUID={uuid}", sys.executable, str(LOOPS), loop, exporter, "300",
                                 f"{tmp}/{uuid}.json"])
            with running_jobs(commands, env=channel) as jobs:
                yield exporter, prom, Path(tmp), jobs


def _keep(name: str, text: str) -> None:
    keep_output("CAUSES_E2E_OUTPUT", name, text)


Stack = tuple[str, str, Path, list[subprocess.Popen[str]]]


def test_every_loop_gets_its_cause_from_alerts_and_both_diagnose_paths(stack: Stack) -> None:
    exporter, prom, _, _ = stack
    wanted = {uuid: alerts for uuid, (_, _, _, alerts) in EXPECTED.items() if alerts}

    def no_m3_on_the_waiting_rank() -> None:
        assert ("GpuBatchTooSmall", "batch_too_small") not in firing_causes(prom).get("GPU-async-ddp-0", set())

    wait_for_causes(prom, wanted, 150, "every loop's cause alert to fire", check=no_m3_on_the_waiting_rank)

    # Alerts: each GPU fires exactly its expected causes (after a breath, none flaps in), the healthy one none.
    time.sleep(3)
    firing = firing_causes(prom)
    for uuid, (_, _, _, alerts) in EXPECTED.items():
        assert firing.get(uuid, set()) == alerts, (uuid, firing)
    healthy = 'uuid="GPU-async-healthy_item"'
    seen = {q: [(r["metric"].get("phase"), r["value"][1]) for r in promql(prom, q % healthy)]
            for q in ("gpu:gpu_utilization:avg5m{%s}", "gpu:gpu_useful_utilization:avg5m{%s}",
                      "run:gpu_training_phase:share5m{%s}")}
    # No cause, pending or firing. A pending below-target alert is allowed only when the data holds a dip: on a
    # loaded machine the loop's start can leave its first 5m rates under the target, and the alert's hysteresis
    # keeps that minimum for its whole window (the GPU's own busy time, not a verdict of the engine).
    alerts = {(a["metric"]["alertname"], a["metric"]["alertstate"])
              for a in promql(prom, 'ALERTS{uuid="GPU-async-healthy_item"}')}
    assert alerts <= {("GpuUtilizationBelowTarget", "pending")}, (alerts, seen)
    if alerts:
        (dip,) = promql(prom, f"min_over_time(gpu:gpu_useful_utilization:avg5m{{{healthy}}}[1h])")
        assert float(dip["value"][1]) < load_thresholds().utilization_target, (dip, seen)
    (straggler,) = promql(prom, 'ALERTS{alertname="GpuTrainingStraggler", alertstate="firing"}')
    assert straggler["metric"]["straggler_rank"] == "1" and straggler["metric"]["rank"] == "0", straggler

    # The hovering GPU crosses the 30% line both ways while its cause alert stays firing (hysteresis).
    sides: set[bool] = set()
    deadline = time.monotonic() + 30
    while sides != {True, False} and time.monotonic() < deadline:
        (hover,) = promql(prom, 'gpu:gpu_utilization:avg5m{uuid="GPU-async-hover30"}')
        sides.add(float(hover["value"][1]) < 0.3)
        assert ("GpuTrainingInputBound", "input_bound") in firing_causes(prom).get("GPU-async-hover30", set()), sides
        time.sleep(0.5)
    assert sides == {True, False}, "the hovering GPU never crossed 30%"
    below = promql(prom, 'ALERTS{alertname="GpuTrainingBelowTarget", alertstate="firing"}')
    assert {r["metric"]["severity"] for r in below} == {"info"}
    _keep("alerts.json", http_get(prom + "/api/v1/alerts"))

    # diagnose --url (the exporter, judged in Python) and --prometheus-url (the recording rules) agree.
    # Every call at once (run_clis): each --url one still judges its own 5 s window.
    docs: dict[str, dict[str, Any]] = {}
    runs = sorted({r for r, *_ in EXPECTED.values()})
    sources: tuple[tuple[str, str, list[str]], ...] = (("url", exporter, ["--window", "5s"]), ("prometheus", prom, []))
    calls = [["diagnose", "--url" if flag == "url" else "--prometheus-url", source, *extra, *tail]
             for flag, source, extra in sources for tail in (["--output", "json"], *(["--run", r] for r in runs))]
    results = iter(run_clis(calls))
    for flag, _, _ in sources:
        result = next(results)
        assert result.returncode == 1, result.stderr
        docs[flag] = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
        for run in runs:
            text = next(results)
            assert text.returncode == (0 if run == "healthy_item" else 1), text.stdout + text.stderr
            _keep(f"diagnose-{flag}-{run}.txt", text.stdout)
    for uuid, (run, verdict, title, _) in EXPECTED.items():
        for flag in docs:
            got = docs[flag][uuid]["verdict"]
            # diagnose judges one moment (no hysteresis): a wobbling GPU may be just above the line.
            titles = {title, f"below target: {title}"} if run == "hover30" else {title}
            assert got["verdict"] == verdict and got["title"] in titles, (flag, uuid, got)
            if verdict != "healthy":  # every cause verdict states its projection, from the useful utilization
                shares = docs[flag][uuid]["runs"][0]["shares"]
                useful = min(docs[flag][uuid]["utilization"], 1 - shares.get("communication", 0.0))
                assert got["projected"] is not None and got["projected"] > useful, (flag, uuid, got, shares)
                assert " now, at most ~" in got["reason"], got
    # The async input-bound loop's GPU is busy about a quarter of the time, which the device made so.
    assert docs["url"]["GPU-async-input_item"]["utilization"] == pytest.approx(0.27, abs=0.08)
    assert docs["url"]["GPU-async-healthy_item"]["utilization"] > 0.9
    # The waiting rank's GPU reads busy (the emulated NCCL kernel spins while it waits), yet it is named ST above.
    assert docs["url"]["GPU-async-ddp-0"]["utilization"] > 0.8


def test_library_phases_match_the_devices_own_truth(stack: Stack) -> None:
    """Stop the loops (runs after the cause test): each writes, as it ends, the library's phase shares and the
    device's truth (GPU idle time per CPU phase, known exactly): every phase of every loop within 0.05, and the
    library never called torch.cuda.synchronize()."""
    _, _, out, jobs = stack
    for job in jobs:
        job.terminate()
    for job in jobs:
        job.wait(timeout=60)
    results = {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}
    assert len(results) == len(PLANS), sorted(results)
    for name, doc in results.items():
        for phase, truth in doc["truth"].items():
            assert doc["library"][phase] == pytest.approx(truth, abs=0.05), (name, phase, doc)
        assert doc["synchronize_calls"] == 0, name
    _keep("truth.json", json.dumps(results, indent=1))
