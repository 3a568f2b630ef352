"""Concrete remedies: what the library reports about itself (real DataLoaders, cgroup files), its
validation at ingest, the formulas, and the PromQL rules that must give the formulas' numbers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_exporter.ingest import IngestSettings, TrainingStore, parse_context
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.training import context
from gpu_exporter.training.run import Run
from gpu_exporter.verdict.causes import BY_ID, CAUSES, CONTEXT_CAUSES
from gpu_exporter.verdict.remedies import (
    Context,
    batch_factor,
    batch_suggestion,
    suggested_workers,
    suggestions,
    workers_suggestion,
)

REPO = Path(__file__).resolve().parents[1]
promtool = shutil.which("promtool")
GIB = 2**30


def test_a_real_dataloader_is_read_without_importing_torch_here() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.zeros(8, 2))
    plain = context.loader_settings(DataLoader(data, batch_size=4))
    assert plain == {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "loader_batch_size": 4}
    tuned = context.loader_settings(DataLoader(data, batch_size=2, num_workers=2, pin_memory=True, prefetch_factor=3,
                                               persistent_workers=True))
    assert tuned == {"num_workers": 2, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 3,
                     "loader_batch_size": 2}
    assert context.loader_settings([1, 2, 3]) is None  # not a DataLoader: nothing to say


def test_run_data_puts_the_loader_and_the_cores_in_every_snapshot() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    run = Run("ctx", uuid="GPU-ctx")
    for _ in run.data(DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4)):
        run.step(samples=4)
    ctx = run.snapshot()["context"]
    assert ctx["num_workers"] == 0 and ctx["loader_batch_size"] == 4
    assert ctx["cpu_cores"] == context.cpu_cores() <= len(os.sched_getaffinity(0))
    assert "gpu_memory_total_bytes" not in ctx  # no CUDA here: nothing made up
    assert parse_context(json.loads(json.dumps(ctx)))["num_workers"] == 0.0  # what the exporter accepts


def test_training_watch_reports_the_loader_it_times() -> None:
    torch = pytest.importorskip("torch")
    from gpu_exporter import training
    from torch.utils.data import DataLoader, TensorDataset

    run = Run("watched", uuid="GPU-w")
    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2, num_workers=0, pin_memory=False)
    watcher = training.watch(None, None, loader, run=run)
    try:
        assert run.snapshot()["context"]["num_workers"] == 0
        assert run.snapshot()["context"]["loader_batch_size"] == 2
    finally:
        watcher.close()


@pytest.mark.parametrize(("files", "expected"), [
    ({"cpu.max": "200000 100000\n"}, 2.0),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_cgroup_quota_v1_and_v2(tmp_path: Path, files: dict[str, str], expected: float | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert context.cgroup_cpu_limit(tmp_path) == expected


def _push(store: TrainingStore, ctx: Any) -> tuple[int, str]:
    doc = {"version": 1, "run": "r", "rank": "0", "uuid": "GPU-1", "started_at": time.time() - 10,
           "phases": {"data": 5.0, "compute": 5.0}, "current_phase": "data", "steps": 1, "samples": 2,
           "batch_size": 2, "context": ctx}
    return store.handle_push(json.dumps(doc).encode(), "application/json", None)


@pytest.mark.parametrize(("ctx", "problem"), [
    ([], "context must be an object"),
    ({"num_workers": -1}, "context.num_workers must be a finite number >= 0"),
    ({"num_workers": 2.5}, "context.num_workers must be a whole number"),
    ({"pin_memory": 1}, "context.pin_memory must be true or false"),
    ({"cpu_cores": "16"}, "context.cpu_cores must be a finite number >= 0"),
])
def test_ingest_rejects_a_bad_context_in_one_line(ctx: Any, problem: str) -> None:
    status, reason = _push(TrainingStore(IngestSettings()), ctx)
    assert (status, reason) == (400, f"rejected (invalid_schema): {problem}")


def test_ingest_exports_the_context_as_gauges() -> None:
    store = TrainingStore(IngestSettings())
    assert _push(store, {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "cpu_cores": 16,
                         "allocator_peak_bytes": 3 * GIB, "future_field": [1]})[0] == 202
    got = {s.name: s.value for family in store.collect() for s in family.samples if s.labels.get("run") == "r"}
    assert got["gpu_training_loader_workers"] == 0 and got["gpu_training_cpu_cores"] == 16
    assert got["gpu_training_loader_pin_memory"] == 0 and got["gpu_training_allocator_peak_bytes"] == 3 * GIB
    assert "gpu_training_loader_prefetch_factor" not in got  # not reported, not invented


def test_the_issue_examples() -> None:
    ctx = Context.of({"num_workers": 0, "cpu_cores": 16, "pin_memory": 0, "persistent_workers": 0})
    assert workers_suggestion(ctx, 0.9) == ("num_workers=0 with 16 cores available: try num_workers=9, "
                                            "pin_memory=True, persistent_workers=True")
    small = Context.of({"allocator_peak_bytes": 3 * GIB, "gpu_memory_total_bytes": 80 * GIB})
    assert batch_suggestion(small, 2, 0.05, 0.9, None, None, 0.8) == (
        "batch 2 uses 3.0 of 80 GiB: try batch 32 and scale the learning rate by 16")


def test_a_run_gets_suggestions_for_the_causes_found_in_it_only() -> None:
    ctx = Context.of({"num_workers": 0, "cpu_cores": 16, "allocator_peak_bytes": 3 * GIB,
                      "gpu_memory_total_bytes": 80 * GIB})
    shares = {"data": 0.5, "compute": 0.5}
    both = suggestions(ctx, CAUSES, shares, 2, 0.05, None, None, 0.8)  # every cause is asked
    assert set(both) == set(CONTEXT_CAUSES) == {"input_bound", "batch_too_small"}
    assert suggestions(ctx, [BY_ID["input_bound"], BY_ID["straggler"]], shares, 2, 0.05, None, None, 0.8) == \
        {"input_bound": both["input_bound"]}
    assert suggestions(ctx, [BY_ID["checkpoint"]], shares, 2, 0.05, None, None, 0.8) == {}


def test_suggestions_say_when_there_is_no_room() -> None:
    busy = Context.of({"num_workers": 7, "cpu_cores": 8, "pin_memory": 1, "persistent_workers": 1,
                       "prefetch_factor": 2})
    assert workers_suggestion(busy, 0.6) == ("num_workers=7 with 8 cores available: no core left for more workers: "
                                             "cache or preload the data set, decode on the GPU; also prefetch_factor=4")
    full = Context.of({"allocator_peak_bytes": 70 * GIB, "gpu_memory_total_bytes": 80 * GIB})
    assert batch_suggestion(full, 64, 0.2, 0.9, None, None, 0.8).endswith("no room to double it: accumulate "
                                                                           "gradients, CUDA graphs or torch.compile "
                                                                           "instead")
    assert workers_suggestion(Context(), 0.9) == ""  # nothing reported: no made-up numbers


# --- the PromQL rules give the formulas' numbers (promtool) ---------------------------------------

@dataclass(frozen=True)
class M1:
    workers: int
    data: float
    cores: float


@dataclass(frozen=True)
class M3:
    batch: int
    utilization: float
    compute: float
    peak: float | None = None
    job_total: float | None = None
    gpu_used: float = 10 * GIB
    gpu_total: float = 80 * GIB


M1_CASES = [M1(0, 0.9, 16), M1(4, 0.5, 16), M1(12, 0.5, 8), M1(0, 0.2, 4), M1(2, 1.0, 8), M1(0, 0.54, 2.5)]
M3_CASES = [M3(2, 0.05, 0.9, peak=3 * GIB, job_total=80 * GIB), M3(64, 0.2, 0.9, peak=70 * GIB, job_total=80 * GIB),
            M3(8, 0.2, 0.9), M3(16, 0.45, 0.9)]
MINUTES = 10


def _series(name: str, **labels: str) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted({"instance": "n1:9445", "job": "gpu-exporter",
                                                                   **labels}.items())) + "}"


def _promtool_test() -> dict[str, Any]:
    series: list[dict[str, str]] = []
    workers_exp, batch_exp = [], []
    t = load_thresholds()

    def add(name: str, values: str, **labels: str) -> None:
        series.append({"series": _series(name, **labels), "values": values})

    def run(uuid: str, shares: dict[str, float], utilization: float, used: float, total: float) -> dict[str, str]:
        add("gpu_info", f"1x{MINUTES}", uuid=uuid, gpu="0")
        add("gpu_busy_seconds_total", f"0+{utilization * 60:g}x{MINUTES}", uuid=uuid, gpu="0")
        add("gpu_memory_used_bytes", f"{used:g}x{MINUTES}", uuid=uuid, gpu="0")
        add("gpu_memory_total_bytes", f"{total:g}x{MINUTES}", uuid=uuid, gpu="0")
        labels = {"run": uuid, "rank": "0", "uuid": uuid}
        for phase, share in shares.items():
            add("gpu_training_phase_seconds_total", f"0+{share * 60:g}x{MINUTES}", phase=phase, **labels)
        return labels

    for i, c in enumerate(M1_CASES):
        labels = run(f"GPU-m1-{i}", {"data": c.data, "compute": 1 - c.data}, 0.1, 10 * GIB, 80 * GIB)
        add("gpu_training_loader_workers", f"{c.workers}x{MINUTES}", **labels)
        add("gpu_training_cpu_cores", f"{c.cores:g}x{MINUTES}", **labels)
        add("gpu_training_batch_size", f"32x{MINUTES}", **labels)
        workers_exp.append({"labels": _series("run:gpu_training_remedy:num_workers", **labels),
                            "value": suggested_workers(c.workers, c.data, c.cores)})
        k = batch_factor(10 * GIB, 80 * GIB, 0.1, 1 - c.data, t.remedy_memory_target_ratio) if c.data < 1 else 1
        if k >= 2:  # every run with a batch size gets the M3 number too; it is read when M3 applies
            batch_exp.append({"labels": _series("run:gpu_training_remedy:batch_size", **labels), "value": 32 * k})
    for i, m in enumerate(M3_CASES):
        labels = run(f"GPU-m3-{i}", {"data": 0.05, "compute": m.compute, "other": 0.95 - m.compute},
                     m.utilization, m.gpu_used, m.gpu_total)
        add("gpu_training_batch_size", f"{m.batch}x{MINUTES}", **labels)
        if m.peak is not None:
            add("gpu_training_allocator_peak_bytes", f"{m.peak:g}x{MINUTES}", **labels)
        if m.job_total is not None:
            add("gpu_training_memory_total_bytes", f"{m.job_total:g}x{MINUTES}", **labels)
        k = batch_factor(m.peak or m.gpu_used, m.job_total or m.gpu_total, m.utilization, m.compute,
                         t.remedy_memory_target_ratio)
        if k >= 2:
            batch_exp.append({"labels": _series("run:gpu_training_remedy:batch_size", **labels), "value": m.batch * k})
    return {"rule_files": [str(REPO / "prometheus" / "rules" / "gpu-recording.rules.yml")],
            "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
                {"expr": "run:gpu_training_remedy:num_workers", "eval_time": "8m", "exp_samples": workers_exp},
                {"expr": "run:gpu_training_remedy:batch_size", "eval_time": "8m", "exp_samples": batch_exp},
            ]}]}


@pytest.mark.skipif(promtool is None, reason="promtool not installed (apt-get install prometheus)")
def test_promql_remedies_equal_the_python_formulas(tmp_path: Path) -> None:
    doc = _promtool_test()
    workers, batches = (doc["tests"][0]["promql_expr_test"][i]["exp_samples"] for i in (0, 1))
    assert [s["value"] for s in workers] == [9, 8, 7, 1, 7, 1]
    assert [s["value"] for s in batches] == [128, 128, 128, 128, 32, 32, 32]
    path = tmp_path / "remedies.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout[-6000:] + proc.stderr[-2000:]
