"""The README's promises: its training script runs against a real exporter and its numbers arrive."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from servers import exporter_env, http_get, run_exporter, wait_until

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README.read_text(), re.S)
    assert first_block is not None
    commands = [line for line in first_block.group(1).splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert "gpu-exporter --simulate" in commands[0] and "pip install" in commands[0]
    assert commands[1] == "bash tests/run.sh"
    assert "bash tests/run.sh" in (README.parent / ".ci" / "run").read_text()


def test_readme_training_script_reports_phases(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    script = tmp_path / "train.py"
    script.write_text(block.group(1))
    with run_exporter(["--simulate", "--poll-interval", "0.5"]) as url:
        proc = subprocess.run([sys.executable, str(script)], env=exporter_env({"GPU_EXPORTER_URL": url}),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr

        def phases() -> dict[str, float] | None:
            found = {s.labels["phase"]: s.value
                     for f in text_string_to_metric_families(http_get(url + "/metrics"))
                     for s in f.samples
                     if s.name == "gpu_training_phase_seconds_total" and s.labels["run"] == "mlp-demo"}
            return found or None

        shares = wait_until(phases, 10, what="the README run's phases")
        steps = [s.value for f in text_string_to_metric_families(http_get(url + "/metrics")) for s in f.samples
                 if s.name == "gpu_training_steps_total" and s.labels["run"] == "mlp-demo"]
    assert {"data", "compute", "metrics", "other"} <= shares.keys()
    assert shares["compute"] > 0 and shares["metrics"] > 0 and shares["data"] > 0
    assert steps == [3 * 4096 // 64]  # 3 epochs of 64 batches, all delivered by the final push
