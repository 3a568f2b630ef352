"""A stand-in for NVIDIA's dcgm-exporter on a simulated node: DCGM's profiling fields over HTTP.

Some GPUs have no GPM (an A100, or a scenario GPU with ``gpm: false``); a cluster reads their SM activity from
dcgm-exporter. This module serves what dcgm-exporter would for the GPUs of a scenario, from the same simulated
node the exporter's simulated NVML reads (the same scenario file and the same channel directory,
``$GPU_SIM_DEVICE_DIR``), so a device GPU's values come from the kernels its job ran::

    python -m gpu_exporter.simulate.dcgm_exporter --scenario FILE --port PORT [--host 127.0.0.1]
        [--hostname NAME] [--interval SECONDS] [--dir DIR] [--pod UUID=NAMESPACE/POD/CONTAINER ...]

It prints one line, ``dcgm-exporter stand-in listening on http://HOST:PORT/metrics``, then serves ``/metrics``
(Prometheus text format 0.0.4) until it is stopped: the gauges of :data:`FIELDS`, ``DCGM_FI_DEV_GPU_UTIL`` (NVML's
utilization in whole percents; not on MIG-mode GPUs) and the ``DCGM_FI_PROF_*`` ratios 0-1. Each value is the mean
over the last ``--interval`` seconds (default 30, dcgm-exporter's collection interval) up to the scrape, or since
the stand-in started when that is shorter.

The values are :meth:`SimulatedNode.profile`'s, the ones the simulated GPM reports. The profiling fields are
served for Volta and newer (DCGM profiling's range), per GPU instance on a MIG-mode GPU (labels ``GPU_I_PROFILE``,
``GPU_I_ID``), and whether or not the GPU has GPM. The FP16/FP32/FP64 pipe fields are served only where the
scenario says ``dcgm_pipe_fields: true`` (dcgm-exporter's default counters file leaves them out): a device GPU's
are its kernels' fp32/fp16/fp64 shares times their busy time (:class:`~gpu_exporter.simulate.channel.Kernel`), a
pattern GPU's 0. Labels, in dcgm-exporter's order: ``gpu`` (the index), ``UUID`` (the GPU's),
``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, and
``pod``, ``namespace``, ``container`` when pods are mapped (``--pod``; "" for a GPU no pod holds).

Python API, for tests: ``serve(scenario, port=0, ...)`` serves in this process (a thread; port 0: any free port)
and makes a :class:`DcgmExporter` (``.url``, ``.port``, ``.node``, ``.render()``); ``spawn`` (the same arguments
but ``clock``) a subprocess, :class:`DcgmProcess` (``.url``, ``.port``, ``.process``); both stop with ``.close()``
or at the end of ``with``. ``scenario`` is a path, a packaged scenario's name, or a loaded :class:`Scenario`;
``directory`` the channel directory (default ``$GPU_SIM_DEVICE_DIR``); ``pods`` maps a GPU UUID to ``(namespace,
pod, container)``; ``clock`` returns ``time.monotonic``-scale seconds (the channel's clock).

>>> from gpu_exporter.simulate.scenario import parse_scenario
>>> one = parse_scenario({"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "architecture": "ampere",
...                                 "memory_gib": 80, "uuid": "GPU-a", "utilization": 0.5}]}, "doc")
>>> t = [0.0]
>>> with serve(one, hostname="n1", clock=lambda: t[0]) as dcgm:
...     t[0] = 60.0
...     name, rest = dcgm.render().splitlines()[2].split("{")
>>> labels, value = rest.split("} ")
>>> print(name, value); print(*labels.split(",")[:6]); print(labels.split(",")[6])
DCGM_FI_DEV_GPU_UTIL 50
gpu="0" UUID="GPU-a" pci_bus_id="00000000:18:00.0" device="nvidia0" modelName="NVIDIA A100-SXM4-80GB" Hostname="n1"
DCGM_FI_DRIVER_VERSION="550.54.15"
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

from gpu_exporter.simulate.node import Profile, SimulatedNode
from gpu_exporter.simulate.scenario import ARCHITECTURES, Scenario, ScenarioError, load_scenario

DEFAULT_INTERVAL = 30.0
"""dcgm-exporter's default collection interval (``-c 30000`` ms)."""
PROFILING_SINCE = ARCHITECTURES["volta"]
"""DCGM's profiling fields exist on Volta and newer."""
FIELDS: tuple[tuple[str, str, Callable[[Profile], float]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda p: round(100 * p.busy)),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", lambda p: p.busy),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", lambda p: p.sm),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", lambda p: p.occupancy),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", lambda p: p.tensor),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.",
     lambda p: p.dram),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the fp64 pipes are active.", lambda p: p.fp64),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the fp32 pipes are active.", lambda p: p.fp32),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the fp16 pipes are active.", lambda p: p.fp16),
)
"""(name, help, value from a window's profile) of every field served, in the order served."""
PIPE_FIELDS = frozenset(name for name, _, _ in FIELDS if name.startswith("DCGM_FI_PROF_PIPE_FP"))
"""The fp pipe fields: served only with the scenario's ``dcgm_pipe_fields: true`` (not in the default counters)."""
UTIL_FIELD = FIELDS[0][0]
LISTENING = "dcgm-exporter stand-in listening on "
Pods = Mapping[str, tuple[str, str, str]]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


