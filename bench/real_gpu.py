"""The real-GPU check: the same training loops as the cause tests, on a real CUDA GPU, judged by the exporter.

On a machine with an NVIDIA GPU, ``python -m bench.real_gpu`` (from a checkout, with torch built for CUDA)
starts ``gpu-exporter`` on the real driver and runs, one after the other on GPU 0, these loops, each
instrumented with ``gpu_exporter.training``:

==============  ======================================================================  =====================
variant         per step                                                                expected
==============  ======================================================================  =====================
``input-bound`` the README's loop: CPU decoding in ``data`` (0.11 s), kernels queued    input-bound (M1)
                in ``compute`` (0.04 s of GPU time), ``loss.item()`` in ``metrics``
``healthy``     GPU-bound: 0.3 s of kernels on a batch already on the GPU, a            healthy
                ``loss.item()`` every step
``batch-of-2``  batch 2 through a small, deep MLP and a foreach-less Adam: many tiny    batch too small (M3)
                kernels, each cheaper to run than to issue
``lightning``   ``Trainer(callbacks=[GpuExporterCallback(...)])``; ``training_step``    metrics-bound (M2)
                computes a macro F1 in Python (0.1 s) on ``.cpu()`` predictions
``ddp``         2 processes on the one GPU (NCCL if it accepts two ranks on one         rank 0: straggler
                device, else gloo), ``DistributedDataParallel``; rank 1 decodes its     (ST); rank 1:
                batches slowly (0.2 s), rank 0 waits for it in the gradient all-reduce  input-bound (M1)
==============  ======================================================================  =====================

Three more variants (bench/real_gpu_loops.py) isolate what NVML's utilization cannot tell apart: small against
large batch (``batch-size``), fp32 against bf16 matrix products (``precision``) and an elementwise-bound step
(``elementwise``), expecting SM-starved small batch, tensor cores idle and memory-bound where they should. For
every run measured, a third table prints NVML's utilization beside GPM's SM, tensor and DRAM activity (the
exporter's ``gpu_sm_active_ratio``, ``gpu_tensor_active_ratio`` and ``gpu_dram_bandwidth_utilization_ratio``,
sampled every second in the window).

Each cause variant runs twice in one process: first with the library's defaults (GPU-truthful phases: a CUDA event
at every phase change, never a synchronize) for ``--seconds``, then as run ``<variant>-sync`` with
``sync_every=1`` (the diagnostic: synchronize at every phase change) for ``--sync-seconds``. For each run the
check records the phase shares the exporter got (``gpu-exporter diagnose --url ... --run NAME --window W``), the
diagnose verdict, the GPU's utilization from the exporter's busy counter (``gpu_busy_seconds_total`` over the
window) beside nvidia-smi's ``utilization.gpu`` sampled every second in the same window, and how often
``torch.cuda.synchronize`` was called during the run (the loop wraps it with a counter; ``library`` counts the
calls from gpu_exporter's own code). The loop itself adds its whole-run phases by both clocks (GPU-truthful
and the CPU's). Lightning is skipped when it is not installed. Everything goes to ``--output`` (JSON) and,
with ``--markdown``, to a table for docs/real-gpu.md. Exit status: 0 when every default run got its expected
verdict (and every run of real_gpu_loops its own) and the library never synchronized on the default path, 1
otherwise, 2 without nvidia-smi, with bad arguments or with an output path it cannot write (checked before
anything runs). ``--output`` defaults to ``real-gpu-results.json`` in the current folder.

``--simulate`` (what CI runs, tests/test_real_gpu_bench.py) runs the same loops and the same library code
paths with no GPU, all variants at once: the exporter on bench/real_gpu.yaml, whose GPUs are ``device: true``
(busy exactly while the loop's own simulated device works, read through ``$GPU_SIM_DEVICE_DIR``). The plain
loops and DDP run on an asynchronous simulated GPU (``gpu_exporter.simulate.device.AsyncDevice`` with
``gpu_exporter.simulate.torch_cuda.install``, so the library takes its CUDA path: events, synchronize): the
loop hands the device its GPU work (``launch``, ``.item()``), and DDP runs real ``DistributedDataParallel``
over gloo on the CPU. Lightning runs on an ops-mode device (busy while the job is inside torch operators)
with the same ``torch.cuda`` stand-in installed, so the library's events run there too. No verdict comes
from what a loop reports about itself; the simulated devices also report their own truth (idle seconds per
thing the CPU did), which the output shows beside the library's phases.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import real_gpu_loops as loops
from bench.real_gpu_causes import PLANS, PUSH, Gpu, ddp_loop, lightning_loop, plain_loop, probe_nccl
from bench.real_gpu_table import markdown, passed, print_table
from testbed import free_port, http_get

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = Path(__file__).with_name("real_gpu.yaml")
CAUSE_VARIANTS = ("input-bound", "healthy", "batch-of-2", "lightning", "ddp")
"""The cause loops (bench/real_gpu_causes.py): a default run and a ``sync_every=1`` run each, judged per rank."""
VARIANTS = (*CAUSE_VARIANTS, *loops.VARIANTS)
"""... and the loops that tell apart what NVML's utilization cannot (bench/real_gpu_loops.py), judged per run."""
EXPECTED: dict[str, dict[str, str]] = {
    "input-bound": {"0": "input_bound"},
    "healthy": {"0": "healthy"},
    "batch-of-2": {"0": "batch_too_small"},
    "lightning": {"0": "metrics_bound"},
    "ddp": {"0": "straggler", "1": "input_bound"},
}
SIM_UUID = "GPU-bench-{variant}"
"""The simulated GPU of each variant in --simulate (bench/real_gpu.yaml)."""
SETTLE = 2.0
"""Seconds after a run's first snapshot before its window starts."""


