"""The matrix of the cause-accuracy bench (bench/causes_accuracy.py): every injected bottleneck, in every shape of
training job it applies to, each a job of the tests' loops on its own simulated GPU that does its own work.

A :class:`Case` is one GPU: the cause injected into the job that runs on it (``healthy``: none) and the shape of
that job. A :class:`Job` is one process (a DDP job: one per rank pair) with the cases it covers. The jobs run in
waves (:data:`WAVES`), all jobs of a wave at once on one simulated node; a wave holds jobs of similar cost so that
the 2-core machine is not asked to start nine Lightning and nine Transformers jobs at the same moment.

How each bottleneck is injected (the loops are the tests' own, see their modules):

=====================  ============================================================================================
cause                  injected as
=====================  ============================================================================================
input_bound (M1)       the loader waits for slow storage (async ``input_item``; ops ``input_bound``; a DDP rank)
metrics_bound (M2)     Python metrics after ``.cpu()`` / in ``compute_metrics`` / in ``training_step`` / in a
                       callback of the job's own
batch_too_small (M3)   hundreds of tiny kernels, each costing more CPU to issue than the GPU needs (async
                       ``launch_bound``), a batch of 2 (ops ``batch2``); little GPU memory used
sm_batch_too_small     a busy GPU whose kernels keep a quarter of the SMs active (``GPU_SIM_KERNEL`` sm=0.25),
                       little GPU memory used
tensor_cores_idle      a busy GPU whose kernels run on the SMs without the tensor pipe (sm=0.9, tensor=0)
memory_bound           a busy GPU whose kernels wait on DRAM (sm=0.3, dram=0.8)
allocator (M4)         every step's first kernel misses the caching allocator: cache freed (stream drained), retry
checkpoint (CK)        state_dict copied to the CPU and written / ModelCheckpoint / a callback's ``torch.save``
                       then 100 ms more on the file in the same hook (Lightning and the Trainer)
callback_bound (CB)    a callback of the job's own spends 50 ms a step in Python that is neither a metric (a
                       callback updating a torchmetrics metric is M2 by the table) nor a checkpoint (Lightning's
                       ``on_train_batch_end``, the Trainer's ``on_step_end``: bench/causes_loops.py ``callback_work``)
framework_overhead     a one-weight model in batches of 4 under Lightning or the Trainer: the framework's own
(FO)                   Python between its few operators (bench/causes_loops.py ``tiny``)
host_work (HW)         the model's forward first augments the batch for 50 ms in numpy and Python on the host,
                       inside compute (plain loop, Lightning, Trainer: bench/causes_loops.py ``augment``)
straggler (ST)         rank 0 of a 2-rank job whose rank 1 loads slowly (rank 1's own case is M1)
communication_bound    both ranks spend most of the step in all-reduces alike
healthy                GPU-bound loops (default kernels: sm 0.9, tensor 0.6, dram 0.3); the ops-mode ones compute
                       1 s a step (bench/causes_loops.py GPU_BOUND), the GPU-level causes' loops too
=====================  ============================================================================================
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
LOOPS = REPO / "bench" / "causes_loops.py"

CAUSES = ("input_bound", "metrics_bound", "batch_too_small", "sm_batch_too_small", "tensor_cores_idle",
          "memory_bound", "allocator", "checkpoint", "callback_bound", "framework_overhead", "host_work", "straggler",
          "communication_bound", "healthy")
"""Every cause the bench injects, in the order the document lists them (``healthy``: none injected)."""
KERNELS = {"tensor_cores_idle": "sm=0.9,tensor=0,dram=0.2", "memory_bound": "sm=0.3,tensor=0.1,dram=0.8",
           "sm_batch_too_small": "sm=0.25,tensor=0.15,dram=0.1"}
"""The kernel shares (``$GPU_SIM_KERNEL``) of the GPU-level causes: a healthy loop whose kernels use the GPU so."""
SMALL, PAIR, HALF, FULL, LARGE = 4, 6, 30, 48, 60
"""GiB of the 80 used on a GPU: a small batch's, a DDP rank's (as tests/scenarios/ddp-e2e.yaml), a loop's, a loop's
whose batch cannot simply grow (the FO and HW jobs, as tests/scenarios/code-causes.yaml: M3 does not apply), a
GPU-bound loop's."""

