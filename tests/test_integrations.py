"""The one-line integrations (training.watch, Lightning, Transformers) against the jobs' own timers and the device.

Fast tests check what the integrations leave behind (hooks removed, loader and ``torch.save``
restored, nothing heavy imported by ``gpu_exporter.training``). The attribution tests run a
Lightning and a Hugging Face job in the test process on an ops-mode simulated GPU (busy exactly
while the job is inside torch operators) and check what each integration calls which phase: Python
inside ``training_step`` is ``metrics``, and so are the job's own callbacks' per-step hooks (a torchmetrics
metric they update is ``metrics``, a ``torch.save`` they call is ``checkpoint``), and ``compute``
is the share of time the GPU was busy. The slow test runs the four loops of
tests/integration_loops.py (input-bound, metrics-heavy, checkpoint-heavy, healthy) under each
integration, side by side in their own processes on ops-mode devices, pushing to a real exporter,
and requires every phase the exporter reports to be within 0.05 of the run's wall time of what the
job's own timers measured around that work (compute: of the time the device was busy), and the
ladder's verdict (``verdict.ladder.judge``) for the device's utilization to be the loop's cause (the healthy
loop: healthy, or underutilized at level target).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from gpu_exporter.verdict.levels import TARGET
from integration_loops import PLANS
from prometheus_client.parser import text_string_to_metric_families

from testbed import exporter_env, http_get, run_exporter

if TYPE_CHECKING:
    from gpu_exporter.verdict.views import Verdict

LOOPS = Path(__file__).with_name("integration_loops.py")
TOLERANCE = 0.05
PHASES = ("data", "compute", "metrics", "checkpoint")
MAIN_PHASE = {"input_bound": "data", "metrics_heavy": "metrics", "checkpoint_heavy": "checkpoint",
              "healthy": "compute"}
EXPECTED_VERDICT = {"input_bound": ("input_bound",), "metrics_heavy": ("metrics_bound",),
                    "checkpoint_heavy": ("checkpoint",), "healthy": ("healthy", "underutilized")}
"""The ladder's verdict for each loop's GPU. The healthy loop's phases pass no cause's threshold, so its GPU is
healthy, or, when a busy machine holds its utilization under the target, underutilized at level target."""
MEMORY = 30 / 80
"""GPU memory used (the processes of tests/scenarios/integrations-e2e.yaml)."""


def gpu_work(truth: dict[str, Any]) -> float:
    """The share of the device's time that is GPU work: busy, and idle only between the operators of the job's compute
    boxes (the launch gaps a GPU-truthful compute phase holds too)."""
    return float(truth["busy"] + truth["idle"].get("compute", 0.0)) / float(truth["wall"])


def verdict(utilization: float, shares: dict[str, float], seconds: float) -> Verdict:
    """The verdict diagnose and the status page give a GPU this busy with one live run of these shares: the run's
    causes (verdict.causes.find_causes, as the join finds them) judged by the ladder (verdict.ladder.judge)."""
    from gpu_exporter.thresholds import load_thresholds
    from gpu_exporter.verdict.causes import find_causes
    from gpu_exporter.verdict.ladder import judge
    from gpu_exporter.verdict.signals import RunSignals
    from gpu_exporter.verdict.views import GpuView, RunView

    t = load_thresholds()
    findings = tuple(find_causes(utilization, MEMORY, RunSignals(shares), t))
    run = RunView("loop", "0", shares, seconds, since_start=True, batch_size=None, allocator_retries=0.0,
                  allocator_ooms=0.0, findings=findings)
    return judge(GpuView("GPU-int", "0", "simulated", "node", utilization, MEMORY, 1, (), (run,)), t)


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
    assert run.current_phase is run.other_phase
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
    env = exporter_env({"GPU_SIM_DEVICE_DIR": str(tmp_path / "channel")})  # each job on an ops-mode device
    jobs = {loop: subprocess.Popen([sys.executable, str(LOOPS), integration, loop, exporter, f"GPU-int-{loop}", "4",
                                    str(tmp_path / f"{loop}.json")], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
            for loop in PLANS}
    for loop, job in jobs.items():
        _, err = job.communicate(timeout=240)
        assert job.returncode == 0, (loop, err[-3000:])
    time.sleep(0.2)
    table = {}
    verdicts: dict[str, Verdict] = {}
    busy: dict[str, float] = {}
    for loop in PLANS:
        written = json.loads((tmp_path / f"{loop}.json").read_text())
        own, truth = written["own"], written["truth"]
        reported = _phases(exporter, f"{integration.replace('_', '-')}-{loop.replace('_', '-')}")
        total = sum(reported.values())
        assert total > 3.5, (loop, reported)
        busy[loop] = truth["busy"] / truth["wall"]  # the device's utilization, whatever the phases say
        table[loop] = {p: (round(reported.get(p, 0.0) / total, 3), round(own[p] / total, 3)) for p in PHASES}
        # compute against the device, over the device's window: busy, and the gaps between the compute boxes' ops
        counted = written["reported"]
        table[loop]["compute"] = (round(counted["compute"] / sum(counted.values()), 3),
                                  round(gpu_work(truth), 3))
        verdicts[loop] = verdict(busy[loop], {p: v / total for p, v in reported.items()}, total)
    print(f"\n{integration}: phase -> [reported share, own timers' share (compute: the device's)]; verdict")
    for loop, shares in table.items():
        print(f"  {loop}: {json.dumps(shares)}; {verdicts[loop].title} ({verdicts[loop].name})")
    for loop, shares in table.items():
        for phase, (reported_share, own_share) in shares.items():
            assert reported_share == pytest.approx(own_share, abs=TOLERANCE), (integration, loop, phase, table)
        main = MAIN_PHASE[loop]
        assert shares[main][1] > 0.5, (loop, shares)  # the loop does what its name says
        judged = verdicts[loop]
        assert judged.name in EXPECTED_VERDICT[loop], (integration, loop, judged)
        if judged.name == "underutilized":  # the healthy loop near the target: never the low line's warning
            assert judged.level == TARGET, (integration, loop, judged)


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


# --- What the framework integrations call which phase (in the test process, on an ops-mode device) ---------

STEP_METRIC, OWN_CALLBACK, CALLBACK_METRIC, CALLBACK_SAVE, AFTER_SAVE, PROBE, COMPUTE = (
    0.012, 0.005, 0.004, 0.006, 0.020, 0.006, 0.006)
"""Seconds per step: Python metric in the step; the job's own saving callback: plain Python, a torchmetrics metric it
updates, a torch.save it calls (slow storage), then work on the written file (hash, compress: plain Python); a second
callback of the job's own that writes nothing (PROBE, plain Python); each of forward and backward in matmuls."""
TRUTH = 0.05
"""How far (share of wall time) a phase may be from the device's account of it."""