def loop_main(args: argparse.Namespace) -> int:
    """A loop process: the variant's default run, then its sync_every=1 run; its own account to ``--out``."""
    variant = args.loop
    runs = [(variant, 0, args.seconds), (f"{variant}-sync", 1, args.sync_seconds)]
    uuid = SIM_UUID.format(variant=variant) if args.simulate else None
    gpu = Gpu(args.simulate, uuid, ops=variant == "lightning")
    try:
        if variant in loops.VARIANTS:
            out = loops.probe_loop(variant, gpu, args.url, uuid, args.seconds, PUSH[gpu.simulate])
        elif variant == "lightning":
            out = lightning_loop(gpu, args.url, uuid, runs)
        elif variant == "ddp":
            out = ddp_loop(args.rank, gpu, args.url, uuid, runs, args.backend, args.port)
        else:
            out = plain_loop(variant, gpu, args.url, uuid, runs)
    finally:
        gpu.close()
    Path(args.out).write_text(json.dumps(out))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # all is written: skip torch's teardown (seconds on a loaded machine)


# --- the check: exporter, loops, diagnose, nvidia-smi -----------------------------------------------------


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "exporter") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def exporter_busy(url: str) -> dict[str, float]:
    """uuid -> ``gpu_busy_seconds_total``, from one scrape of the exporter."""
    from gpu_exporter import catalog
    from prometheus_client.parser import text_string_to_metric_families

    busy: dict[str, float] = {}
    for family in text_string_to_metric_families(http_get(url + "/metrics")):
        for s in family.samples:
            if s.name == catalog.GPU_BUSY_SECONDS_TOTAL.name and "uuid" in s.labels:
                busy[s.labels["uuid"]] = s.value
    return busy


