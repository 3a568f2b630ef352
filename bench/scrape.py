"""Scrape cost of a real exporter process: latency (steady, back to back, right after a poll), CPU, memory.

Each exporter runs as its own process on a generated scenario. Both get the simulated NVML the
same way, through a ``sitecustomize.py`` on their PYTHONPATH (gpu-exporter then runs exactly as on
a real driver, without ``--simulate``), so both read the same simulated GPUs through the real
pynvml. That file also meters the simulation: every simulated NVML function is wrapped to add its
thread CPU time to a per-process total, which a small thread writes to a file with a timestamp, so
the bench can report each exporter's CPU net of the simulated driver. Example::

    spec = ours(scenario)                      # or nvitop(scenario, site_dir)
    result = measure(spec, Durations(warmup=2, idle=3, scrape=6, rate=4, burst=40, spaced=20), gpus=8, processes=64)
    print(result.p99_ms, result.spaced_p50_ms / result.burst_p50_ms)

Three scrape patterns: *steady* (``rate`` per second, so most scrapes of a 1 s poll repeat it),
*back to back* (``burst`` scrapes in a row: nearly all repeat a poll, the cached body), and
*spaced* (``spaced`` scrapes, one every ``SPACING`` s, so each comes after a fresh poll as
Prometheus's do: the scrape that matters).
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import gpu_exporter
import psutil

from testbed import free_port

# What Prometheus 2.x sends by default: it prefers OpenMetrics and accepts gzip.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "gpu-exporter-bench",
}
EXPORTER_SRC = Path(gpu_exporter.__file__).resolve().parents[1]
MB = 1e6
METER_INTERVAL = 0.2
"""Seconds between two writes of the simulation meter (see SITECUSTOMIZE)."""
SPACING = 1.1
"""Seconds between two spaced scrapes: longer than the 1 s poll, so each spaced scrape reads a fresh poll."""
SETTLE = 2.0
"""Seconds between the last warm-up scrape and the idle stage: gpu-exporter renders ahead of a scrape its
scrapers' interval makes it expect (exposition.ScrapeForecast), so after a scraper stops it may still
render for up to its interval plus a poll interval (1.25 s after the warm-up at 4/s). Those renders belong
to the scrapes, not to polling alone."""

SITECUSTOMIZE = """\
# Written by bench: put the simulated GPUs under pynvml before the exporter loads NVML, and meter
# the CPU the simulated driver takes, so figures can be given net of it.
import os, threading, time
import pynvml
from gpu_exporter.simulate import install

install({scenario!r})
_spent = {{}}  # thread id -> CPU ns inside simulated NVML functions (one writer per key: no lost updates)


def _metered(function):
    def call(*args):
        started = time.thread_time_ns()
        try:
            return function(*args)
        finally:
            key = threading.get_ident()
            _spent[key] = _spent.get(key, 0) + time.thread_time_ns() - started
    return call


for _name, _function in pynvml.nvmlLib.functions().items():
    setattr(pynvml.nvmlLib, _name, _metered(_function))


def _write():
    path, tmp = {meter!r}, {meter!r} + ".tmp"
    while True:
        started = time.thread_time_ns()
        with open(tmp, "w") as out:
            out.write(f"{{time.monotonic()}} {{sum(_spent.values())}}")
        os.replace(tmp, path)
        key = threading.get_ident()  # the meter's own CPU is the bench's, not the exporter's
        _spent[key] = _spent.get(key, 0) + time.thread_time_ns() - started
        time.sleep({interval})


threading.Thread(target=_write, name="bench-simulation-meter", daemon=True).start()
"""


@dataclass(frozen=True)
class Durations:
    """Seconds of each measurement stage, the steady scrape rate (scrapes per second), and the
    number of back-to-back (``burst``), spaced and idle-floor scrapes (0: that stage is skipped)."""

    warmup: float
    idle: float
    scrape: float
    rate: float
    burst: int = 0
    spaced: int = 0
    floor: int = 0
    """Spaced scrapes of a second start of gpu-exporter that polls once and never again (:func:`idle_floor`)."""
    settle: float = SETTLE
    """Seconds between the last warm-up scrape and the idle stage (:data:`SETTLE`; shorter in quick mode)."""


@dataclass(frozen=True)
class ExporterSpec:
    """How to start one exporter: ``argv`` with ``{port}`` placeholders, environment, simulation meter file."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    meter: Path