class DcgmExporter(AbstractContextManager["DcgmExporter"]):
    """The stand-in serving in this process (a thread); made by :func:`serve`."""

    def __init__(self, scenario: Scenario | str | Path | None = None, port: int = 0, *, host: str = "127.0.0.1",
                 hostname: str | None = None, interval: float = DEFAULT_INTERVAL,
                 directory: str | Path | None = None, pods: Pods | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be greater than 0 seconds, got {interval}")
        loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.node = SimulatedNode(loaded, clock, channel_dir=directory)
        self.hostname = socket.gethostname() if hostname is None else hostname
        self.interval = interval
        self.pods = pods
        exporter = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, name="dcgm-exporter-stand-in", daemon=True)
        self._thread.start()

    def render(self) -> str:
        """What ``/metrics`` serves now."""
        node = self.node
        node.refresh_training()  # reads what device GPUs' jobs wrote to the channel
        t = node.now()
        since = max(0.0, t - self.interval)
        fields = [f for f in FIELDS if node.scenario.dcgm_pipe_fields or f[0] not in PIPE_FIELDS]
        rows: dict[str, list[str]] = {name: [] for name, _, _ in fields}
        driver = node.scenario.driver_version
        for gpu in node.scenario.gpus:
            base = [("gpu", str(gpu.index)), ("UUID", gpu.uuid), ("pci_bus_id", gpu.pci_bus_id),
                    ("device", f"nvidia{gpu.index}"), ("modelName", gpu.name), ("Hostname", self.hostname),
                    ("DCGM_FI_DRIVER_VERSION", driver)]
            if self.pods is not None:
                namespace, pod, container = self.pods.get(gpu.uuid, ("", "", ""))
                base += [("pod", pod), ("namespace", namespace), ("container", container)]
            targets: list[tuple[list[tuple[str, str]], int | None]] = [(base, None)]
            if gpu.mig_instances is not None:
                targets = [([*base, ("GPU_I_PROFILE", inst.profile), ("GPU_I_ID", str(inst.gpu_instance_id))], i)
                           for i, inst in enumerate(gpu.mig_instances)]
            # no utilization counter in MIG mode; the profiling fields from Volta on
            served = [(name, value) for name, _, value in fields if (
                gpu.mig_instances is None if name == UTIL_FIELD else gpu.architecture_id >= PROFILING_SINCE)]
            for labels, mig_index in targets:
                profile = node.profile(gpu.index, since, t, mig_index)
                for name, value in served:
                    rows[name].append(f"{name}{_labels(labels)} {value(profile)!r}\n")
        return "".join(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n" + "".join(rows[name])
                       for name, help_text, _ in fields)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
        self.node.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


serve = DcgmExporter
"""Serve the stand-in in this process (a daemon thread) until ``.close()``; see the module docstring."""


class DcgmProcess(AbstractContextManager["DcgmProcess"]):
    """The stand-in in a subprocess; made by :func:`spawn`."""

    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url
        self.port = int(url.rsplit(":", 1)[1].split("/")[0])

    def close(self) -> None:
        """Stop the subprocess (SIGTERM, then SIGKILL after 5 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_line(stream: IO[str], timeout: float) -> str:
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return line[0] if line else ""


def spawn(scenario: str | Path, port: int = 0, *, host: str = "127.0.0.1", hostname: str | None = None,
          interval: float = DEFAULT_INTERVAL, directory: str | Path | None = None, pods: Pods | None = None,
          timeout: float = 30.0) -> DcgmProcess:
    """Start the stand-in as ``python -m gpu_exporter.simulate.dcgm_exporter`` and wait until it listens.

    Raises RuntimeError with its error output when it does not start within ``timeout`` seconds."""
    argv = [sys.executable, "-m", "gpu_exporter.simulate.dcgm_exporter", "--scenario", str(scenario),
            "--port", str(port), "--host", host, "--interval", str(interval)]
    for flag, value in (("--hostname", hostname), ("--dir", directory)):
        if value is not None:
            argv += [flag, str(value)]
    for uuid, (namespace, pod, container) in (pods or {}).items():
        argv += ["--pod", f"{uuid}={namespace}/{pod}/{container}"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = _read_line(process.stdout, timeout)
    if not line.startswith(LISTENING):
        process.kill()
        _, err = process.communicate()
        raise RuntimeError(f"the dcgm-exporter stand-in did not start: {(err or line).strip()}")
    return DcgmProcess(process, line[len(LISTENING):].strip())


def _pod(text: str) -> tuple[str, tuple[str, str, str]]:
    uuid, sep, rest = text.partition("=")
    parts = rest.split("/")
    if not sep or not uuid or len(parts) != 3:
        raise argparse.ArgumentTypeError(f"must look like GPU-x=NAMESPACE/POD/CONTAINER, got {text!r}")
    return uuid, (parts[0], parts[1], parts[2])


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m gpu_exporter.simulate.dcgm_exporter",
                                     description="Serve dcgm-exporter's profiling fields for a simulated node.")
    parser.add_argument("--scenario", default=None, help="scenario file or packaged name (default: the default)")
    parser.add_argument("--port", type=int, default=9400, help="port to listen on (0: any free port; default 9400)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--hostname", default=None, help="the Hostname label (default: this machine's name)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                        help=f"seconds each value is the mean over (default {DEFAULT_INTERVAL:g})")
    parser.add_argument("--dir", default=None, help="channel directory (default $GPU_SIM_DEVICE_DIR or the temp dir)")
    parser.add_argument("--pod", type=_pod, action="append", default=None,
                        help="map a GPU to a pod: UUID=NAMESPACE/POD/CONTAINER (repeatable)")
    ns = parser.parse_args(argv)
    try:
        exporter = serve(ns.scenario, ns.port, host=ns.host, hostname=ns.hostname, interval=ns.interval,
                         directory=ns.dir, pods=dict(ns.pod) if ns.pod is not None else None)
    except (ScenarioError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{LISTENING}{exporter.url}", flush=True)
    with exporter, contextlib.suppress(KeyboardInterrupt):  # serve until interrupted, then close
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