def _attribution_parts(device: Any) -> dict[str, Any]:
    """A model whose forward and backward do COMPUTE of matmuls each, a metric, slow state; all marked on ``device``."""
    import torch
    import torchmetrics
    from gpu_exporter.simulate.device import spin

    torch.set_num_threads(1)
    weights = torch.randn(192, 192)

    def matmuls(seconds: float) -> None:
        end = time.perf_counter() + seconds
        with device.marked("compute"):
            while time.perf_counter() < end:
                weights @ weights

    class Work(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            matmuls(COMPUTE)
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            matmuls(COMPUTE)
            return grad

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 4)

        def forward(self, x: Any, labels: Any = None) -> Any:
            logits = self.a(Work.apply(x) if self.training and torch.is_grad_enabled() else x)  # type: ignore[no-untyped-call]
            if labels is None:
                return logits
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class PythonMetric(torchmetrics.Metric):
        def __init__(self) -> None:
            super().__init__()
            self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, *args: Any) -> None:
            with device.marked("metrics"):
                spin(CALLBACK_METRIC)

        def compute(self) -> Any:
            return self.total

    class SlowState:
        def __reduce__(self) -> tuple[Any, ...]:
            time.sleep(CALLBACK_SAVE)
            return (dict, ())

    def own_callback_work(metric: Any, path: Path) -> None:
        with device.marked("callback"):
            spin(OWN_CALLBACK)
        metric.update()
        with device.marked("checkpoint"):
            torch.save({"state": SlowState()}, path)
        with device.marked("after_save"):  # the hook works on the file it wrote: checkpoint too
            hashlib.sha256(path.read_bytes()).hexdigest()
            spin(AFTER_SAVE)

    def probe() -> None:
        with device.marked("probe"):
            spin(PROBE)

    def step_metric() -> None:
        with device.marked("metrics"):
            spin(STEP_METRIC)

    return {"torch": torch, "Net": Net, "PythonMetric": PythonMetric, "own_callback_work": own_callback_work,
            "step_metric": step_metric, "probe": probe}


def _shares_against_truth(run: Any, device: Any) -> dict[str, tuple[float, float]]:
    """phase -> (share the run counted, share by the device: GPU work for compute, the job's marks for the rest)."""
    truth = device.truth()
    counted = run.phase_seconds()
    total, wall = sum(counted.values()), truth["wall"]
    out = {"compute": (counted["compute"] / total, gpu_work(truth))}
    for phase in ("metrics", "checkpoint", "other", "data", "callback", "after_save", "probe", "callbacks"):
        out[phase] = (counted.get(phase, 0.0) / total, truth["cpu"].get(phase, 0.0) / wall)
    return out


