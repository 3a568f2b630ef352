"""Loops for the real-GPU check (bench/real_gpu.py) that NVML's utilization cannot tell apart, and GPM can.

NVML's utilization is the share of time in which any kernel ran. A GPU at 100% may still keep most of its SMs
idle (a small batch), run matrix products without its tensor cores (fp32), or wait on memory (elementwise
work). GPM (Hopper and newer) measures SM activity, tensor-pipe activity and DRAM bandwidth; the exporter
reads them from NVML (``nvmlGpmSampleGet`` and ``nvmlGpmMetricsGet``, gpu_exporter/collectors/gpm.py) into
``gpu_sm_active_ratio``, ``gpu_tensor_active_ratio`` and ``gpu_dram_bandwidth_utilization_ratio``. Each
variant below runs contrasting runs, one after the other, each instrumented with ``gpu_exporter.training``;
the check samples the exporter every second during each run's window and prints NVML's utilization (the
exporter's busy counter, and nvidia-smi's) beside the three GPM activities (:func:`print_activity`).

===============  ==========================  ============================================  ====================
variant          runs                        per step                                      expected verdict
===============  ==========================  ============================================  ====================
``batch-size``   ``batch-size-small``,       forward, backward and SGD through 4 bf16      SM-starved small
                 ``batch-size-large``        ``Linear(4096, 4096)`` layers at batch 8,     batch; healthy
                                             then at batch 8192: the SMs a batch fills
``precision``    ``precision-fp32``,         8 products of two 8192 x 8192 matrices in     tensor cores idle;
                 ``precision-bf16``          fp32 (TF32 off: no tensor cores), then bf16   healthy
``elementwise``  ``elementwise``             30 in-place pointwise ops on a 1 GiB fp32     memory-bound
                                             tensor: DRAM-bound, no tensor work
===============  ==========================  ============================================  ====================

Every step ends with an ``.item()``. The check passes only if each run gets its expected verdict
(:func:`passed`), as for the cause variants. In ``--simulate`` each step is one kernel on the simulated
device with the GPM shares of :attr:`Probe.sim` (stand-ins, not measurements), so the flow, the columns and
the judge are tested without a GPU; whether a real GPU's GPM reads like that is what the real run finds out.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Probe:
    """One run of a variant: ``work`` ("mlp", "matmul" or "elementwise") with ``batch`` and ``dtype``, and the
    verdict the exporter should give it.

    ``sim``: the simulated step, (GPU seconds, SM share, tensor share, DRAM share) of its one kernel."""

    name: str
    work: str
    expected: str
    batch: int = 0
    dtype: str = "bfloat16"
    sim: tuple[float, float, float, float] = (0.05, 0.9, 0.6, 0.3)


VARIANTS: dict[str, tuple[Probe, ...]] = {
    "batch-size": (Probe("small", "mlp", "sm_batch_too_small", batch=8, sim=(0.02, 0.15, 0.1, 0.05)),
                   Probe("large", "mlp", "healthy", batch=8192, sim=(0.05, 0.95, 0.6, 0.3))),
    "precision": (Probe("fp32", "matmul", "tensor_cores_idle", dtype="float32", sim=(0.05, 0.9, 0.0, 0.2)),
                  Probe("bf16", "matmul", "healthy", sim=(0.05, 0.9, 0.7, 0.3))),
    "elementwise": (Probe("elementwise", "elementwise", "memory_bound", dtype="float32",
                          sim=(0.05, 0.4, 0.0, 0.9)),),
}
"""variant -> its runs, in order."""
WIDTH, LAYERS, MATRIX, MATMULS, ELEMENTS, POINTWISE = 4096, 4, 8192, 8, 1 << 28, 30
ACTIVITY = ("sm_active", "tensor_active", "dram")
"""The GPM activities the check prints (:func:`families`)."""


def families() -> dict[str, str]:
    """Exporter family -> activity (imported when used: bench.real_gpu puts exporter/ on the path first)."""
    from gpu_exporter import catalog

    return {catalog.GPU_SM_ACTIVE_RATIO.name: "sm_active", catalog.GPU_TENSOR_ACTIVE_RATIO.name: "tensor_active",
            catalog.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO.name: "dram"}


def run_name(variant: str, probe: Probe) -> str:
    """``<variant>-<probe>``, or the variant's name for a probe named like it."""
    return variant if probe.name == variant else f"{variant}-{probe.name}"


def runs(variant: str) -> list[str]:
    """The run names of ``variant``, in order."""
    return [run_name(variant, probe) for probe in VARIANTS[variant]]


EXPECTED = {run_name(variant, probe): probe.expected for variant, probes in VARIANTS.items() for probe in probes}
"""run -> the exporter's expected verdict."""


# --- the loop process ---------------------------------------------------------------------------------------


def probe_loop(variant: str, gpu: Any, url: str, uuid: str | None, seconds: float, push: float) -> dict[str, Any]:
    """Each run of ``variant`` for ``seconds``; ``gpu`` is real_gpu.Gpu. Returns each run's own account."""
    from gpu_exporter import training

    torch = gpu.torch
    out: dict[str, Any] = {}
    for probe in VARIANTS[variant]:
        step = _step(torch, probe, gpu)
        name = run_name(variant, probe)
        run = training.start(name, url=url, uuid=uuid, push_interval=push)
        compute = run.phase("compute")
        began = time.monotonic()
        gpu.syncs.reset()
        try:
            while time.monotonic() < began + seconds:
                with compute:
                    gpu.mark("compute")
                    step()
                gpu.mark("other")
                run.step(samples=probe.batch or 1)
        finally:
            steps = run.steps
            shares = run.phase_seconds(finished=True)
            run.close()
        total = sum(shares.values()) or 1.0
        out[name] = {"steps": steps, "library_shares": {p: round(s / total, 4) for p, s in shares.items()
                                                        if s / total >= 0.0005},
                     "synchronize": gpu.syncs.counts(), "gpu_truthful": True, "truth_shares": gpu.truth(began),
                     "cpu_clock_shares": None}
        del step
        if not gpu.simulate:
            torch.cuda.empty_cache()
    return out


