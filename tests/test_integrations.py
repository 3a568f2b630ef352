"""The one-line integrations (training.watch, Lightning, Transformers) against the jobs' own timers.

Fast tests check what the integrations leave behind (hooks removed, loader and ``torch.save``
restored, nothing heavy imported by ``gpu_exporter.training``). The slow test runs the four loops of
tests/integration_loops.py (input-bound, metrics-heavy, checkpoint-heavy, healthy) under each
integration, side by side in their own processes, pushing to a real exporter, and requires every
phase the exporter reports to be within 0.05 of the run's wall time of what the job's own timers
measured around that work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration_loops import PLANS
from prometheus_client.parser import text_string_to_metric_families
from servers import exporter_env, http_get, run_exporter

LOOPS = Path(__file__).with_name("integration_loops.py")
TOLERANCE = 0.05
PHASES = ("data", "compute", "metrics", "checkpoint")
MAIN_PHASE = {"input_bound": "data", "metrics_heavy": "metrics", "checkpoint_heavy": "checkpoint",
              "healthy": "compute"}
EXPECTED_CAUSE = {"input_bound": "input_bound", "metrics_heavy": "metrics_bound", "checkpoint_heavy": "checkpoint",
                  "healthy": None}
BUSY, MEMORY = 0.97, 30 / 80
"""A GPU that follows the job's compute share (tests/scenarios/integrations-e2e.yaml): busy, memory used."""


def verdict(shares: dict[str, float]) -> tuple[str | None, str]:
    """The cause diagnose's judge (causes.find_causes) names for these shares on a GPU busy while computing."""
    from gpu_exporter.causes import LOW, RunSignals, find_causes
    from gpu_exporter.thresholds import load_thresholds

    findings = find_causes(BUSY * shares["compute"], MEMORY, RunSignals(shares), load_thresholds())
    if not findings:
        return None, "healthy"
    first = findings[0]
    return first.cause.cause, f"{first.cause.label}{'' if first.level == LOW else ' (below target)'}"


def test_importing_the_library_imports_no_framework() -> None:
    code = ("import sys, gpu_exporter.training, gpu_exporter.training.lightning, gpu_exporter.training.transformers, "
            "gpu_exporter.training.hooks; print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', "
            "'transformers', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], env=exporter_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_watch_times_a_loop_and_close_restores_everything(tmp_path: Path) -> None:
    import torch
    from gpu_exporter import training
    from gpu_exporter.training.run import Run
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    samples: Any = [(torch.randn(4), i % 2) for i in range(12)]
    loader: DataLoader[Any] = DataLoader(samples, batch_size=4)
    save = torch.save
    run = Run("unit", uuid="")
    watcher = training.watch(model, optimizer, loader, run=run)
    assert type(loader) is not DataLoader and isinstance(loader, DataLoader) and torch.save is not save
    for epoch in range(2):
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad()
        torch.save(model.state_dict(), tmp_path / f"{epoch}.pt")
    watcher.close()
    assert (run.steps, run.samples, run.batch_size) == (6, 24, 4)
    seconds = run.phase_seconds()
    assert all(seconds[p] > 0 for p in ("data", "compute", "checkpoint")), seconds
    assert run._current is run._other
    # Everything is back: the loader's class, no hooks, torch.save calls straight through.
    assert type(loader) is DataLoader and "_gpu_exporter_data" not in vars(loader)
    assert "forward" not in vars(model)
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    before = run.phase_seconds()["checkpoint"]
    torch.save(model.state_dict(), tmp_path / "after.pt")
    model(torch.randn(1, 4)).sum().backward()
    after = run.phase_seconds()
    assert after["checkpoint"] == before and after["compute"] == seconds["compute"]


def test_watch_without_optimizer_counts_a_step_per_batch_and_refuses_bad_metrics() -> None:
    from gpu_exporter import training
    from gpu_exporter.training.run import Run

    run = Run("unit", uuid="")
    with pytest.raises(TypeError, match="metrics= takes objects with update/compute/forward"):
        training.watch(run=run, metrics=[len], checkpoints=False)
    with pytest.raises(ValueError, match="either run= or start options"):
        training.watch(run=run, url="http://127.0.0.1:1")
    loader = _Loader()
    with training.watch(loader=loader, run=run, checkpoints=False):
        assert [len(b) for b in loader] == [3, 3]
    assert (run.steps, run.samples) == (2, 6)
    assert type(loader) is _Loader


def test_watch_times_an_iterable_dataset_loader_without_len() -> None:
    import torch
    from gpu_exporter import training
    from gpu_exporter.training.run import Run
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset[Any]):
        def __iter__(self) -> Iterator[Any]:
            return iter([torch.zeros(5, 2)] * 3)

    run = Run("stream", uuid="")
    loader: DataLoader[Any] = DataLoader(Stream(), batch_size=None)
    with training.watch(loader=loader, run=run):
        assert sum(1 for _ in loader) == 3
    assert (run.steps, run.samples) == (3, 15)


