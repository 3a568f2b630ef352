"""bench/real_gpu.py in simulated mode (what CI can run): the same loops and library code paths as on a real GPU.

On a GPU machine the script runs the exporter on the real driver beside nvidia-smi and the loops on CUDA
(docs/real-gpu.md). Here the exporter runs on bench/real_gpu.yaml, whose GPUs are busy only while each loop's
own simulated device works: an asynchronous one (kernels run after launch returns, ``.item()`` waits) under
``torch.cuda`` stand-ins for the plain loops and DDP, an ops-mode one for Lightning. So the verdicts below come
from the devices' busy time, and the library runs its CUDA path (events at phase changes; synchronize only
with ``sync_every``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import real_gpu, real_gpu_loops, real_gpu_table
from testbed import REPO, exporter_env

EXPECTED = {("input-bound", "0"): "input_bound", ("healthy", "0"): "healthy",
            ("batch-of-2", "0"): "batch_too_small", ("lightning", "0"): "metrics_bound",
            ("ddp", "0"): "straggler", ("ddp", "1"): "input_bound"}


@pytest.mark.slow
def test_simulated_real_gpu_check_gets_every_verdict_from_the_devices_busy_time(tmp_path: Path) -> None:
    out, md = tmp_path / "results.json", tmp_path / "table.md"
    proc = subprocess.run([sys.executable, "-m", "bench.real_gpu", "--simulate", "--seconds", "14", "--sync-seconds",
                           "10", "--window", "5", "--sync-window", "4", "--output", str(out), "--markdown", str(md)],
                          cwd=REPO, env=exporter_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    assert results["mode"] == "simulated" and results["errors"] == {} and results["passed"]
    assert results["ddp_backend"]["backend"] == "gloo"
    variants: dict[str, Any] = results["variants"]
    for (variant, rank), expected in EXPECTED.items():
        r = variants[variant]
        for mode in ("default", "sync_every_1"):
            got = r[mode]["ranks"][rank]["cause"] if variant == "ddp" else r[mode]["verdict"]
            assert got == expected, (variant, rank, mode, r[mode])
            assert r[mode]["uuid"] == f"GPU-bench-{variant}"
        own, synced = r["default"]["ranks"][rank]["own"], r["sync_every_1"]["ranks"][rank]["own"]
        # The default path is GPU-truthful and never synchronizes; sync_every=1 synchronizes at phase changes.
        assert own["gpu_truthful"] and own["synchronize"] == {"library": 0, "all": 0}, (variant, own)
        assert not synced["gpu_truthful"] and synced["synchronize"]["library"] > 0, (variant, synced)
        # The library's whole-run phases agree with the simulated device's own account of its idle time.
        if own["truth_shares"] is not None:
            for phase in ("data", "compute", "metrics"):
                assert own["library_shares"].get(phase, 0.0) == pytest.approx(
                    own["truth_shares"].get(phase, 0.0), abs=0.06), (variant, phase, own)
    assert variants["ddp"]["default"]["ranks"]["0"]["own"]["truth_shares"] is None
    # The CPU's clock puts the input-bound loop's .item() wait (the kernels) in metrics; the device says data.
    input_bound = variants["input-bound"]["default"]
    assert input_bound["ranks"]["0"]["own"]["cpu_clock_shares"]["metrics"] > 0.15
    assert input_bound["ranks"]["0"]["shares"].get("metrics", 0.0) < 0.05
    assert input_bound["ranks"]["0"]["shares"]["data"] > 0.5
    assert variants["healthy"]["default"]["utilization"] >= 0.85
    assert variants["batch-of-2"]["default"]["utilization"] < 0.3
    ddp = variants["ddp"]["default"]["ranks"]
    assert ddp["0"]["shares"]["communication"] > 0.5 > ddp["1"]["shares"].get("communication", 0.0)
    for variant in ("input-bound", "batch-of-2", "lightning"):  # cause verdicts carry their projection
        d = variants[variant]["default"]
        assert d["projected_utilization"] > d["utilization"], (variant, d)
        assert d["nvidia_smi_utilization"] is None and d["per_second"]
    lines = proc.stdout.splitlines()
    assert lines[0] == "ddp backend: gloo (simulated: gloo on the CPU)"
    assert lines[1].split()[:5] == ["variant", "rank", "expected", "default", "sync_every=1"]
    causes, activity = md.read_text().split("\n\n")
    table = causes.splitlines()
    assert table[0].startswith("| variant | rank | expected | default (GPU-truthful) | sync_every=1 |")
    assert len(table) == 2 + len(EXPECTED)
    # bench/real_gpu_loops.py: NVML's utilization beside GPM, whose simulated shares come from the kernels the
    # loops launched; each run gets its verdict from the exporter's judge (SM, tensor and DRAM activity)
    probes = {run: r[run] for r in variants.values() for run in real_gpu_loops.EXPECTED if run in r}
    assert set(probes) == set(real_gpu_loops.EXPECTED)
    for run, expected in real_gpu_loops.EXPECTED.items():
        assert probes[run]["verdict"] == expected and probes[run]["utilization"] > 0.85, (run, probes[run])
    gpm = {run: measured["gpm"] for run, measured in probes.items()}
    assert gpm["batch-size-small"]["sm_active"] < 0.3 < 0.8 < gpm["batch-size-large"]["sm_active"], gpm
    assert gpm["precision-fp32"]["tensor_active"] == 0 < 0.5 < gpm["precision-bf16"]["tensor_active"], gpm
    assert gpm["elementwise"]["dram"] > 0.8 > 0.5 > gpm["elementwise"]["sm_active"], gpm
    assert len(activity.splitlines()) == 2 + 2 * len(real_gpu.CAUSE_VARIANTS) + len(real_gpu_loops.EXPECTED)
    assert "| batch-size-small | sm_batch_too_small | sm_batch_too_small |" in activity


def test_a_missing_lightning_is_a_skipped_row_not_a_failure() -> None:
    results = {"variants": {"lightning": {"skipped": "lightning is not installed (pip install lightning)"}}}
    assert real_gpu_table.passed(results)
    assert real_gpu_table.rows(results) == [{"variant": "lightning", "rank": "-", "expected": "-",
                                       "default": "skipped: lightning is not installed (pip install lightning)"}]
    assert "| lightning | - | - | skipped: lightning is not installed" in real_gpu_table.markdown(results)


def test_a_waiting_rank_is_named_by_its_own_first_cause() -> None:
    causes = [{"cause": "batch_too_small", "code": "M3", "value": 0.2},
              {"cause": "straggler", "code": "ST", "value": 0.6}]
    assert real_gpu.top_cause(causes) == "straggler"
    assert real_gpu.top_cause([*causes, {"cause": "allocator", "code": "M4", "value": 3.0}]) == "allocator"
    assert real_gpu.top_cause([]) == "no cause"


def test_without_a_gpu_the_real_mode_says_so() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.real_gpu"], cwd=REPO,
                          env=exporter_env({"PATH": "/nonexistent"}), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2
    assert proc.stderr == "error: nvidia-smi not found: run on a machine with an NVIDIA GPU, or use --simulate\n"


def test_bad_arguments_say_what_to_change(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    for args, message in ((["--variants", "input-bound,nope"], "unknown variant(s) nope"),
                          (["--seconds", "10", "--window", "8"], "each window must be at least 2 s"),
                          (["--output", str(missing / "r.json")],
                           f"cannot write {missing / 'r.json'}: the folder {missing} does not exist"),
                          (["--markdown", str(missing / "r.md")], f"the folder {missing} does not exist"),
                          (["--output", str(tmp_path)], f"{tmp_path} is a folder: give a file name")):
        proc = subprocess.run([sys.executable, "-m", "bench.real_gpu", "--simulate", *args], cwd=REPO,
                              env=exporter_env(), capture_output=True, text=True, timeout=60, check=False)
        # one line, before any variant or the exporter started (a check of minutes would fail at its end)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stdout == "", proc.stdout
