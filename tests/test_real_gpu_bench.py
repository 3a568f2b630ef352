"""bench/real_gpu.py in simulated mode (what CI can run): the whole flow, and the verdicts it writes.

On a GPU machine the same script runs the exporter on the real driver beside nvidia-smi and real
CUDA loops (docs/real-gpu.md); here the exporter runs on bench/real_gpu.yaml and the loops on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from servers import REPO, exporter_env

pytestmark = pytest.mark.slow


def test_simulated_real_gpu_check_writes_the_expected_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "bench.real_gpu", "--simulate", "--seconds", "12", "--window", "5",
                           "--compare-seconds", "2", "--output", str(out)], cwd=REPO, env=exporter_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    assert results["mode"] == "simulated"
    got = {v: (r["verdict"], r["uuid"]) for v, r in results["variants"].items()}
    assert got == {"input-bound": ("input_bound", "GPU-bench-input-bound"),
                   "batch-of-2": ("batch_too_small", "GPU-bench-batch-of-2"),
                   "healthy": ("healthy", "GPU-bench-healthy")}
    variants = results["variants"]
    assert variants["input-bound"]["shares"]["data"] > 0.5
    assert variants["batch-of-2"]["utilization"] < 0.3 and variants["healthy"]["utilization"] >= 0.85
    for variant in ("input-bound", "batch-of-2"):  # cause verdicts carry their projection
        assert variants[variant]["projected_utilization"] > variants[variant]["utilization"]
    # The side-by-side part sampled every GPU's utilization, memory and processes.
    rows = results["side_by_side"]
    assert {r["uuid"] for r in rows} == {"GPU-bench-input-bound", "GPU-bench-batch-of-2", "GPU-bench-healthy"}
    assert all(0.0 <= r["exporter_utilization"] <= 1.0 and r["exporter_processes"] for r in rows)
    assert proc.stdout.splitlines()[0].split() == ["variant", "expected", "verdict", "util", "proj", "shares"]


def test_without_a_gpu_the_real_mode_says_so() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.real_gpu"], cwd=REPO,
                          env=exporter_env({"PATH": "/nonexistent"}), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2
    assert proc.stderr == "error: nvidia-smi not found: run on a machine with an NVIDIA GPU, or use --simulate\n"