@pytest.mark.slow
def test_watch_times_a_hand_written_accelerate_loop() -> None:
    import torch
    from accelerate import Accelerator  # type: ignore[import-untyped]
    from gpu_exporter import training
    from gpu_exporter.training.run import Run
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=16))
    run = Run("accelerate", uuid="")
    with training.watch(model, optimizer, loader, run=run):
        for x, y in loader:
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    assert (run.steps, run.samples) == (4, 64)
    seconds = run.phase_seconds()
    assert seconds["data"] > 0 and seconds["compute"] > 0, seconds


class _Loader:
    """An iterable loader of two batches of 3 (lists have no shape: batch_len counts tensors only)."""

    def __iter__(self) -> Iterator[Any]:
        import torch

        return iter([torch.zeros(3), torch.zeros(3)])


def _phases(exporter: str, run: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(http_get(exporter + "/metrics")):
        for s in family.samples:
            if s.name == "gpu_training_phase_seconds_total" and s.labels.get("run") == run:
                out[s.labels["phase"]] = s.value
    return out


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    with run_exporter(["--simulate"]) as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("integration", ["watch", "lightning", "pytorch_lightning", "transformers"])
def test_reported_shares_match_the_jobs_own_timers(exporter: str, integration: str, tmp_path: Path) -> None:
    jobs = {loop: subprocess.Popen([sys.executable, str(LOOPS), integration, loop, exporter, f"GPU-int-{loop}", "4",
                                    str(tmp_path / f"{loop}.json")], env=exporter_env(), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
            for loop in PLANS}
    for loop, job in jobs.items():
        _, err = job.communicate(timeout=240)
        assert job.returncode == 0, (loop, err[-3000:])
    time.sleep(0.2)
    table = {}
    verdicts: dict[str, tuple[str | None, str]] = {}
    for loop in PLANS:
        own = json.loads((tmp_path / f"{loop}.json").read_text())
        reported = _phases(exporter, f"{integration.replace('_', '-')}-{loop.replace('_', '-')}")
        total = sum(reported.values())
        assert total > 3.5, (loop, reported)
        table[loop] = {p: (round(reported.get(p, 0.0) / total, 3), round(own[p] / total, 3)) for p in PHASES}
        verdicts[loop] = verdict({p: v / total for p, v in reported.items()})
    print(f"\n{integration}: phase -> [reported share, own timers' share]; verdict")
    for loop, shares in table.items():
        print(f"  {loop}: {json.dumps(shares)}; {verdicts[loop][1]}")
    for loop, shares in table.items():
        for phase, (reported_share, own_share) in shares.items():
            assert reported_share == pytest.approx(own_share, abs=TOLERANCE), (integration, loop, phase, table)
        main = MAIN_PHASE[loop]
        assert shares[main][1] > 0.5, (loop, shares)  # the loop does what its name says
        cause, _ = verdicts[loop]
        if EXPECTED_CAUSE[loop] is not None:
            assert cause == EXPECTED_CAUSE[loop], (integration, loop, verdicts[loop])
        else:  # healthy: no warning-level cause (near the 85% target an info-level one may remain)
            assert "below target" in verdicts[loop][1] or cause is None, (integration, loop, verdicts[loop])


@pytest.mark.slow  # imports Lightning and fits a model (about 15 s)
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")  # Lightning's own use of torch's pytree
def test_lightning_callback_reports_the_training_loader_settings() -> None:
    import torch
    from gpu_exporter.training import lightning as gl
    from gpu_exporter.training.context import snapshot_context
    from gpu_exporter.training.run import Run
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    run = Run("lightning-loader", uuid="")
    data = TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,)))
    trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, callbacks=[gl.LightningCallback(run=run)])
    trainer.fit(Tiny(), DataLoader(data, batch_size=4, num_workers=0))
    assert run.steps == 3
    context = snapshot_context(run, 0)  # what the run's pushes carry
    assert {k: v for k, v in context.items() if k != "cpu_cores"} == {
        "num_workers": 0, "pin_memory": False, "persistent_workers": False, "loader_batch_size": 4}
