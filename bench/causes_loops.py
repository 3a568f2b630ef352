"""Training jobs of the cause-accuracy bench that the tests' loops lack as they are (bench/causes_accuracy.py).

Each is a test loop run unchanged but for what this module adds:

* ``async PLAN URL SECONDS``: a loop of tests/async_loops.py on its asynchronous simulated GPU (uuid, run name and
  collective group from ``$ASYNC_LOOP_UUID``, ``$ASYNC_LOOP_RUN``, ``$ASYNC_LOOP_GROUP`` as that module reads them;
  kernel shares from ``$GPU_SIM_KERNEL``). Two plans are added: ``cm`` (both ranks spend most of the step in a
  large all-reduce: communication-bound) and ``allocator`` (:class:`ThrashingDevice`: every step's first kernel
  needs memory the caching allocator cannot give from its cache, so it frees the cache, which waits for the
  stream, and retries; ``torch.cuda.memory_stats()`` counts each retry, as PyTorch's ``num_alloc_retries`` does).
* ``integration INTEGRATION LOOP URL UUID SECONDS RUN``: a job of tests/integration_loops.py (``watch``,
  ``lightning``, ``transformers``) under the run name ``RUN`` (that module's own ``main`` derives the name from
  the integration and loop, so two jobs of the same loop with other kernels would share it), without the file of
  its own timers that the tests read (:func:`_integration`). Plans added:
  ``gpu_bound`` (:data:`GPU_BOUND`); ``augment`` (host work in the step, HW: the model's forward first runs
  :func:`augment`, numpy and Python on the host, inside compute); ``callback_work`` (callback-bound, CB: a
  callback of the job's own, :func:`bookkeeping` in Lightning's ``on_train_batch_end`` or the Trainer's
  ``on_step_end``, neither a metric nor a checkpoint); ``tiny`` (framework overhead, FO: a one-weight model in
  batches of 4, the framework's own Python between its few operators; Lightning: tests/test_code_causes_e2e.py's
  job, the Trainer: :func:`tiny_transformers`).

Run as a script (the tests' folder goes on ``sys.path`` here)::

    ASYNC_LOOP_UUID=GPU-x ASYNC_LOOP_RUN=x GPU_SIM_DEVICE_DIR=/tmp/ch python bench/causes_loops.py async cm URL 60
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "tests", REPO / "exporter"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

RETRY_SECONDS = 0.1
"""What one allocator retry costs with the GPU idle: the stream drained (cudaFree synchronizes), the cached blocks
freed and the request malloc'ed again."""


def _async(plan: str, url: str, seconds: float) -> None:
    import async_loops
    from gpu_exporter.simulate import device, torch_cuda

    async_loops.PLANS["cm"] = async_loops.Plan(data=0.005, kernels=0.03, allreduce=0.12)
    async_loops.PLANS["allocator"] = async_loops.Plan(data=0.003, kernels=0.1, launches=4)
    if plan == "allocator":
        base_device, base_install = device.AsyncDevice, torch_cuda.install

        class ThrashingDevice(base_device):  # type: ignore[valid-type,misc]
            """An AsyncDevice whose caching allocator misses once a step, at the step's first kernel."""

            retries = 0
            _fresh = False

            def doing(self, what: str) -> None:
                super().doing(what)
                self._fresh = what == "compute"

            def launch(self, seconds: float, cpu_seconds: float = 0.0, **shares: Any) -> None:
                if self._fresh:
                    self._fresh = False
                    self.free_and_retry(RETRY_SECONDS)
                    self.retries += 1
                super().launch(seconds, cpu_seconds, **shares)

        def install(gpu: Any, **kwargs: Any) -> Any:
            import torch

            undo = base_install(gpu, **kwargs)
            stats = torch.cuda.memory_stats
            torch.cuda.memory_stats = lambda device=None: {**stats(device), "num_alloc_retries": gpu.retries}
            return undo

        device.AsyncDevice = ThrashingDevice  # type: ignore[misc]
        torch_cuda.install = install  # type: ignore[assignment]
    async_loops.train(plan, url, seconds)