SHAPES = {"loop-async": "plain loop, async CUDA stream (tests/async_loops.py)",
          "loop-watch": "plain PyTorch loop under training.watch, ops-mode GPU (tests/integration_loops.py, "
                        "tests/cause_loops.py)",
          "lightning": "Lightning Trainer with GpuExporterCallback (tests/integration_loops.py)",
          "transformers": "Hugging Face Trainer with GpuExporterCallback (tests/integration_loops.py)",
          "ddp-async": "2-rank DDP, emulated NCCL all-reduce on async streams (tests/async_loops.py)",
          "ddp-gloo": "2-rank DistributedDataParallel over gloo, ops-mode GPUs (tests/ddp_loops.py)"}


@dataclass(frozen=True)
class Case:
    """One simulated GPU: the job's shape, the cause injected (``healthy``: none), its run name and memory."""

    shape: str
    cause: str
    uuid: str
    run: str
    memory_gib: float


@dataclass
class Job:
    """One process of a wave and the cases (GPUs) it covers."""

    argv: list[str]
    cases: list[Case]
    env: dict[str, str] = field(default_factory=dict)


def _uuid(shape: str, name: str) -> str:
    return f"GPU-acc-{shape}-{name}".replace("_", "-")


def _async(shape: str, name: str, plan: str, cause: str, memory: float, seconds: float,
           kernel: str = "") -> Job:
    uuid, run = _uuid(shape, name), f"{shape}-{name}".replace("_", "-")
    env = {"ASYNC_LOOP_UUID": uuid, "ASYNC_LOOP_RUN": run, **({"GPU_SIM_KERNEL": kernel} if kernel else {})}
    return Job([sys.executable, str(LOOPS), "async", plan, "{url}", str(seconds)],
               [Case(shape, cause, uuid, run, memory)], env)


def _async_pair(name: str, plans: tuple[str, str], causes: tuple[str, str], seconds: float) -> list[Job]:
    run = f"ddp-async-{name}".replace("_", "-")
    jobs = []
    for rank, (plan, cause) in enumerate(zip(plans, causes, strict=True)):
        uuid = _uuid("ddp-async", f"{name}-{rank}")
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "ASYNC_LOOP_GROUP": run, "ASYNC_LOOP_RUN": run,
               "ASYNC_LOOP_UUID": uuid}
        jobs.append(Job([sys.executable, str(LOOPS), "async", plan, "{url}", str(seconds)],
                        [Case("ddp-async", cause, uuid, run, PAIR)], env))
    return jobs


def _integration(shape: str, loop: str, cause: str, memory: float, seconds: float, kernel: str = "",
                 name: str = "") -> Job:
    name = name or loop
    uuid, run = _uuid(shape, name), f"{shape}-{name}".replace("_", "-")
    integration = "watch" if shape == "loop-watch" else shape
    return Job([sys.executable, str(LOOPS), "integration", integration, loop, "{url}", uuid, str(seconds), run],
               [Case(shape, cause, uuid, run, memory)], {"GPU_SIM_KERNEL": kernel} if kernel else {})


def _framework(shape: str, seconds: float) -> tuple[list[Job], list[Job]]:
    """The cases of one framework integration (``loop-watch``, ``lightning``, ``transformers``): those that leave
    the GPU idle part of the step, and the GPU-bound ones (healthy and the kernels of the GPU-level causes)."""
    idle = [_integration(shape, "input_bound", "input_bound", HALF, seconds),
            _integration(shape, "metrics_heavy", "metrics_bound", HALF, seconds),
            _integration(shape, "checkpoint_heavy", "checkpoint", HALF, seconds)]
    if shape == "lightning":
        idle += [_integration(shape, "step_metric", "metrics_bound", HALF, seconds),
                 _integration(shape, "callback_save", "checkpoint", HALF, seconds)]
    if shape in ("lightning", "transformers"):  # the callback's work is a torchmetrics metric: M2 by the table
        idle.append(_integration(shape, "callback_metric", "metrics_bound", HALF, seconds))
    bound = [_integration(shape, "gpu_bound", "healthy", LARGE, seconds, name="healthy")]
    bound += [_integration(shape, "gpu_bound", cause, SMALL if cause == "sm_batch_too_small" else LARGE, seconds,
                           kernel, name=cause) for cause, kernel in KERNELS.items()]
    return idle, bound