def _step(torch: Any, probe: Probe, gpu: Any) -> Any:
    """The function that runs one step of ``probe`` and waits for it (``.item()``)."""
    if gpu.simulate:
        seconds, sm, tensor, dram = probe.sim
        device = gpu.async_device

        def simulated() -> None:
            device.launch(seconds, sm=sm, tensor=tensor, dram=dram)
            device.item()
        return simulated
    cuda = gpu.device
    dtype = getattr(torch, probe.dtype)
    if probe.work == "mlp":
        model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))).to(cuda, dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(probe.batch, WIDTH, device=cuda, dtype=dtype)

        def mlp() -> None:
            loss = model(x).float().pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
        return mlp
    if probe.work == "matmul":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32: no tensor cores
        a = torch.randn(MATRIX, MATRIX, device=cuda, dtype=dtype)
        b = torch.randn(MATRIX, MATRIX, device=cuda, dtype=dtype)

        def matmul() -> None:
            c = a
            for _ in range(MATMULS):
                c = a @ b  # the same product again: each one a whole-GPU kernel
            c[0, 0].item()
        return matmul
    values = torch.ones(ELEMENTS, device=cuda, dtype=dtype)

    def elementwise() -> None:
        for i in range(POINTWISE):
            if i % 2:
                values.mul_(0.999)
            else:
                values.add_(0.001)
        values[0].item()
    return elementwise


# --- the check: what the exporter read from NVML's GPM, beside its utilization ------------------------------


def exporter_activity(url: str) -> dict[str, dict[str, float]]:
    """uuid -> the whole GPU's GPM activities (``sm_active``, ``tensor_active``, ``dram``) from one scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    names = families()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = names.get(s.name)
            if key is not None and "uuid" in s.labels and not s.labels.get("mig_uuid"):
                found.setdefault(s.labels["uuid"], {})[key] = s.value
    return found


def mean_activity(samples: list[dict[str, dict[str, float]]], uuid: str) -> dict[str, float] | None:
    """The mean of each activity over the samples of ``uuid`` (None when the GPU has no GPM)."""
    mine = [s[uuid] for s in samples if uuid in s]
    if not mine:
        return None
    return {key: round(sum(s.get(key, 0.0) for s in mine) / len(mine), 3) for key in ACTIVITY}


def activity_rows(results: dict[str, Any]) -> list[dict[str, str]]:
    """One row per measured run (every variant): NVML's utilization beside GPM's activities."""
    out: list[dict[str, str]] = []
    for variant, r in results["variants"].items():
        for mode, measured in r.items():
            if not isinstance(measured, dict) or "verdict" not in measured:
                continue
            gpm = measured.get("gpm") or {}
            run = str(measured.get("run", mode))
            out.append({"variant": variant, "run": run, "verdict": measured["verdict"],
                        "expected": EXPECTED.get(run, "-"),
                        "util": _pct(measured["utilization"]), "smi": _pct(measured["nvidia_smi_utilization"]),
                        **{key: _pct(gpm.get(key)) for key in ACTIVITY}})
    return out


def _pct(value: float | None) -> str:
    """A share as the package prints it (gpu_exporter.verdict's ``pct``), ``n/a`` when not measured."""
    from gpu_exporter.verdict.format import pct  # imported when used: bench.real_gpu puts exporter/ on the path

    return "n/a" if value is None else pct(value)


def print_activity(results: dict[str, Any]) -> None:
    """The third table: per run, the exporter's utilization and nvidia-smi's beside SM, tensor and DRAM activity."""
    table = activity_rows(results)
    if not table:
        return
    print(f"\n{'run':<22} {'expected':<20} {'verdict':<20} {'util':>5} {'smi':>5} {'SM':>5} {'tensor':>6} "
          f"{'DRAM':>5}   (util: NVML, the exporter's busy counter; SM, tensor, DRAM: GPM)")
    for r in table:
        print(f"{r['run']:<22} {r['expected']:<20} {r['verdict']:<20} {r['util']:>5} {r['smi']:>5} "
              f"{r['sm_active']:>5} {r['tensor_active']:>6} {r['dram']:>5}")


def activity_markdown(results: dict[str, Any]) -> str:
    """:func:`print_activity`'s table as markdown."""
    lines = ["| run | expected | verdict | utilization (NVML): exporter / nvidia-smi | SM active | tensor active "
             "| DRAM bandwidth |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['expected']} | {r['verdict']} | {r['util']} / {r['smi']} | {r['sm_active']} "
              f"| {r['tensor_active']} | {r['dram']} |" for r in activity_rows(results)]
    return "\n".join(lines) + "\n"


def passed(results: dict[str, Any]) -> bool:
    """Every probe run measured got its expected verdict."""
    return all(r["verdict"] == r["expected"] for r in activity_rows(results) if r["expected"] != "-")