@dataclass(frozen=True)
class ScrapeResult:
    """Cost of one exporter on one simulated node."""

    exporter: str
    gpus: int
    processes: int
    scrapes: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    poll_cpu_s_per_min: float
    """CPU while nobody scrapes: the polling loop alone."""
    cpu_s_per_min: float
    """CPU during the steady scraper (polling plus serving ``rate`` scrapes per second)."""
    sim_poll_s_per_min: float
    """Of ``poll_cpu_s_per_min``: CPU inside the simulated NVML (a real driver's cost instead)."""
    sim_scraped_s_per_min: float
    """Of ``cpu_s_per_min``: CPU inside the simulated NVML."""
    cpu_ms_per_scrape: float
    rss_mb: float
    series: int
    wire_bytes: int
    """Body size on the wire (gzip where the exporter compresses)."""
    burst_p50_ms: float = math.nan
    """Median of the back-to-back scrapes: the cached body's cost."""
    spaced_p50_ms: float = math.nan
    """Median of the spaced scrapes, each after a fresh poll."""
    spaced_p99_ms: float = math.nan
    spaced_scrapes: int = 0
    floor_p50_ms: float = math.nan
    """Median of spaced scrapes when no poll happened since the last one: the cached body, at the spaced
    scrapes' pace (an idle server's floor: see :func:`idle_floor`)."""


def _python_env(*paths: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _site(scenario: Path, site_dir: Path) -> Path:
    """Write ``site_dir/sitecustomize.py`` (simulated NVML on ``scenario``, metered); returns the meter file."""
    site_dir.mkdir(parents=True, exist_ok=True)
    meter = site_dir / "simulation-meter"
    (site_dir / "sitecustomize.py").write_text(
        SITECUSTOMIZE.format(scenario=str(scenario), meter=str(meter), interval=METER_INTERVAL))
    return meter


def ours(scenario: Path, site_dir: Path) -> ExporterSpec:
    """gpu-exporter on ``scenario`` (simulated NVML through ``site_dir/sitecustomize.py``), polling every second."""
    meter = _site(scenario, site_dir)
    argv = (sys.executable, "-m", "gpu_exporter", "--web.listen-address", "127.0.0.1:{port}", "--poll-interval", "1")
    return ExporterSpec("gpu-exporter", argv, _python_env(str(site_dir), str(EXPORTER_SRC)), meter)


def nvitop(scenario: Path, site_dir: Path) -> ExporterSpec:
    """nvitop-exporter on ``scenario`` (simulated NVML through ``site_dir/sitecustomize.py``), --interval 1."""
    meter = _site(scenario, site_dir)
    argv = (sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1", "--port", "{port}",
            "--interval", "1")
    return ExporterSpec("nvitop-exporter", argv, _python_env(str(site_dir), str(EXPORTER_SRC)), meter)


def read_meter(meter: Path) -> tuple[float, float]:
    """(monotonic time, CPU seconds spent in the simulated NVML so far) from the exporter's meter file."""
    deadline = time.monotonic() + 5
    while True:
        try:
            at, ns = meter.read_text().split()
            return float(at), int(ns) / 1e9
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"bench: the simulation meter {meter} is not being written") from None
            time.sleep(0.05)