GPU_BOUND = (16, 0.003, 1.0, 0.0, 0.0)
"""The ``gpu_bound`` plan of tests/integration_loops.py's jobs (batch, data, compute, metrics, checkpoint seconds):
1 s of compute per step. The tests' ``healthy`` (0.25 s) left its GPU 83-86% busy in a trial on this 2-core machine
at load 12-14 (the step's Python and waits stretch under load): on the 85% target line, not a clear GPU-bound job."""
GPU_BOUND_MATMUL = 384
"""The ``gpu_bound`` jobs' matrices (the module's MATMUL is 192): with 1 s of compute a step, the full run at load
16-20 still left those GPUs 85-89% busy, most of the idle time the Python between two operators of the compute
box; operators 8 times as long leave that gap an eighth as large a share."""


OWN_CODE_PLAN = (16, 0.005, 0.05, 0.0, 0.0)
"""The ``augment`` and ``callback_work`` plans of tests/integration_loops.py's jobs: the tests' 50 ms compute step;
the job's own work comes on top (:data:`AUGMENT_SECONDS`, :data:`CALLBACK_SECONDS`)."""
AUGMENT_SECONDS = 0.05
"""Seconds :func:`augment` works on each batch (inside compute, the GPU idle): about half the step."""
CALLBACK_SECONDS = 0.05
"""Seconds the job's own callback (:func:`bookkeeping`) works each step: about half the step."""


def augment(x: Any) -> Any:
    """A host-side augmentation in the model's forward: numpy flips and noise and a Python pass over the values,
    again and again for :data:`AUGMENT_SECONDS` (a time box, so the share of the step holds under load)."""
    import numpy as np
    import torch

    deadline = time.perf_counter() + AUGMENT_SECONDS
    a, rng, scale = x.detach().numpy(), np.random.default_rng(0), 0.0
    while time.perf_counter() < deadline:
        a = np.ascontiguousarray(a[:, ::-1]) + rng.normal(0, 0.01, a.shape)
        for row in a:
            for value in row:
                scale += float(value) * 1e-9
    return torch.from_numpy(a.astype(np.float32)) * (1.0 + scale)


def bookkeeping(weights: dict[int, float]) -> None:
    """A callback's own work that is no metric and no checkpoint: a curriculum's per-sample weights kept in a Python
    dict, updated for :data:`CALLBACK_SECONDS` every step."""
    deadline, i = time.perf_counter() + CALLBACK_SECONDS, 0
    while time.perf_counter() < deadline:
        for k in range(256):
            weights[k] = weights.get(k, 1.0) * 0.999 + 0.001 * ((i * k) % 7)
        i += 1


def _augmenting(jobs: Any) -> None:
    """tests/integration_loops.py's ``parts`` with a model whose training forward runs :func:`augment` first (the
    Lightning and Trainer integrations count a model's call as compute; the rest of a step is metrics there)."""
    parts = jobs.parts

    def augmenting_parts(loop: str) -> dict[str, Any]:
        p: dict[str, Any] = parts(loop)
        net = p["Net"]

        class AugmentingNet(net):  # type: ignore[misc,valid-type]
            def forward(self, x: Any, labels: Any = None) -> Any:
                if self.training and p["torch"].is_grad_enabled():
                    x = augment(x)
                return super().forward(x, labels)

        p["Net"] = AugmentingNet
        return p

    jobs.parts = augmenting_parts


def _with_callback(integration: str) -> None:
    """Every Trainer the job makes gets a callback of the job's own that runs :func:`bookkeeping` each step."""
    weights: dict[int, float] = {}
    if integration == "lightning":
        import lightning.pytorch as pl

        class Curriculum(pl.Callback):
            def on_train_batch_end(self, *args: Any) -> None:
                bookkeeping(weights)

        lightning_trainer = pl.Trainer

        class LightningTrainer(lightning_trainer):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, callbacks: Any = None, **kwargs: Any) -> None:
                super().__init__(*args, callbacks=[*(callbacks or []), Curriculum()], **kwargs)

        pl.Trainer = LightningTrainer  # type: ignore[misc]
    elif integration == "transformers":
        import transformers.trainer as hf  # ``from transformers import Trainer`` reads it here; the package's
        from transformers import TrainerCallback  # lazy attribute, once read, does not take an assignment

        class TrainerCurriculum(TrainerCallback):
            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                bookkeeping(weights)

        hf_trainer = hf.Trainer

        class HfTrainer(hf_trainer):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, callbacks: Any = None, **kwargs: Any) -> None:
                super().__init__(*args, callbacks=[*(callbacks or []), TrainerCurriculum()], **kwargs)

        hf.Trainer = HfTrainer  # type: ignore[misc]
    else:
        sys.exit(f"causes_loops: error: callback_work needs lightning or transformers, not {integration!r}")


