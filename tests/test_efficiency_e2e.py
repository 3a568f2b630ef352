"""End to end, busy but not effective: training loops whose GPUs read ~99% busy (NVML) while their kernels use
the SMs badly -> two real exporters (--simulate) and the stand-in dcgm-exporter -> one real Prometheus with the
shipped rules -> the efficiency verdict from the alerts, ``diagnose --url`` (with ``--dcgm-url`` for the node
without GPM), ``diagnose --prometheus-url`` and the run report.

Four loops (tests/async_loops.py, plan ``healthy_item``: kernels queued back to back on an asynchronous simulated
GPU) run side by side, each with its kernels' shares in ``$GPU_SIM_KERNEL`` (gpu_exporter.simulate.device.Kernel:
SM activity, tensor pipe, DRAM while a kernel runs). The GPUs' SM, tensor and DRAM activity come from the
work the loops queued, read by the simulated GPM (node ``n-gpm``, tests/scenarios/efficiency-e2e-gpm.yaml) or,
for the GPU whose scenario says ``gpm: false`` (node ``n-dcgm``), by the stand-in dcgm-exporter only, which serves
its fp pipes too (``dcgm_pipe_fields: true``): the text of tensor cores idle names the busiest (FP32 or FP64), the
others' never do.

==============  ======  ===============================  ==================================================
GPU             node    kernel (SM, tensor, DRAM, FP32)  expected
==============  ======  ===============================  ==================================================
GPU-eff-small   n-gpm   0.25, 0.3, 0.1; 10% memory used  batch too small for the SMs (M3), GpuSmBatchTooSmall
GPU-eff-dram    n-gpm   0.3, 0.2, 0.8                    memory-bound kernels (MB), GpuMemoryBoundKernels
GPU-eff-healthy n-gpm   0.9, 0.6, 0.3                    healthy, no alert
GPU-eff-fp32    n-dcgm  0.8, 0.0, 0.3, 0.4 (dcgm-exp.)   tensor cores idle (TC), GpuTensorCoresIdle; without
                                                         --dcgm-url diagnose says "SM activity unknown"
GPU-eff-fp64    n-dcgm  0.8, 0.0, 0.3, 0.02; FP64 0.4    tensor cores idle (TC), its reason names float64

==============  ======  ===============================  ==================================================

The rules are the shipped files shrunk 60-fold (tests/e2e.py: ``[5m]`` -> ``[5s]``, ``for: 10m`` -> ``10s``).
Set EFFICIENCY_E2E_OUTPUT=DIR to keep the diagnose texts and the alerts (docs/cli.md and docs/runbooks.md quote
them).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from e2e import firing_causes, keep_output, run_clis, running_jobs, shipped_fast_rules, wait_for_causes
from gpu_exporter.simulate import dcgm_exporter
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.efficiency import FP_PIPES, for_cluster

from testbed import http_get, promql, run_exporter, run_prometheus

pytestmark = pytest.mark.slow

SCENARIOS = Path(__file__).parent / "scenarios"
LOOPS = Path(__file__).with_name("async_loops.py")
T = load_thresholds()
LOOP = {  # uuid -> (node, run, $GPU_SIM_KERNEL)
    "GPU-eff-small": ("n-gpm", "eff-small", "sm=0.25,tensor=0.3,dram=0.1"),
    "GPU-eff-dram": ("n-gpm", "eff-dram", "sm=0.3,tensor=0.2,dram=0.8"),
    "GPU-eff-healthy": ("n-gpm", "eff-healthy", "sm=0.9,tensor=0.6,dram=0.3"),
    "GPU-eff-fp32": ("n-dcgm", "eff-fp32", "sm=0.8,tensor=0,dram=0.3,fp32=0.4"),
    "GPU-eff-fp64": ("n-dcgm", "eff-fp64", "sm=0.8,tensor=0,dram=0.3,fp32=0.02,fp64=0.4"),
}
EXPECTED = {  # uuid -> (verdict, title, the source of its SM activity, the alerts that fire for it)
    "GPU-eff-small": ("sm_batch_too_small", "batch too small for the SMs (M3)", "gpm",
                      {("GpuSmBatchTooSmall", "sm_batch_too_small")}),
    "GPU-eff-dram": ("memory_bound", "memory-bound kernels (MB)", "gpm", {("GpuMemoryBoundKernels", "memory_bound")}),
    "GPU-eff-healthy": ("healthy", "healthy", "gpm", set()),
    "GPU-eff-fp32": ("tensor_cores_idle", "tensor cores idle (TC)", "dcgm",
                     {("GpuTensorCoresIdle", "tensor_cores_idle")}),
    "GPU-eff-fp64": ("tensor_cores_idle", "tensor cores idle (TC)", "dcgm",
                     {("GpuTensorCoresIdle", "tensor_cores_idle")}),
}
SM = {"GPU-eff-small": 0.25, "GPU-eff-dram": 0.3, "GPU-eff-healthy": 0.9, "GPU-eff-fp32": 0.8, "GPU-eff-fp64": 0.8}
"""Each loop's kernel SM share: the GPU's SM activity, times its busy share (~0.97-1)."""


def _target(url: str) -> str:
    return f'"{urlsplit(url).netloc}"'


Stack = tuple[dict[str, str], str, str]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """Two exporters, the stand-in dcgm-exporter, Prometheus with the shipped rules, and the loops running; yields
    ({node: exporter URL}, dcgm-exporter URL, Prometheus URL)."""
    with tempfile.TemporaryDirectory() as tmp:
        channel = {"GPU_SIM_DEVICE_DIR": f"{tmp}/channel"}
        Path(channel["GPU_SIM_DEVICE_DIR"]).mkdir()
        args = ["--poll-interval", "0.2"]
        with run_exporter(["--simulate", str(SCENARIOS / "efficiency-e2e-gpm.yaml"), *args], env=channel) as gpm, \
                run_exporter(["--simulate", str(SCENARIOS / "efficiency-e2e-dcgm.yaml"), *args], env=channel) as bare, \
                dcgm_exporter.serve(SCENARIOS / "efficiency-e2e-dcgm.yaml", hostname="n-dcgm", interval=1.0,
                                    directory=channel["GPU_SIM_DEVICE_DIR"]) as dcgm:
            config = ("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      "rule_files: [rules/gpu-recording.rules.yml, rules/gpu-alerts.rules.yml]\n"
                      "scrape_configs:\n"
                      "  - job_name: gpu-exporter\n    static_configs:\n"
                      f"      - targets: [{_target(gpm)}]\n        labels: {{node: n-gpm}}\n"
                      f"      - targets: [{_target(bare)}]\n        labels: {{node: n-dcgm}}\n"
                      "  - job_name: dcgm-exporter\n    static_configs:\n"
                      f"      - targets: [{_target(dcgm.url)}]\n")
            with run_prometheus(config, shipped_fast_rules()) as prom:
                commands = [["env", f"ASYNC_LOOP_UUID={uuid}", f"ASYNC_LOOP_RUN={run}", f"GPU_SIM_KERNEL={kernel}",
                             sys.executable, str(LOOPS), "healthy_item", gpm if node == "n-gpm" else bare, "300"]
                            for uuid, (node, run, kernel) in LOOP.items()]
                with running_jobs(commands, env=channel):
                    yield {"n-gpm": gpm, "n-dcgm": bare}, dcgm.url, prom


def test_each_gpu_gets_its_efficiency_verdict_from_alerts_diagnose_and_the_report(stack: Stack) -> None:
    exporters, dcgm, prom = stack
    started = time.time()
    wanted = {uuid: alerts for uuid, (*_, alerts) in EXPECTED.items() if alerts}
    wait_for_causes(prom, wanted, 120, "every busy GPU's efficiency alert to fire")

    # Alerts: each GPU fires exactly its expected efficiency alert, with the workload's labels; the healthy one none.
    time.sleep(2)
    firing = firing_causes(prom)
    for uuid, (*_, alerts) in EXPECTED.items():
        assert firing.get(uuid, set()) == alerts, (uuid, firing)
    for alert in promql(prom, 'ALERTS{alertstate="firing", alertname=~"GpuSm.*|GpuTensor.*|GpuMemoryBound.*"}'):
        labels = alert["metric"]
        node, run, _ = LOOP[labels["uuid"]]
        assert (labels["severity"], labels["node"], labels["run"]) == ("info", node, run), labels
    # Tensor cores idle names dcgm-exporter's busiest fp pipe (its raw series, read as the text renders): FP32 here,
    # ~0.4 x busy ...
    texts = {a["labels"]["uuid"]: a["annotations"]["description"]
             for a in json.loads(http_get(prom + "/api/v1/alerts"))["data"]["alerts"]
             if a["state"] == "firing" and a["labels"]["alertname"] == "GpuTensorCoresIdle"}
    fp32 = re.search(r"its tensor pipe below \d+%, and its FP32 pipe ([\d.]+)% active \(DCGM\): its math runs on "
                     r"the fp32 pipes", texts["GPU-eff-fp32"])
    assert fp32 and 0.3 <= float(fp32.group(1)) / 100 <= 0.41, texts
    # ... and on the float64 GPU the busiest pipe, FP64, with what the math does there (the table's words).
    fp64 = re.search(r"its tensor pipe below \d+%, and its FP64 pipe ([\d.]+)% active \(DCGM\): its math runs in "
                     r"float64 and the tensor cores idle: check the tensors' dtype first", texts["GPU-eff-fp64"])
    assert fp64 and 0.3 <= float(fp64.group(1)) / 100 <= 0.41 and "FP32" not in texts["GPU-eff-fp64"], texts
    # The recorded effective utilization: GPM on n-gpm, dcgm-exporter (joined by UUID) on n-dcgm, beside busy.
    sm = {r["metric"]["uuid"]: (r["metric"]["source"], float(r["value"][1]))
          for r in promql(prom, "gpu:gpu_sm_active:avg5m")}
    busy = {r["metric"]["uuid"]: float(r["value"][1]) for r in promql(prom, "gpu:gpu_utilization:avg5m")}
    for uuid, (_, _, source, _) in EXPECTED.items():
        assert busy[uuid] >= T.utilization_target, (uuid, busy)
        assert sm[uuid][0] == source and sm[uuid][1] == pytest.approx(SM[uuid] * busy[uuid], abs=0.08), (uuid, sm)

    # diagnose --url per node (n-dcgm with --dcgm-url, and once without it), and --prometheus-url: same verdicts.
    calls = [["diagnose", "--url", exporters["n-gpm"], "--window", "5s", "--output", "json"],
             ["diagnose", "--url", exporters["n-dcgm"], "--dcgm-url", dcgm, "--window", "5s", "--output", "json"],
             ["diagnose", "--url", exporters["n-dcgm"], "--window", "5s", "--output", "json"],
             ["diagnose", "--prometheus-url", prom, "--output", "json"],
             ["diagnose", "--prometheus-url", prom, "--run", "eff-small"],
             ["diagnose", "--url", exporters["n-dcgm"], "--dcgm-url", dcgm, "--window", "5s"],
             ["report", "--prometheus-url", prom, "--run", "eff-small", "--step", "1s", "--output", "json"],
             ["report", "--prometheus-url", prom, "--run", "eff-small", "--step", "1s"]]
    on_gpm, on_dcgm, without, fleet, text, dcgm_text, report, report_text = run_clis(calls)
    # diagnose --prometheus-url reads the fp pipes over 5m inline: since the loops started, their start-up included
    # (longer on a loaded machine); it must give what Prometheus gives for the same query, read right after it.
    pipes = {(pipe.key, r["metric"]["uuid"]): float(r["value"][1]) for pipe in FP_PIPES
             for r in promql(prom, for_cluster(pipe.query(), T.cluster_label))}
    assert 0.2 <= pipes["fp32", "GPU-eff-fp32"] <= 0.46 and 0.2 <= pipes["fp64", "GPU-eff-fp64"] <= 0.46, pipes
    keep_output("EFFICIENCY_E2E_OUTPUT", "diagnose-prometheus-eff-small.txt", text.stdout)
    keep_output("EFFICIENCY_E2E_OUTPUT", "diagnose-url-dcgm.txt", dcgm_text.stdout)
    keep_output("EFFICIENCY_E2E_OUTPUT", "alerts.json", http_get(prom + "/api/v1/alerts"))
    keep_output("EFFICIENCY_E2E_OUTPUT", "report-eff-small.json", report.stdout)
    keep_output("EFFICIENCY_E2E_OUTPUT", "diagnose-url-gpm.json", on_gpm.stdout)
    for result in (on_gpm, on_dcgm, without, fleet):
        assert result.returncode == 0, result.stderr  # busy GPUs are not below the target
    by_url = {g["uuid"]: g for r in (on_gpm, on_dcgm) for g in json.loads(r.stdout)["gpus"]}
    by_prom = {g["uuid"]: g for g in json.loads(fleet.stdout)["gpus"]}
    for uuid, (verdict, title, source, _) in EXPECTED.items():
        for path, gpus in (("url", by_url), ("prometheus", by_prom)):
            got = gpus[uuid]
            fp = {k: 0.4 * got["utilization"] if path == "url" else pipes.get((k, uuid)) for k in ("fp32", "fp64")}
            if uuid == "GPU-eff-fp32":  # dcgm-exporter's FP32 pipe: the evidence of fp32 math, in reason and line
                assert got["fp32_active"] == pytest.approx(fp["fp32"], abs=0.06 if path == "url" else 0.03), got
                assert re.search(r"but its tensor pipe only 0% and its FP32 pipe \d+% \(DCGM\): its math runs on "
                                 r"the fp32 pipes", got["verdict"]["reason"]), (path, got["verdict"])
                assert ", FP32 pipe " in got["verdict"]["effective"] and got["fp64_active"] == 0.0, (path, got)
            elif uuid == "GPU-eff-fp64":  # the FP64 pipe carries the math: float64, check the dtype
                assert got["fp64_active"] == pytest.approx(fp["fp64"], abs=0.06 if path == "url" else 0.03), got
                assert re.search(r"but its tensor pipe only 0% and its FP64 pipe \d+% \(DCGM\): its math runs in "
                                 r"float64 and the tensor cores idle: check the tensors' dtype",
                                 got["verdict"]["reason"]), (path, got["verdict"])
                assert re.search(r", FP32 pipe \d+%, FP16 pipe 0%, FP64 pipe \d+%", got["verdict"]["effective"]), got
            else:  # no FP32 field for a GPU dcgm-exporter does not serve: nothing said
                assert (got["fp32_active"], got["fp16_active"], got["fp64_active"]) == (None, None, None), (path, got)
                assert not re.search("FP32|FP16|FP64", json.dumps(got["verdict"])), (path, got)
            assert (got["verdict"]["verdict"], got["verdict"]["title"], got["sm_source"]) == (verdict, title, source), (
                path, uuid, got["verdict"], got["sm_active"], got["tensor_active"], got["dram_active"])
            assert got["sm_active"] == pytest.approx(SM[uuid] * got["utilization"], abs=0.1), (path, uuid, got)
            assert got["verdict"]["effective"].startswith(f"effective utilization (SM activity, {source.upper()})")
            if uuid == "GPU-eff-small":  # the run reports its batch size and memory: the batch to try
                assert "try batch 64" in got["verdict"]["suggestion"], (path, got["verdict"])
            if verdict != "healthy":  # the cause, its remedy and what it is worth
                assert got["verdict"]["code"] and got["verdict"]["remedy"] and got["verdict"]["runbook"], got
                assert got["verdict"]["worth"] == pytest.approx(got["utilization"] - got["sm_active"], abs=1e-6)
    # Without --dcgm-url the GPM-less GPU's SM activity is unknown: healthy by NVML, never called effective.
    alone_gpus = json.loads(without.stdout)["gpus"]
    assert len(alone_gpus) == 2, alone_gpus
    for alone in alone_gpus:
        assert (alone["verdict"]["verdict"], alone["sm_active"], alone["fp64_active"]) == ("healthy", None, None)
        assert alone["verdict"]["effective"].startswith("SM activity unknown: enable GPM")
    assert "effective    effective utilization (SM activity, GPM) " in text.stdout, text.stdout
    assert "verdict      batch too small for the SMs (M3): " in text.stdout and "worth        " in text.stdout
    assert "effective    effective utilization (SM activity, DCGM) " in dcgm_text.stdout, dcgm_text.stdout

    # The run report: the verdict over the range with its remedy, effective beside busy, the GPU-hours between.
    assert report.returncode == 0, report.stderr
    doc: dict[str, Any] = json.loads(report.stdout)
    verdicts = {v["verdict"]: v for v in doc["verdicts"]}
    assert "sm_batch_too_small" in verdicts and verdicts["sm_batch_too_small"]["code"] == "M3", doc["verdicts"]
    eff = doc["effective_utilization"]
    assert eff["sources"] == ["gpm"] and eff["sm_activity"] == pytest.approx(0.25, abs=0.08), eff
    assert eff["busy_utilization"] > eff["sm_activity"] + 0.5 and eff["gpu_hours_busy_not_effective"] > 0, eff
    assert eff["worth_gpu_hours"]["sm_batch_too_small"] > 0, eff
    lines = report_text.stdout.splitlines()
    assert any(line.startswith("effective utilization") and "SM activity (GPM) beside" in line for line in lines)
    assert any(line.startswith("GPU-hours busy, not effective") for line in lines), report_text.stdout
    assert any(line.startswith("batch too small for the SMs (M3)") and "remedy: raise the batch size" in line
               for line in lines), report_text.stdout
    keep_output("EFFICIENCY_E2E_OUTPUT", "report-eff-small.txt", report_text.stdout)
    print(f"efficiency e2e: alerts to report in {time.time() - started:.0f} s")