def _check_attribution(shares: dict[str, tuple[float, float]], run: Any, hook: str) -> None:
    """What the run counted against the device, and how its snapshot and the verdict name the saving callback."""
    from gpu_exporter.ingest import IngestSettings, TrainingStore
    from gpu_exporter.thresholds import load_thresholds
    from gpu_exporter.verdict.causes import find_causes
    from gpu_exporter.verdict.signals import RunSignals

    print("\nphase -> (counted, device): " + ", ".join(f"{p} {c:.3f}/{t:.3f}" for p, (c, t) in shares.items()))
    assert shares["compute"][0] == pytest.approx(shares["compute"][1], abs=TRUTH), shares
    # the saving hook is checkpoint as a whole: its Python before the save, the save, the work on the file after it
    whole_hook = shares["checkpoint"][1] + shares["callback"][1] + shares["after_save"][1]
    assert shares["checkpoint"][0] == pytest.approx(whole_hook, abs=TRUTH), shares
    # the Python of the step and the torchmetrics metric the callback updates: metrics (M2), never the hooks' time
    assert shares["metrics"][0] == pytest.approx(shares["metrics"][1], abs=TRUTH), shares
    # the callback that writes nothing: its own phase, callbacks
    assert shares["callbacks"][0] == pytest.approx(shares["probe"][1], abs=TRUTH), shares
    assert shares["checkpoint"][0] > max(shares["metrics"][0], shares["callbacks"][0], shares["compute"][0]), shares

    snapshot = run.snapshot()
    top = snapshot["callbacks"][0]
    assert (top["name"], top["phase"]) == (hook, "checkpoint"), snapshot["callbacks"]
    assert snapshot["callbacks"][1]["phase"] == "callbacks", snapshot["callbacks"]
    # the exporter exports the biggest hook by name (one series), whatever else the snapshot lists
    store = TrainingStore(IngestSettings())
    assert store.handle_push(json.dumps(snapshot).encode(), "application/json", None) == (202, "accepted")
    series = [s for family in store.collect() for s in family.samples
              if s.name == "gpu_training_callback_seconds_total"]
    assert [(s.labels["callback"], s.labels["phase"]) for s in series] == [(hook, "checkpoint")], series
    # the verdict: checkpoint-bound, naming the hook (not metrics-bound)
    total = sum(snapshot["phases"].values())
    phase_shares = {p: v / total for p, v in snapshot["phases"].items()}
    callback = (hook, "checkpoint", series[0].value / total)
    findings = find_causes(0.2, MEMORY, RunSignals(phase_shares, callback=callback), load_thresholds())
    assert findings[0].cause.cause == "checkpoint", findings
    reason = findings[0].cause.reason(findings[0], "job", "0")
    print(reason)
    assert f"`{hook}` takes" in reason, reason


@pytest.mark.slow  # imports Lightning and fits a model (about 15 s)
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_lightning_counts_python_in_the_step_as_metrics_and_own_callbacks_by_name(tmp_path: Path) -> None:
    from gpu_exporter.simulate.device import OpsDevice
    from gpu_exporter.training import lightning as gl
    from gpu_exporter.training.hooks import SaveTimer
    from gpu_exporter.training.run import Run
    from lightning.pytorch import Callback, LightningModule, Trainer
    from torch.utils.data import DataLoader

    device = OpsDevice("GPU-unit-lightning", tmp_path)
    run = Run("unit-lightning", uuid="")  # the same window as the device's account
    try:
        p = _attribution_parts(device)
        device.start()
        torch = p["torch"]

        class Module(LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = p["Net"]()

            def training_step(self, batch: Any, batch_idx: int) -> Any:
                x, y = batch
                logits = self.net(x)
                p["step_metric"]()  # Python in the step: metrics, not compute
                return torch.nn.functional.cross_entropy(logits, y)

            def configure_optimizers(self) -> Any:
                return torch.optim.SGD(self.parameters(), lr=0.01)

        class SaveEvery(Callback):  # the job's own callback: saves, then works on the file: checkpoint as a whole
            def __init__(self) -> None:
                self.metric = p["PythonMetric"]()

            def on_train_batch_end(self, *args: Any) -> None:
                p["own_callback_work"](self.metric, tmp_path / "own.pt")

        class Probe(Callback):  # the job's own callback that writes nothing: callbacks
            def on_train_batch_start(self, *args: Any) -> None:
                p["probe"]()

        data: Any = [(torch.randn(16, 8), torch.arange(16) % 4) for _ in range(40)]
        callback = gl.LightningCallback(run=run)
        trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          callbacks=[SaveEvery(), Probe(), callback])
        trainer.fit(Module(), DataLoader(data, batch_size=None))
        shares = _shares_against_truth(run, device)
    finally:
        device.close()
    assert run.steps == 40
    _check_attribution(shares, run, "SaveEvery.on_train_batch_end")
    # on_train_end took every hook and wrapper away
    module = trainer.lightning_module
    assert not {"training_step", "backward"} & set(vars(module)) and not module._forward_pre_hooks
    assert not trainer.optimizers[0]._optimizer_step_post_hooks and not SaveTimer._active