def tiny_transformers(url: str, uuid: str, seconds: float, run: str) -> None:
    """framework overhead (FO) under the Trainer: tests/test_code_causes_e2e.py's tiny model (one weight, a square's
    mean, batches of 4 made once) trained by a Hugging Face ``Trainer`` with the callback, on an ops-mode device GPU."""
    import torch
    from gpu_exporter.simulate.device import OpsDevice
    from gpu_exporter.training.transformers import GpuExporterCallback
    from transformers import Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = OpsDevice(uuid).start()

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1, bias=False)

        def forward(self, x: Any, labels: Any = None) -> Any:
            return {"loss": self.net(x).square().mean()}

    class Stop(TrainerCallback):
        end = time.monotonic() + seconds

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if time.monotonic() > self.end:
                control.should_training_stop = True

    samples = [{"x": torch.randn(8), "labels": 0} for _ in range(256)]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=10**7,
                             learning_rate=0.01, report_to="none", disable_tqdm=True, logging_strategy="no",
                             use_cpu=True, dataloader_num_workers=0, save_strategy="no")
    trainer = Trainer(model=Tiny(), args=args, train_dataset=samples,
                      callbacks=[GpuExporterCallback(run, url=url, uuid=uuid, push_interval=0.5), Stop()])
    try:
        trainer.train()
    finally:
        device.close()


def _tiny(integration: str, url: str, uuid: str, seconds: float, run: str) -> None:
    if integration == "transformers":
        tiny_transformers(url, uuid, seconds, run)
    elif integration == "lightning":
        import test_code_causes_e2e as e2e

        e2e.LIGHTNING_UUID = uuid  # its run is named lightning-tiny
        e2e.lightning_job(url, seconds)
    else:
        sys.exit(f"causes_loops: error: tiny needs lightning or transformers, not {integration!r}")


def _integration(integration: str, loop: str, url: str, uuid: str, seconds: str, run: str) -> None:
    """A job of tests/integration_loops.py. It writes no file of its own timers and the device's account
    (``integration_loops.report``, the tests' ground truth; the bench reads the device's channel itself): the
    loops call that from their per-step hooks (the Trainer's ``Stop.on_step_end``, the LightningModule's
    ``on_train_batch_end``), and the device's account walks its whole history, so the write took longer the longer
    the job ran; in a trial the Trainer integration counted ``Stop.on_step_end`` (the job's own callback) at 20% of
    the step after two minutes, on callback-bound's line, and Lightning counted the same work in its data phase."""
    if loop == "tiny":
        _tiny(integration, url, uuid, float(seconds), run)
        return
    import integration_loops as jobs

    jobs.ALL_PLANS["gpu_bound"] = GPU_BOUND
    jobs.ALL_PLANS["augment"] = jobs.ALL_PLANS["callback_work"] = OWN_CODE_PLAN
    if loop == "gpu_bound":
        jobs.MATMUL = GPU_BOUND_MATMUL
    elif loop == "augment":
        _augmenting(jobs)
    elif loop == "callback_work":
        _with_callback(integration)

    jobs.UUID.append(uuid)
    jobs.RUNNERS[integration](loop, url, uuid, float(seconds), run)
    for gpu in jobs.DEVICE:
        gpu.close()


def main(argv: list[str]) -> None:
    kind, *rest = argv
    if kind == "async":
        plan, url, seconds = rest
        _async(plan, url, float(seconds))
    elif kind == "integration":
        _integration(*rest)
    else:
        sys.exit(f"causes_loops: error: unknown kind {kind!r} (async, integration)")


if __name__ == "__main__":
    main(sys.argv[1:])