def nvidia_smi_sample() -> dict[str, dict[str, float]]:
    """uuid -> utilization (0-1) and memory used (MiB), from nvidia-smi."""
    query = ["nvidia-smi", "--query-gpu=uuid,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
    out = subprocess.run(query, capture_output=True, text=True, check=True, timeout=10).stdout
    gpus: dict[str, dict[str, float]] = {}
    for line in out.strip().splitlines():
        uuid, util, used = (f.strip() for f in line.split(","))
        with contextlib.suppress(ValueError):
            gpus[uuid] = {"utilization": float(util) / 100, "memory_used_mib": float(used)}
    return gpus


def _diagnose(url: str, run: str, window: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpu_exporter", "diagnose", "--url", url, "--window",
                             f"{window:g}", "--run", run, "--output", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def top_cause(causes: list[dict[str, Any]]) -> str:
    """The first of a run's causes in the verdict's order (the allocator first, then the biggest)."""
    if not causes:
        return "no cause"
    return str(min(causes, key=lambda c: (c["code"] != "M4", -c["value"]))["cause"])


def measure(url: str, run: str, window: float, simulate: bool) -> dict[str, Any]:
    """``diagnose --run RUN`` over ``window``; meanwhile every second the exporter's busy counter beside nvidia-smi."""
    proc = _diagnose(url, run, window)
    rows: list[dict[str, Any]] = []
    before, t0 = exporter_busy(url), time.monotonic()
    while proc.poll() is None:
        time.sleep(1.0)
        now, t1 = exporter_busy(url), time.monotonic()
        activity = loops.exporter_activity(url)  # GPM beside NVML's utilization (n/a without GPM)
        sample: dict[str, dict[str, float]] = {}
        if not simulate:
            with contextlib.suppress(OSError, subprocess.SubprocessError):  # one missed reading is not a failure
                sample = nvidia_smi_sample()
        rows.append({"t": round(t1, 1), "exporter": {u: round((b - before.get(u, b)) / (t1 - t0), 3)
                                                     for u, b in now.items()},
                     "nvidia_smi": {u: s["utilization"] for u, s in sample.items()}, "gpm": activity})
        before, t0 = now, t1
    stdout, stderr = proc.communicate()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"diagnose --run {run} failed: {stderr.strip()[-2000:]}")
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"diagnose --run {run} printed no JSON: {(stdout + stderr).strip()[-2000:]}") from None
    if len(doc["gpus"]) != 1:
        raise RuntimeError(f"diagnose --run {run}: expected one GPU, got {len(doc['gpus'])}")
    (gpu,) = doc["gpus"]
    uuid = gpu["uuid"]
    smi: list[float] = [r["nvidia_smi"][uuid] for r in rows if uuid in r["nvidia_smi"]]
    return {
        "run": run, "gpm": loops.mean_activity([r["gpm"] for r in rows], uuid),
        "uuid": uuid, "verdict": gpu["verdict"]["verdict"], "title": gpu["verdict"]["title"],
        "reason": gpu["verdict"]["reason"], "projected_utilization": gpu["verdict"]["projected"],
        "utilization": gpu["utilization"], "memory_used_ratio": gpu["memory_used_ratio"],
        "nvidia_smi_utilization": round(sum(smi) / len(smi), 3) if smi else None,
        "ranks": {r["rank"]: {"shares": {p: round(s, 4) for p, s in r["shares"].items() if s >= 0.0005},
                              "live": r["live"], "cause": top_cause(r["causes"]),
                              "causes": [c["cause"] for c in r["causes"]]}
                  for r in gpu["runs"] if r["run"] == run},
        "per_second": [{"t": r["t"], "exporter": r["exporter"].get(uuid), "nvidia_smi": r["nvidia_smi"].get(uuid),
                        "gpm": r["gpm"].get(uuid)} for r in rows],
    }


def _wait_for_run(url: str, run: str, procs: list[subprocess.Popen[str]], timeout: float) -> None:
    """Until run ``run`` has pushed its first snapshot (torch and CUDA take a while to start)."""
    deadline = time.monotonic() + timeout
    while f'run="{run}"' not in http_get(url + "/metrics"):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            raise RuntimeError(f"run {run} never reported to the exporter")
        time.sleep(0.25)