def _meter_rate(a: tuple[float, float], b: tuple[float, float]) -> float:
    """CPU seconds per second in the simulated NVML between two meter readings."""
    return (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else 0.0


def scrape_once(port: int) -> tuple[float, int, bytes, str]:
    """One scrape like Prometheus's (fresh connection): (seconds, status, body, content encoding)."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
        resp = conn.getresponse()
        body = resp.read()
        elapsed = time.perf_counter() - started
        return elapsed, resp.status, body, resp.getheader("Content-Encoding") or ""
    finally:
        conn.close()


def _steady(port: int, seconds: float, rate: float) -> list[float]:
    """Scrape at ``rate`` per second for ``seconds`` (never two at once); the latencies in seconds."""
    latencies: list[float] = []
    start = time.perf_counter()
    n = 0
    while True:
        due = start + n / rate
        if due - start >= seconds:
            return latencies
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        latencies.append(_checked(port))
        n += 1


def _checked(port: int) -> float:
    """One scrape's latency in seconds; an error unless HTTP 200."""
    elapsed, status, _, _ = scrape_once(port)
    if status != 200:
        raise RuntimeError(f"bench: scrape of 127.0.0.1:{port} answered HTTP {status}")
    return elapsed


def back_to_back(port: int, count: int) -> list[float]:
    """``count`` scrapes, each as soon as the previous one ended; the latencies in seconds."""
    return [_checked(port) for _ in range(count)]


def spaced(port: int, count: int, spacing: float = SPACING) -> list[float]:
    """``count`` scrapes ``spacing`` seconds apart (each after a fresh poll); the latencies in seconds."""
    latencies = []
    start = time.perf_counter()
    for n in range(count):
        pause = start + n * spacing - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        latencies.append(_checked(port))
    return latencies


def idle_floor(spec: ExporterSpec, count: int) -> list[float]:
    """Latencies (s) of ``count`` spaced scrapes of ``spec`` started to poll once only; [] if it cannot be told so.

    The spaced scrapes of :func:`measure` arrive at a server that has been idle for a second, and
    pay for that (the thread's wake-up, cold caches) whatever the body costs. Here the exporter's
    poll interval is an hour, so every spaced scrape reads the body cached since the previous one:
    what a scrape after a poll costs at best, at the same pace.
    """
    if "--poll-interval" not in spec.argv:
        return []
    argv = list(spec.argv)
    argv[argv.index("--poll-interval") + 1] = "3600"
    with started(ExporterSpec(spec.name, tuple(argv), spec.env, spec.meter)) as running:
        back_to_back(running.port, 10)  # the serving path warmed up as in measure()
        latencies = spaced(running.port, count)
        running.check_alive("during the idle-floor scrapes")
    return latencies


def _cpu_seconds(proc: psutil.Process) -> float:
    """User+system seconds of the whole process, finished threads included (10 ms resolution)."""
    times = proc.cpu_times()
    return float(times.user + times.system)


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Nanoseconds on the CPU of each live thread (/proc/PID/task/TID/schedstat); {} where unavailable."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def _delta(before: dict[int, int], after: dict[int, int]) -> float:
    """Seconds of CPU between two thread_cpu_ns snapshots."""
    return sum(after[k] - before.get(k, 0) for k in after) / 1e9


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (1-99) with linear interpolation between the closest ranks.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass
class Running:
    """An exporter started by :func:`started`: its process, port, and the tail of its output."""

    proc: subprocess.Popen[bytes]
    port: int
    log: IO[bytes]

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def check_alive(self, stage: str) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"bench: {self.proc.args!r} exited {stage}: {self.output()}")


@contextlib.contextmanager
def started(spec: ExporterSpec) -> Iterator[Running]:
    """Start ``spec`` on a free port, wait until it serves GPU metrics, and stop it on exit."""
    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in spec.argv]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, env=spec.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        running = Running(proc, port, log)
        try:
            _wait_ready(proc, port, running.output)
            yield running
        finally:
            _stop(proc)


