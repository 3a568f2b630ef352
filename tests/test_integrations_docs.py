"""docs/training.md's integration examples run as written (copied verbatim) against a real exporter.

Each ```python block of the "One-line integrations" section is a complete script. It runs in a
fresh process in an empty directory with ``GPU_EXPORTER_URL`` pointing at a real exporter, and the
run it names must arrive with its steps and its phases. The Lightning example runs a second time
with its ``import pytorch_lightning as pl`` alternative, as its comment offers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testbed import REPO, exporter_env, http_get, run_exporter

pytestmark = pytest.mark.slow

DOC = REPO / "docs" / "training.md"


def integration_examples() -> dict[str, str]:
    """Run name -> the python block that reports it, from the doc's "One-line integrations" section."""
    text = DOC.read_text()
    section = text[text.index("## One-line integrations"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return {re.findall(r'"(mlp-[a-z]+)"', block)[0]: block for block in blocks}


def test_the_doc_has_one_example_per_integration() -> None:
    assert sorted(integration_examples()) == ["mlp-hf", "mlp-lightning", "mlp-watch"]


# run name, import replacement, steps (2048 samples: 32 batches of 64 an epoch), phases that must have time
CASES = [
    ("mlp-watch", None, 3 * 32, {"data", "compute", "checkpoint"}),
    ("mlp-lightning", None, 2 * 32, {"data", "compute", "metrics", "checkpoint"}),
    ("mlp-lightning", ("import lightning.pytorch as pl", "import pytorch_lightning as pl"), 2 * 32,
     {"data", "compute", "metrics", "checkpoint"}),
    ("mlp-hf", None, 2 * 32, {"data", "compute", "metrics", "checkpoint"}),
]


@pytest.mark.parametrize(("run", "replace", "steps", "phases"), CASES,
                         ids=["watch", "lightning", "pytorch_lightning", "transformers"])
def test_doc_example_runs_and_reports(run: str, replace: tuple[str, str] | None, steps: int, phases: set[str],
                                      tmp_path: Path) -> None:
    script = integration_examples()[run]
    if replace is not None:
        assert replace[0] in script
        script = script.replace(*replace)
    (tmp_path / "train.py").write_text(script)
    with run_exporter(["--simulate"]) as url:
        proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env=exporter_env({"GPU_EXPORTER_URL": url}))
        assert proc.returncode == 0, proc.stderr[-3000:]
        samples = [s for f in text_string_to_metric_families(http_get(url + "/metrics")) for s in f.samples
                   if s.labels.get("run") == run]
    seconds = {s.labels["phase"]: s.value for s in samples if s.name == "gpu_training_phase_seconds_total"}
    assert {p for p, v in seconds.items() if v > 0} >= phases, seconds
    assert [s.value for s in samples if s.name == "gpu_training_steps_total"] == [steps]
    assert [s.value for s in samples if s.name == "gpu_training_samples_total"] == [steps * 64]