def _wait_listening(port: int, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited with {proc.returncode}: {proc.communicate()[1][-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the exporter did not listen within 30 s")


def choose_backend(requested: str, simulate: bool, workdir: Path) -> tuple[str, str]:
    """(backend, why): NCCL when it runs 2 ranks on the one GPU, else gloo; simulated always gloo (CPU)."""
    if simulate:
        return "gloo", "simulated: gloo on the CPU"
    if requested != "auto":
        return requested, f"--ddp-backend {requested}"
    port = free_port()
    logs = [workdir / f"nccl-probe-{rank}.log" for rank in (0, 1)]
    procs = []
    for rank, log in enumerate(logs):
        with log.open("w") as f:
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.real_gpu", "--probe-nccl", "--rank", str(rank),
                                           "--port", str(port)], cwd=ROOT, env=_env(), stdout=f,
                                          stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):  # one rank failed: the other waits for it in vain
            deadline = min(deadline, time.monotonic() + 5)
        time.sleep(0.2)
    errors: list[str] = []
    for proc, log in zip(procs, logs, strict=True):
        timed_out = proc.poll() is None
        if timed_out:
            proc.kill()
        proc.wait()
        if proc.returncode != 0:
            lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
            lines += ["(no answer in 60 s: stopped)"] if timed_out else []
            errors.append(next((line for line in reversed(lines) if "rror" in line), lines[-1] if lines else "?"))
    if not errors:
        return "nccl", "NCCL ran a 2-rank all-reduce on the one GPU"
    return "gloo", f"NCCL did not run 2 ranks on the one GPU: {errors[0].strip()[:300]}"


def run_variant(variant: str, url: str, args: argparse.Namespace, workdir: Path, backend: str,
                env: dict[str, str]) -> dict[str, Any]:
    """Start the variant's loop process(es), measure its two runs, collect the loops' own accounts."""
    plan = PLANS.get(variant)
    ranks = (0, 1) if plan is not None and plan.kind == "ddp" else (0,)
    measured = ([("default", variant, args.window), ("sync_every_1", f"{variant}-sync", args.sync_window)]
                if plan is not None else [(name, name, args.window) for name in loops.runs(variant)])
    port = free_port()
    outs = {rank: workdir / f"{variant}-{rank}.json" for rank in ranks}
    logs = {rank: workdir / f"{variant}-{rank}.log" for rank in ranks}
    procs: list[subprocess.Popen[str]] = []
    for rank in ranks:
        cmd = [sys.executable, "-m", "bench.real_gpu", "--loop", variant, "--url", url, "--seconds", str(args.seconds),
               "--sync-seconds", str(args.sync_seconds), "--out", str(outs[rank]), "--rank", str(rank), "--port",
               str(port), "--backend", backend, *(["--simulate"] if args.simulate else [])]
        with logs[rank].open("w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True))
    result: dict[str, Any] = {"kind": plan.kind if plan is not None else "probe",
                              "expected": EXPECTED.get(variant, {}), "timeline": {}}
    launched = time.monotonic()
    try:
        for mode, run, window in measured:
            _wait_for_run(url, run, procs, timeout=180)
            result["timeline"][f"{mode}_reported_s"] = round(time.monotonic() - launched, 1)
            time.sleep(SETTLE)
            result[mode] = measure(url, run, window, args.simulate)
            result["timeline"][f"{mode}_measured_s"] = round(time.monotonic() - launched, 1)
        for proc in procs:
            proc.wait(timeout=(args.sync_seconds if plan is not None else 0) + 120)
        result["timeline"]["exited_s"] = round(time.monotonic() - launched, 1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in zip(ranks, procs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"loop {variant} rank {rank} failed: {logs[rank].read_text()[-3000:]}")
    for rank in ranks:
        own = json.loads(outs[rank].read_text())
        result.setdefault("loop", {})[str(rank)] = {k: v for k, v in own.items() if not k.startswith(variant)}
        for mode, run, _ in measured:
            result[mode]["ranks"].setdefault(str(rank), {"shares": {}, "live": False, "cause": "not seen",
                                                         "causes": []})["own"] = own[run]
    return result


def _lightning_missing() -> str | None:
    if importlib.util.find_spec("lightning") or importlib.util.find_spec("pytorch_lightning"):
        return None
    return "lightning is not installed (pip install lightning)"


def _environment(simulate: bool) -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    with contextlib.suppress(Exception):
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
    for package in ("lightning", "pytorch_lightning"):
        with contextlib.suppress(Exception):
            env[package] = importlib.import_module(package).__version__
    if not simulate:
        with contextlib.suppress(Exception):
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_gpu", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--simulate", action="store_true", help="no GPU: simulated GPUs doing the loops' work (CI)")
    parser.add_argument("--seconds", type=float, default=20.0, help="each variant's default run (default 20)")
    parser.add_argument("--sync-seconds", type=float, default=12.0, help="each variant's sync_every=1 run (default 12)")
    parser.add_argument("--window", type=float, help="diagnose's window in the default run (default: seconds - 8)")
    parser.add_argument("--sync-window", type=float, help="... in the sync_every=1 run (default: sync-seconds - 7)")
    parser.add_argument("--variants", help=f"comma-separated (default: all, {','.join(VARIANTS)})")
    parser.add_argument("--ddp-backend", choices=("auto", "nccl", "gloo"), default="auto",
                        help="auto: NCCL if it runs 2 ranks on one GPU, else gloo")
    parser.add_argument("--output", type=Path, default=Path("real-gpu-results.json"),
                        help="the results as JSON (default: real-gpu-results.json in the current folder)")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    parser.add_argument("--logs", type=Path, help="keep the loops' logs here (default: a temporary folder, removed "
                                                  "after a passing check)")
    parser.add_argument("--loop", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--probe-nccl", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="gloo", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_nccl:
        probe_nccl(args.rank, args.port)
        return 0
    if args.loop:
        return loop_main(args)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"error: unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    args.window = args.seconds - 8 if args.window is None else args.window
    args.sync_window = args.sync_seconds - 7 if args.sync_window is None else args.sync_window
    if args.window < 2 or args.window + 6 > args.seconds or args.sync_window < 2 or \
            args.sync_window + 6 > args.sync_seconds:
        print("error: each window must be at least 2 s and 6 s shorter than its run (--seconds/--window, "
              "--sync-seconds/--sync-window)", file=sys.stderr)
        return 2
    problem = unwritable(args.output, args.markdown, args.logs)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not args.simulate and shutil.which("nvidia-smi") is None:
        print("error: nvidia-smi not found: run on a machine with an NVIDIA GPU, or use --simulate", file=sys.stderr)
        return 2
    return check(args, variants)


def unwritable(output: Path, markdown_file: Path | None, logs: Path | None) -> str | None:
    """Why the check could not write its results (checked before any variant runs), or None."""
    for path in (output, markdown_file):
        if path is None:
            continue
        folder = path.parent
        if path.is_dir():
            return f"{path} is a folder: give a file name"
        if not folder.is_dir():
            return f"cannot write {path}: the folder {folder} does not exist"
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as err:
            return f"cannot write {path}: {err.strerror or err}"
    if logs is not None:
        try:
            logs.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=logs).close()
        except OSError as err:
            return f"cannot keep the logs in {logs}: {err.strerror or err}"
    return None


def check(args: argparse.Namespace, variants: list[str]) -> int:
    started = time.monotonic()
    workdir = args.logs or Path(tempfile.mkdtemp(prefix="real-gpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = _env({"GPU_SIM_DEVICE_DIR": str(workdir / "channel")} if args.simulate else None)
    backend, why = choose_backend(args.ddp_backend, args.simulate, workdir) if "ddp" in variants else ("", "")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "gpu_exporter", "--web.listen-address", f"127.0.0.1:{port}", "--poll-interval",
             "0.2", *(["--simulate", str(SCENARIO)] if args.simulate else [])]
    exporter = subprocess.Popen(serve, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    results: dict[str, Any] = {"mode": "simulated" if args.simulate else "real",
                               "environment": _environment(args.simulate), "seconds": args.seconds,
                               "sync_seconds": args.sync_seconds, "window": args.window,
                               "sync_window": args.sync_window, "variants": {}}
    if backend:
        results["ddp_backend"] = {"backend": backend, "why": why}
    found: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}

    def one(variant: str) -> None:
        try:
            found[variant] = run_variant(variant, url, args, workdir, backend, env)
        except Exception as err:  # one variant's failure is reported, the others still run
            errors[variant] = f"{type(err).__name__}: {err}"

    try:
        _wait_listening(port, exporter)
        todo = []
        for variant in variants:
            missing = _lightning_missing() if variant == "lightning" else None
            if missing:
                found[variant] = {"skipped": missing}
            else:
                todo.append(variant)
        if args.simulate:  # each variant on its own simulated GPU: all at once
            threads = [threading.Thread(target=one, args=(v,)) for v in todo]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:  # one GPU: one after the other
            for variant in todo:
                one(variant)
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    results["variants"] = {v: found[v] for v in variants if v in found}
    results["errors"] = errors
    results["passed"] = not errors and passed(results)
    results["wall_seconds"] = round(time.monotonic() - started, 1)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    if backend:
        print(f"ddp backend: {backend} ({why})")
    print_table(results)
    loops.print_activity(results)
    for variant, error in errors.items():
        print(f"error: {variant}: {error}", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(markdown(results) + "\n" + loops.activity_markdown(results))
    print(f"results: {args.output} ({results['wall_seconds']:.0f} s)")
    if results["passed"] and args.logs is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs: {workdir}")
    return 0 if results["passed"] else 1


if __name__ == "__main__":
    try:
        import gpu_exporter  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "exporter"))
    sys.exit(main())
