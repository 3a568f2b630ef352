"""The real-GPU check: the exporter against the real driver beside nvidia-smi, and three real PyTorch loops.

On a machine with an NVIDIA GPU, ``python -m bench.real_gpu`` (from a checkout, with torch built
for CUDA):

1. starts ``gpu-exporter`` on the real driver and, for ``--compare-seconds``, samples its
   ``/metrics`` and ``nvidia-smi`` side by side every second: utilization, memory used and the
   compute processes (pid, name, memory) of every GPU;
2. runs a real PyTorch CUDA loop on GPU 0 in three variants, each instrumented with
   ``gpu_exporter.training`` (``sync_every=1``, so queued kernels are timed in the phase that
   issued them) and each for ``--seconds``: ``input-bound`` (a loader that waits on slow
   storage), ``batch-of-2`` (kernels too small to fill the GPU) and ``healthy`` (large batches,
   data already on the GPU);
3. while each runs, asks ``gpu-exporter diagnose --url ... --run <variant>`` for its verdict;
4. writes everything (verdicts, projections, phase shares, utilization from the exporter and
   nvidia-smi, processes) to ``--output`` (JSON, default ``real-gpu-results.json``) and prints
   a table.

Expected verdicts: input-bound (M1), batch too small (M3), healthy. ``--simulate`` runs the
same flow with no GPU: the exporter on simulated GPUs (bench/real_gpu.yaml; GPU 1 is busy 25%
of its loop's compute time), the loops on the CPU with wall-clock time boxes, nvidia-smi
replaced by the simulator's own numbers. CI runs it (tests/test_real_gpu_bench.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = Path(__file__).with_name("real_gpu.yaml")
VARIANTS = ("input-bound", "batch-of-2", "healthy")
EXPECTED = {"input-bound": "input_bound", "batch-of-2": "batch_too_small", "healthy": "healthy"}
FEATURES, CLASSES = 1024, 16

# variant -> (batch size, hidden width, seconds a batch waits on storage, CPU time box of compute (--simulate))
PLANS: dict[str, tuple[int, int, float, float]] = {
    "input-bound": (256, 4096, 0.1, 0.02),
    "batch-of-2": (2, 256, 0.0, 0.2),
    "healthy": (1024, 8192, 0.0, 0.3),
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "exporter") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def exporter_sample(url: str) -> dict[str, dict[str, Any]]:
    """uuid -> busy seconds, memory used (MiB) and processes, from one scrape of the exporter."""
    from gpu_exporter import catalog
    from prometheus_client.parser import text_string_to_metric_families

    gpus: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(_get(url + "/metrics")):
        for s in family.samples:
            uuid = s.labels.get("uuid")
            if uuid is None:
                continue
            gpu = gpus.setdefault(uuid, {"processes": []})
            if s.name == catalog.GPU_BUSY_SECONDS_TOTAL.name:
                gpu["busy_seconds"] = s.value
            elif s.name == catalog.GPU_MEMORY_USED_BYTES.name:
                gpu["memory_used_mib"] = round(s.value / 2**20)
            elif s.name == catalog.GPU_PROCESS_MEMORY_USED_BYTES.name:
                gpu["processes"].append({"pid": s.labels.get("pid"), "name": s.labels.get("process_name"),
                                         "memory_mib": round(s.value / 2**20)})
    return gpus


def nvidia_smi_sample() -> dict[str, dict[str, Any]]:
    """uuid -> utilization, memory used (MiB) and compute processes, from nvidia-smi."""
    gpus: dict[str, dict[str, Any]] = {}
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,utilization.gpu,memory.used",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    for line in out.strip().splitlines():
        uuid, util, used = (f.strip() for f in line.split(","))
        gpus[uuid] = {"utilization": float(util) / 100, "memory_used_mib": float(used), "processes": []}
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True).stdout
    for line in apps.strip().splitlines():
        uuid, pid, name, used = (f.strip() for f in line.split(","))
        gpus.setdefault(uuid, {"processes": []})["processes"].append({"pid": pid, "name": name,
                                                                      "memory_mib": float(used)})
    return gpus


def compare(url: str, seconds: float, simulate: bool) -> list[dict[str, Any]]:
    """Every second for ``seconds``: the exporter's interval-mean utilization beside nvidia-smi's reading."""
    rows: list[dict[str, Any]] = []
    before, t0 = exporter_sample(url), time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        now, t1 = exporter_sample(url), time.monotonic()
        smi = {} if simulate else nvidia_smi_sample()
        for uuid, gpu in now.items():
            util = (gpu.get("busy_seconds", 0.0) - before.get(uuid, {}).get("busy_seconds", 0.0)) / (t1 - t0)
            rows.append({"t": round(t1 - end + seconds, 1), "uuid": uuid, "exporter_utilization": round(util, 3),
                         "exporter_memory_used_mib": gpu.get("memory_used_mib"),
                         "exporter_processes": gpu["processes"],
                         "nvidia_smi": smi.get(uuid, "n/a (simulated GPUs)" if simulate else "missing")})
        before, t0 = now, t1
    return rows


def loop(variant: str, url: str, uuid: str | None, seconds: float, simulate: bool) -> None:
    """One instrumented training loop (run in its own process by :func:`main`)."""
    import torch
    from gpu_exporter import training

    batch, width, wait, cpu_box = PLANS[variant]
    device = torch.device("cpu" if simulate else "cuda:0")
    if simulate:
        torch.set_num_threads(1)
        width = min(width, 256)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, CLASSES)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    resident = (torch.randn(batch, FEATURES, device=device), torch.randint(0, CLASSES, (batch,), device=device))

    def batches() -> Any:
        while True:
            if wait:  # slow storage: the batch is read and decoded on the CPU, then copied
                time.sleep(wait)
                yield torch.randn(batch, FEATURES).to(device), torch.randint(0, CLASSES, (batch,)).to(device)
            else:
                yield resident

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    run = training.start(variant, url=url, uuid=uuid, push_interval=1.0, sync_every=1)
    end = time.monotonic() + seconds
    try:
        for x, y in run.data(batches()):
            with run.phase("compute"):
                if simulate:
                    _time_box(cpu_box, functools.partial(step, x, y))
                else:
                    step(x, y)
            run.step(samples=batch)
            if time.monotonic() > end:
                break
    finally:
        run.close()


def _time_box(seconds: float, work: Callable[[], object]) -> None:
    deadline = time.perf_counter() + seconds
    work()
    while time.perf_counter() + 0.002 < deadline:
        work()
    time.sleep(max(0.0, deadline - time.perf_counter()))


def _diagnose(url: str, variant: str, window: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", "diagnose", "--url", url, "--window", f"{window:g}",
                           "--run", variant, "--output", "json"], capture_output=True, text=True, env=_env(),
                          check=False)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"diagnose failed: {proc.stderr.strip()}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def _wait_for_run(url: str, variant: str, child: subprocess.Popen[str], timeout: float = 120.0) -> None:
    """Until the loop has pushed its first snapshots (torch takes a while to import)."""
    deadline = time.monotonic() + timeout
    while f'run="{variant}"' not in _get(url + "/metrics"):
        if child.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"loop {variant} never reported to the exporter")
        time.sleep(0.5)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate", action="store_true", help="no GPU: simulated GPUs and CPU loops (CI)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each variant runs (default 60)")
    parser.add_argument("--window", type=float, default=20.0, help="diagnose's window, within each run (default 20)")
    parser.add_argument("--compare-seconds", type=float, default=10.0, help="exporter vs nvidia-smi (default 10)")
    parser.add_argument("--output", type=Path, default=Path("real-gpu-results.json"))
    parser.add_argument("--loop", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--uuid", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop:
        loop(args.loop, args.url, args.uuid, args.seconds, args.simulate)
        return 0
    if not args.simulate and shutil.which("nvidia-smi") is None:
        print("error: nvidia-smi not found: run on a machine with an NVIDIA GPU, or use --simulate", file=sys.stderr)
        return 2
    if args.window + 5 >= args.seconds:
        print("error: --seconds must exceed --window by more than 5 s", file=sys.stderr)
        return 2
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "gpu_exporter", "--web.listen-address", f"127.0.0.1:{port}", "--poll-interval",
             "0.2", *(["--simulate", str(SCENARIO)] if args.simulate else [])]
    exporter = subprocess.Popen(serve, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    results: dict[str, Any] = {"mode": "simulated" if args.simulate else "real", "variants": {}}
    try:
        _wait_listening(port, exporter)
        uuids = list(exporter_sample(url))
        results["side_by_side"] = compare(url, args.compare_seconds, args.simulate)
        for index, variant in enumerate(VARIANTS):
            uuid = uuids[index] if args.simulate else None  # real: the library finds GPU 0's UUID itself
            child = subprocess.Popen([sys.executable, "-m", "bench.real_gpu", "--loop", variant, "--url", url,
                                      "--seconds", str(args.seconds), *(["--uuid", uuid] if uuid else []),
                                      *(["--simulate"] if args.simulate else [])],
                                     cwd=ROOT, env=_env(), stderr=subprocess.PIPE, text=True)
            try:
                _wait_for_run(url, variant, child)
                time.sleep(2.0)  # past the first snapshots
                doc = _diagnose(url, variant, args.window)
                smi = {} if args.simulate else nvidia_smi_sample()
            finally:
                _, err = child.communicate(timeout=args.seconds + 60)
            if child.returncode != 0:
                raise RuntimeError(f"loop {variant} failed: {err[-2000:]}")
            (gpu,) = doc["gpus"]
            results["variants"][variant] = {
                "expected": EXPECTED[variant], "verdict": gpu["verdict"]["verdict"], "title": gpu["verdict"]["title"],
                "reason": gpu["verdict"]["reason"], "projected_utilization": gpu["verdict"]["projected"],
                "utilization": gpu["utilization"], "memory_used_ratio": gpu["memory_used_ratio"],
                "shares": gpu["runs"][0]["shares"] if gpu["runs"] else {}, "uuid": gpu["uuid"],
                "nvidia_smi_after": smi.get(gpu["uuid"], "n/a (simulated GPUs)" if args.simulate else "missing")}
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'variant':<12} {'expected':<16} {'verdict':<16} {'util':>5} {'proj':>5}  shares")
    for variant, r in results["variants"].items():
        proj = "-" if r["projected_utilization"] is None else f"{r['projected_utilization'] * 100:.0f}%"
        shares = ", ".join(f"{p} {s * 100:.0f}%" for p, s in r["shares"].items() if s >= 0.01)
        print(f"{variant:<12} {r['expected']:<16} {r['verdict']:<16} {r['utilization'] * 100:>4.0f}% {proj:>5}  "
              f"{shares}")
    print(f"results: {args.output}")
    return 0 if all(r["verdict"] == r["expected"] for r in results["variants"].values()) else 1


if __name__ == "__main__":
    try:
        import gpu_exporter  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "exporter"))
    sys.exit(main())