def measure(spec: ExporterSpec, durations: Durations, gpus: int, processes: int) -> ScrapeResult:
    """Start ``spec``, warm it up, then measure idle CPU, and latency and CPU under a steady scraper."""
    with started(spec) as running:
        proc, port = running.proc, running.port
        ps = psutil.Process(proc.pid)
        _steady(port, durations.warmup, durations.rate)
        rss = ps.memory_info().rss / MB
        time.sleep(durations.settle)
        m0 = read_meter(spec.meter)
        s0, c0, t0 = thread_cpu_ns(proc.pid), _cpu_seconds(ps), time.perf_counter()
        time.sleep(durations.idle)
        s1, c1, t1 = thread_cpu_ns(proc.pid), _cpu_seconds(ps), time.perf_counter()
        m1 = read_meter(spec.meter)
        latencies = _steady(port, durations.scrape, durations.rate)
        c2, t2 = _cpu_seconds(ps), time.perf_counter()
        m2 = read_meter(spec.meter)
        burst = [x * 1000 for x in back_to_back(port, durations.burst)]
        far = [x * 1000 for x in spaced(port, durations.spaced)]
        _, _, body, encoding = scrape_once(port)
        running.check_alive("during the measurement")
    # Polling alone: per-thread schedstat (ns) where available, since no thread ends while idle.
    idle_rate = (_delta(s0, s1) if s1 else c1 - c0) / (t1 - t0)
    busy_rate = (c2 - c1) / (t2 - t1)
    floor = [x * 1000 for x in idle_floor(spec, durations.floor)] if durations.floor else []
    text = gzip.decompress(body) if encoding == "gzip" else body
    series = sum(1 for line in text.decode().splitlines() if line and not line.startswith("#"))
    ms = [x * 1000 for x in latencies]
    return ScrapeResult(
        exporter=spec.name, gpus=gpus, processes=processes, scrapes=len(ms),
        p50_ms=statistics.median(ms), p99_ms=percentile(ms, 99), max_ms=max(ms),
        poll_cpu_s_per_min=idle_rate * 60, cpu_s_per_min=busy_rate * 60,
        sim_poll_s_per_min=_meter_rate(m0, m1) * 60, sim_scraped_s_per_min=_meter_rate(m1, m2) * 60,
        cpu_ms_per_scrape=max(0.0, (c2 - c1) - idle_rate * (t2 - t1)) * 1000 / len(ms),
        rss_mb=rss, series=series, wire_bytes=len(body),
        burst_p50_ms=statistics.median(burst) if burst else math.nan,
        spaced_p50_ms=statistics.median(far) if far else math.nan,
        spaced_p99_ms=percentile(far, 99) if far else math.nan, spaced_scrapes=len(far),
        floor_p50_ms=statistics.median(floor) if floor else math.nan)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, output: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bench: {proc.args!r} exited with {proc.returncode}: {output()}")  # type: ignore[operator]
        try:
            _, status, body, encoding = scrape_once(port)
        except OSError:
            time.sleep(0.2)
            continue
        text = gzip.decompress(body) if encoding == "gzip" else body
        if status == 200 and b"\ngpu_" in text:
            return
        time.sleep(0.2)
    raise RuntimeError(f"bench: {proc.args!r} did not serve GPU metrics within {timeout:g}s: {output()}")  # type: ignore[operator]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


_RSS_PROBE = """
import sys, pynvml, yaml
if sys.argv[1]:
    from gpu_exporter.simulate import install
    install(sys.argv[1])
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        pynvml.nvmlDeviceGetUtilizationRates(h)
print("ready", flush=True)
sys.stdin.readline()
"""


def simulation_rss_mb(scenario: Path) -> float:
    """Memory the simulated NVML itself adds to a process (so RSS can be compared with a real driver)."""
    sizes = []
    for arg in ("", str(scenario)):
        proc = subprocess.Popen([sys.executable, "-c", _RSS_PROBE, arg], env=_python_env(str(EXPORTER_SRC)),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            if proc.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"bench: the memory probe for {scenario} failed")
            sizes.append(psutil.Process(proc.pid).memory_info().rss / MB)
            proc.stdin.close()
        finally:
            proc.wait(timeout=30)
    return max(0.0, sizes[1] - sizes[0])
