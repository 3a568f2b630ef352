"""The stack sampler: phases of GPU jobs nobody instrumented, from their Python stacks with py-spy (opt-in).

With ``sampling.rate`` above 0 (config; off by default), the exporter runs ``py-spy record`` on
every GPU process the ``evidence`` collector sees, in windows of :data:`WINDOW_SECONDS`, at that
many samples per second, and maps each sample of the process's main thread to a phase by its
outermost recognised frame (:func:`phase_of`):

* ``data``: DataLoader iteration and fetching (``torch/utils/data/``);
* ``checkpoint``: ``torch/serialization.py`` (``torch.save``), ``torch/distributed/checkpoint/`` and the
  ``state_dict()`` of a module or optimizer (gathering what a checkpoint saves);
* ``compute``: any other frame of torch itself: module forward and ``torch.nn.functional``, backward,
  the optimizer and the wrappers around them (``torch/_compile.py``, ``torch/_ops.py``), but not
  ``torch/utils/`` (TensorBoard, decorators) or ``torch/distributed/`` (collectives wait, they do not compute);
* ``other``: everything else (metrics, logging, the loop itself: the sampler cannot tell metrics apart,
  nor a tensor operation called straight from the loop's own code, which has no torch frame).

py-spy pauses the process for each read: the job kept 99% or more of its throughput at 50 samples/s, while
``--nonblocking`` reads race the running job and about 5% fail (docs/benchmarks.md, "Sampled phases").

Each window's shares times its wall time are added to the process's phase seconds and stored in
the training store as run ``pid-<pid>`` (rank 0) on the process's GPU, marked ``source="sampled"``:
the gpu_training_* series, the recording rules, the cause table, the alerts and diagnose treat it
like a reported run and say that it is sampled. A GPU on which a run reports its own phases is not
sampled. py-spy needs ptrace rights on the process (CAP_SYS_PTRACE, and the host PID namespace;
docs/runbooks.md, "Sampled phases"); where it is refused the process is skipped and logged once.

>>> phase_of(["<module> (train.py:40)", "__next__ (torch/utils/data/dataloader.py:631)", "fetch (x.py:1)"])
'data'
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gpu_exporter.collectors.base import Assembly
from gpu_exporter.training.protocol import CHECKPOINT, COMPUTE, DATA, OTHER

log = logging.getLogger(__name__)

WINDOW_SECONDS = 5
"""Seconds of one ``py-spy record`` run; the estimates move forward once per window."""

RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (DATA, re.compile(r"[(/]torch/utils/data/")),
    (CHECKPOINT, re.compile(r"[(/]torch/(serialization\.py|distributed/checkpoint/)|state_dict \(torch/")),
    (COMPUTE, re.compile(r"[(/]torch/(?!utils/|distributed/)")),
)
"""Phase -> pattern on a frame (``function (file:line)``), tried from the outermost frame inward."""

FRAME_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def phase_of(frames: Sequence[str]) -> str:
    """The phase of one sample: its outermost frame that a rule of :data:`RULES` recognises, else other."""
    for frame in frames:
        for phase, pattern in RULES:
            if pattern.search(frame):
                return phase
    return OTHER


def parse_raw(text: str, pid: int) -> dict[str, int]:
    """Samples per phase of the main thread in ``py-spy record --format raw --threads`` output.

    The first frame names the thread: ``thread (TID): NAME``; the main thread's TID is the PID.
    Samples whose outermost frame is not the one most samples start from (the script's ``<module>``) are partial
    reads, dropped.

    >>> parse_raw("thread (7): MainThread;<module> (a.py:1);save (torch/serialization.py:9) 3\\n"
    ...           "thread (7): MainThread;forward (torch/nn/modules/linear.py:9) 1\\n"
    ...           "thread (8): pusher;run (b.py:2) 5\\n", 7)
    {'checkpoint': 3}
    """
    by_root: dict[str, dict[str, int]] = {}
    main = f"thread ({pid})"
    for line in text.splitlines():
        m = FRAME_LINE.match(line.strip())
        if m is None:
            continue
        frames = m["stack"].split(";")
        if len(frames) < 2 or (not frames[0].startswith(main) and not frames[0].endswith(": MainThread")):
            continue
        counts = by_root.setdefault(frames[1].split(" (")[0], {})
        phase = phase_of(frames[1:])
        counts[phase] = counts.get(phase, 0) + int(m["count"])
    return max(by_root.values(), key=lambda c: sum(c.values()), default={})


def pyspy_binary() -> str | None:
    """py-spy next to this Python (a virtual environment) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class PhaseSampler:
    """The background sampler: one ``py-spy record`` per GPU process per window (see the module docstring).

    ``processes()`` gives (pid, gpu index, uuid) of the GPU processes (the evidence collector's
    latest poll); ``store`` is the TrainingStore (``has_reported_run``, ``put_sampled``).
    """

    name = "stacks"

    @classmethod
    def build(cls, assembly: Assembly) -> PhaseSampler | None:
        """The exporter's (gpu_exporter.collectors), for ``sampling.rate``; None when it cannot work (logged)."""
        evidence: Any = next((c for c in assembly.polling if c.name == "evidence"), None)
        store = assembly.built.get("training")
        if evidence is None or store is None:
            log.error("sampling.rate needs the evidence collector (it lists the GPU processes) and training ingest "
                      "(it holds the sampled phases): enable both, or set sampling.rate to 0")
            return None
        return cls(assembly.config.sampling_rate, lambda: evidence.processes, store)

    def __init__(self, rate: float, processes: Callable[[], Iterable[tuple[int, str, str]]], store: Any,
                 window: int = WINDOW_SECONDS, pyspy: str | None = None) -> None:
        self.rate = rate
        self.window = window
        self.processes = processes
        self.store = store
        self.pyspy = pyspy or pyspy_binary()
        self._seconds: dict[tuple[int, str], dict[str, float]] = {}
        self._started: dict[tuple[int, str], float] = {}
        self._refused: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-exporter-phase-sampler", daemon=True)

    def start(self) -> None:
        """Start sampling in the background (logs once and does nothing without py-spy)."""
        if self.pyspy is None:
            log.error("sampling.rate is set but py-spy is not installed (pip install "
                      "'gpu-utilization-exporter[sampling]', or py-spy): no sampled phases")
            return
        log.info("sampling the Python stacks of GPU processes at %g Hz with %s", self.rate, self.pyspy)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current window (its py-spy runs are ended)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.window + 10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception:  # a sampler bug must never take the exporter down
                log.exception("phase sampler failed; retrying next window")
            self._stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))

    def sample_once(self) -> None:
        """One window: record every unreported GPU process at once, then store the estimates."""
        wanted = [(pid, uuid) for pid, _, uuid in self.processes()
                  if pid not in self._refused and not self.store.has_reported_run(uuid)]
        if not wanted:
            self._stop.wait(self.window)
            return
        with tempfile.TemporaryDirectory(prefix="gpu-exporter-pyspy-") as tmp:
            started = time.monotonic()
            runs = {key: self._record(key[0], Path(tmp) / f"{key[0]}.txt") for key in wanted}
            for key, proc in runs.items():
                self._finish(key, proc, Path(tmp) / f"{key[0]}.txt", started)
        self._seconds = {k: v for k, v in self._seconds.items() if k in runs}
        self._started = {k: v for k, v in self._started.items() if k in runs}

    def _record(self, pid: int, out: Path) -> subprocess.Popen[str]:
        assert self.pyspy is not None
        argv = [self.pyspy, "record", "--pid", str(pid), "--rate", f"{self.rate:g}", "--duration", str(self.window),
                "--format", "raw", "--idle", "--threads", "--output", str(out)]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def _finish(self, key: tuple[int, str], proc: subprocess.Popen[str], out: Path, started: float) -> None:
        pid, uuid = key
        try:
            _, err = proc.communicate(timeout=self.window + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        elapsed = time.monotonic() - started
        counts = parse_raw(out.read_text() if out.exists() else "", pid)
        total = sum(counts.values())
        if not total:
            if proc.returncode not in (0, None) and ("ermission" in err or "ptrace" in err.lower()):
                self._refused.add(pid)
                log.warning("py-spy may not read process %d (%s): no sampled phases for it; it needs "
                            "CAP_SYS_PTRACE (docs/runbooks.md, Sampled phases)", pid, err.strip().splitlines()[-1])
            return
        seconds = self._seconds.setdefault(key, dict.fromkeys((DATA, COMPUTE, CHECKPOINT, OTHER), 0.0))
        self._started.setdefault(key, time.time() - elapsed)
        for phase, n in counts.items():
            seconds[phase] += elapsed * n / total
        current = max(counts, key=lambda p: counts[p])
        self.store.put_sampled(uuid, pid, dict(seconds), current, self._started[key])