@pytest.mark.slow  # imports Transformers and trains a model (about 15 s)
def test_transformers_counts_python_in_the_step_as_metrics_and_own_callbacks_by_name(tmp_path: Path) -> None:
    from gpu_exporter.simulate.device import OpsDevice
    from gpu_exporter.training.hooks import SaveTimer
    from gpu_exporter.training.run import Run
    from gpu_exporter.training.transformers import GpuExporterCallback
    from transformers import Trainer, TrainerCallback, TrainingArguments

    device = OpsDevice("GPU-unit-transformers", tmp_path)
    run = Run("unit-transformers", uuid="")  # the same window as the device's account
    try:
        p = _attribution_parts(device)
        device.start()
        torch = p["torch"]

        class SaveEvery(TrainerCallback):  # the job's own callback: saves, then works on the file: checkpoint
            def __init__(self) -> None:
                self.metric = p["PythonMetric"]()

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                p["own_callback_work"](self.metric, tmp_path / "own.pt")

        class Probe(TrainerCallback):  # the job's own callback that writes nothing: callbacks
            def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
                p["probe"]()

        class WithMetric(Trainer):
            def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                             num_items_in_batch: Any = None) -> Any:
                out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                p["step_metric"]()  # Python in the step: metrics, not compute
                return out

        data = [{"x": torch.randn(8), "labels": i % 4} for i in range(16 * 40)]
        args = TrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=1, per_device_train_batch_size=16,
                                 report_to="none", use_cpu=True, disable_tqdm=True, logging_strategy="no",
                                 save_strategy="no", learning_rate=0.01)
        trainer = WithMetric(model=p["Net"](), args=args, train_dataset=data,
                             callbacks=[GpuExporterCallback(run=run), SaveEvery(), Probe()])
        trainer.train()
        shares = _shares_against_truth(run, device)
    finally:
        device.close()
    assert run.steps == 40
    _check_attribution(shares, run, "SaveEvery.on_step_end")
    assert not {"training_step", "_prepare_inputs"} & set(vars(trainer)) and "backward" not in vars(trainer.accelerator)
    model: Any = trainer.model
    assert not model._forward_pre_hooks and not SaveTimer._active


def test_phase_stack_returns_to_each_phase_whatever_the_order_of_entering() -> None:
    """A metric inside a forward inside the step's metrics (metrics entered again below the top) must not loop."""
    import torch
    from gpu_exporter.training.hooks import PhaseStack, model_parts, time_forward, time_optimizer_step
    from gpu_exporter.training.run import Run

    run = Run("stack", uuid="")
    stack = PhaseStack(run)
    compute, metrics = run.phase("compute"), run.phase("metrics")
    seen: list[str] = []

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(2, 2)

        def forward(self, x: Any) -> Any:
            with stack.timed(metrics):  # e.g. a torchmetrics metric updated inside the model
                seen.append(run.current_phase.name)
            seen.append(run.current_phase.name)
            return self.a(x)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    undo_forward = time_forward(model_parts(model), stack, compute)
    _, undo_step = time_optimizer_step([optimizer], stack, compute)
    with stack.timed(metrics):
        model(torch.randn(1, 2)).sum().backward()
        seen.append(run.current_phase.name)
        optimizer.step()
        seen.append(run.current_phase.name)
    seen.append(run.current_phase.name)
    assert seen == ["metrics", "compute", "metrics", "metrics", "other"]
    class Broken(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ZeroDivisionError

    broken = Broken()
    undo_broken = time_forward([broken], stack, compute)
    with pytest.raises(ZeroDivisionError), stack.timed(metrics):  # a forward that raises still ends compute
        broken(torch.randn(1, 2))
    assert run.current_phase is run.other_phase
    undo_forward()
    undo_step()
    undo_broken()
    assert not model._forward_pre_hooks and not model._forward_hooks and not optimizer._optimizer_step_post_hooks