def _own_code(seconds: float) -> list[Job]:
    """The causes of the job's own code and the framework's (CB, FO, HW) and the Trainer's saving callback (CK):
    one wave, so that it can run on its own (``--wave own-code``)."""
    return [_integration("loop-watch", "augment", "host_work", FULL, seconds),
            *(_integration(shape, loop, cause, memory, seconds)
              for shape in ("lightning", "transformers")
              for loop, cause, memory in (("augment", "host_work", FULL), ("callback_work", "callback_bound", HALF),
                                          ("tiny", "framework_overhead", FULL))),
            _integration("transformers", "callback_save", "checkpoint", HALF, seconds)]


def waves(seconds: float) -> dict[str, list[Job]]:
    """Every job, by wave; each runs ``seconds`` at most (the bench stops it once it is judged).

    The GPU-bound jobs of the ops-mode shapes (a real CPU job busy in torch operators all step) get waves of their
    own, four at a time: on 2 cores, more of them at once starve each other's short waits and leave their GPUs
    below the target, which the device's own account then shows (the document prints it beside every case)."""
    s = "loop-async"
    loop = [_async(s, "input_item", "input_item", "input_bound", HALF, seconds),
            _async(s, "metrics_cpu", "metrics_cpu", "metrics_bound", HALF, seconds),
            _async(s, "launch_bound", "launch_bound", "batch_too_small", SMALL, seconds),
            _async(s, "checkpoint_copy", "checkpoint_copy", "checkpoint", HALF, seconds),
            _async(s, "allocator", "allocator", "allocator", HALF, seconds),
            _async(s, "healthy_item", "healthy_item", "healthy", LARGE, seconds)]
    loop += [_async(s, cause, "healthy_item", cause, SMALL if cause == "sm_batch_too_small" else LARGE, seconds,
                    kernel) for cause, kernel in KERNELS.items()]
    loop += _async_pair("straggler", ("ddp_fast", "ddp_slow"), ("straggler", "input_bound"), seconds)
    loop += _async_pair("cm", ("cm", "cm"), ("communication_bound", "communication_bound"), seconds)
    watch, watch_bound = _framework("loop-watch", seconds)
    batch2 = _uuid("loop-watch", "batch2")
    watch.append(Job([sys.executable, str(TESTS / "cause_loops.py"), "batch2", "{url}", "{tmp}/batch2.pt",
                      str(seconds)], [Case("loop-watch", "batch_too_small", batch2, "batch2", SMALL)],
                     {"CAUSE_LOOP_UUID": batch2}))
    ddp = [Job([sys.executable, str(TESTS / "ddp_loops.py"), job, "{url}", str(seconds)],
               [Case("ddp-gloo", cause, f"GPU-ddp-{job}-{rank}", job, PAIR) for rank, cause in enumerate(causes)])
           for job, causes in (("straggler", ("straggler", "input_bound")),
                               ("allreduce", ("communication_bound", "communication_bound")))]
    lightning, lightning_bound = _framework("lightning", seconds)
    transformers, transformers_bound = _framework("transformers", seconds)
    return {"async": loop, "watch+ddp": watch + ddp, "watch-bound": watch_bound, "lightning": lightning,
            "lightning-bound": lightning_bound, "transformers": transformers, "transformers-bound": transformers_bound,
            "own-code": _own_code(seconds)}


def scenario(cases: list[Case]) -> str:
    """The simulated node's scenario: one device GPU (busy only with its job's work) per case."""
    lines = ["# Written by bench/causes_accuracy.py: one device GPU per case of the cause-accuracy bench.", "gpus:"]
    for i, case in enumerate(cases):
        lines.append(f'  - {{name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: "{case.uuid}",'
                     f' device: true, processes: [{{pid: {76000 + i}, name: "python train.py", '
                     f"memory_gib: {case.memory_gib}}}]}}")
    return "\n".join(lines) + "\n"
