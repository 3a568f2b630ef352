"""Whose code the training thread runs while the GPU waits: an in-process stack sampler (causes FO, HW).

The problem: inside the ``compute`` phase the GPU can sit idle for a third of the step while the
training thread runs Python that is no GPU work: the framework's own code between the operators
(Lightning's loop, hooks and optimizer closure, the Trainer's, accelerate's) or the job's own host
work (a numpy loss, a Python augmentation). The phase timers see only ``compute``; M3 (launch-bound)
needs the GPU idle for more than half of it. This sampler tells the three apart.

A daemon thread wakes :data:`DEFAULT_HZ` times a second and, only while the run's current phase is
``compute`` or ``other`` (the loop between the phases, where a framework runs its own code), reads the
training thread's stack with ``sys._current_frames()`` and classifies it by its innermost frame that
is not plain library code (:func:`classify`):

* ``torch``: a frame of torch itself (operators, autograd, the optimizer, module calls): launch
  overhead or GPU work, what M3 is about;
* ``framework``: a frame of ``lightning``/``pytorch_lightning``/``lightning_fabric``, ``transformers``
  or ``accelerate``: framework overhead (cause FO);
* ``host``: the job's own code (any file outside the standard library and the installed packages):
  host work inside the step (cause HW); the function is kept by name (``train.py:88:augment``).

Other library frames (numpy, the standard library, torchvision, this package) belong to whoever
called them, so a numpy augmentation called from ``train.py`` is the job's host work. Each sample
counts the time since the previous one (at most :data:`MAX_GAP` seconds), so a late wake-up under
load does not lose time. ``host`` and ``torch`` count in ``compute`` only, ``framework`` in both phases; in ``other``
a torch frame belongs to its caller too (Lightning's loop detaching and cloning the loss between the hooks is the
framework's overhead, not the model's compute).

Reading a stack needs the GIL. A torch operator lets go of it at once, Python only at the interpreter's switch
interval, so a stretch of Python shorter than the interval ends before the sampler gets its turn, and the sample
lands on the next operator. At Python's default of 5 ms this under-read the job's own code badly where operators
themselves run Python (the simulated GPU's dispatch mode, ``__torch_function__`` wrappers, hooks): a 4 ms
augmentation that took 71-76% of the step read 27% (``bench.stack_sampler --accuracy``). While a sampler runs, the
switch interval is therefore :data:`SWITCH_INTERVAL` (0.5 ms; it read 65% there), unless the process set its own;
the last sampler to stop puts the default back. Python frames only: a tensor operation called straight from the
job's own code (``x @ w`` in ``train.py``) has no torch frame and counts as host work; one called from a module's
``forward`` in ``torch/nn`` or through ``loss.backward()`` does not.
Cost: the measured figure is in docs/benchmarks.md ("Stack sampler"); ``GPU_EXPORTER_STACK_SAMPLING_HZ=0`` turns it off.

>>> classify(__file__), classify("/usr/lib/python3/site-packages/lightning/pytorch/loops/fit_loop.py")
('', 'framework')
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path
from time import perf_counter
from types import FrameType
from typing import Any

from .protocol import CODE_PARTS, MAX_CODE_FUNCTIONS

ENV = "GPU_EXPORTER_STACK_SAMPLING_HZ"
"""Environment variable: samples per second (0 turns the sampler off)."""

DEFAULT_HZ = 50.0
"""Samples per second by default; the cost at this rate is in docs/benchmarks.md ("Stack sampler")."""

MAX_HZ = 1000.0
"""The highest rate the variable may ask for."""

MAX_GAP = 0.25
"""Most seconds one sample counts for (a process stopped for a while must not credit its last frame)."""

SWITCH_INTERVAL = 0.0005
"""The interpreter's switch interval (seconds) while a sampler runs, where the process keeps Python's default: the
longest the sampler waits for the GIL behind the training thread's Python (module docstring)."""

PYTHON_SWITCH_INTERVAL = 0.005
"""Python's default switch interval: the one value the sampler replaces (a process's own choice stays)."""

_switch_lock = threading.Lock()
_switch_users = 0
"""Samplers running with the lowered switch interval (the last one to stop restores the default)."""

MAX_FUNCTIONS = 2000
"""Distinct functions of the job's own code kept; beyond that new ones are counted as ``host`` only."""


TORCH = re.compile(r"[/\\](torch|functorch)[/\\]")
SIMULATED_DEVICE = re.compile(r"[/\\]gpu_exporter[/\\]simulate[/\\]")
"""The simulated GPUs' job side (``simulate/device.py``: launch, synchronize, item), this repo's stand-in for
torch.cuda: its frames count as ``torch`` (the CPU cost of a simulated launch is launch overhead, M3, not the
job's host work)."""
FRAMEWORK = re.compile(r"[/\\](lightning|pytorch_lightning|lightning_fabric|transformers|accelerate)[/\\]")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9_.:/@+-]")
_PACKAGE = str(Path(__file__).resolve().parent.parent)  # gpu_exporter itself: library code


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths} | {_PACKAGE}
    return tuple(sorted(os.path.join(str(Path(r).resolve()), "") for r in roots if r))


_ROOTS = _library_roots()


def classify(filename: str) -> str:
    """The class of a frame's file: ``torch``, ``framework``, ``host`` (the job's own code), or "" (other library).

    >>> classify("/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py"), classify("/home/me/train.py")
    ('torch', 'host')
    >>> classify("/repo/exporter/gpu_exporter/simulate/device.py")
    'torch'
    """
    if TORCH.search(filename) or SIMULATED_DEVICE.search(filename):
        return "torch"
    if FRAMEWORK.search(filename):
        return "framework"
    if filename.startswith("<") or "site-packages" in filename or "dist-packages" in filename:
        return ""
    try:
        resolved = os.path.realpath(filename)
    except (OSError, ValueError):
        return ""
    return "" if resolved.startswith(_ROOTS) else "host"


def function_label(filename: str, first_line: int, name: str) -> str:
    """A function of the job's own code as a label value: ``train.py:88:augment``.

    >>> function_label("/home/me/train.py", 88, "<lambda>")
    'train.py:88:_lambda_'
    """
    return _NOT_LABEL.sub("_", f"{os.path.basename(filename)}:{first_line}:{name}")[:128]


def rate_from_env(environ: dict[str, str] | None = None) -> float:
    """Samples per second from :data:`ENV` (default :data:`DEFAULT_HZ`); ValueError with one sentence if bad.

    >>> rate_from_env({ENV: "0"}), rate_from_env({})
    (0.0, 50.0)
    """
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return DEFAULT_HZ
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not 0 <= rate <= MAX_HZ:
        raise ValueError(f"training: {ENV}={text!r} must be a number of samples per second from 0 (off) to "
                         f"{MAX_HZ:g}")
    return rate


class StackSampler:
    """Samples one thread's stack while ``phase()`` names ``compute`` or ``other`` (module docstring).

    ``phase`` is read from the sampler thread: the name of the run's current phase. ``snapshot()`` (any
    thread) gives the cumulative seconds per class and the biggest functions of the job's own code.
    """

    def __init__(self, thread_id: int, phase: Callable[[], str], rate: float = DEFAULT_HZ) -> None:
        if not 0 < rate <= MAX_HZ:
            raise ValueError(f"training: the stack sampling rate must be above 0 and at most {MAX_HZ:g}, not {rate}")
        self._target = thread_id
        self._phase = phase
        self._interval = 1.0 / rate
        self._seconds = dict.fromkeys(CODE_PARTS, 0.0)
        self._functions: dict[str, float] = {}
        self._classes: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-exporter-stack-sampler", daemon=True)
        self._switched = False
        self.samples = 0
        """Stacks read so far (for tests and the benchmark)."""

    def start(self) -> None:
        global _switch_users
        with _switch_lock:
            if _switch_users or sys.getswitchinterval() == PYTHON_SWITCH_INTERVAL:
                sys.setswitchinterval(SWITCH_INTERVAL)
                _switch_users += 1
                self._switched = True
        self._thread.start()

    def stop(self) -> None:
        global _switch_users
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with _switch_lock:
            if self._switched:
                self._switched = False
                _switch_users -= 1
                if not _switch_users and sys.getswitchinterval() == SWITCH_INTERVAL:
                    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)

    def _loop(self) -> None:
        last = perf_counter()
        wait, interval = self._stop.wait, self._interval
        while not wait(interval):
            now = perf_counter()
            gap, last = min(now - last, MAX_GAP), now
            phase = self._phase()
            if phase == "compute" or phase == "other":
                frame = sys._current_frames().get(self._target)
                if frame is None:  # the training thread is gone
                    return
                self.sample(frame, gap, phase == "compute")
                del frame

    def sample(self, frame: FrameType | None, seconds: float, in_compute: bool) -> None:
        """Count ``seconds`` for the innermost classified frame of the stack that ends at ``frame`` (outside compute,
        torch's frames are passed over too: an operator the framework calls between the phases is its bookkeeping)."""
        classes = self._classes
        while frame is not None:
            code = frame.f_code
            part = classes.get(code.co_filename)
            if part is None:
                part = classes[code.co_filename] = classify(code.co_filename)
            if part and (in_compute or part != "torch"):
                break
            frame = frame.f_back
        else:
            return
        if not in_compute and part != "framework":
            return
        with self._lock:
            self.samples += 1
            self._seconds[part] += seconds
            if part == "host":
                label = function_label(code.co_filename, code.co_firstlineno, code.co_name)
                if label in self._functions or len(self._functions) < MAX_FUNCTIONS:
                    self._functions[label] = self._functions.get(label, 0.0) + seconds

    def snapshot(self) -> dict[str, Any]:
        """The snapshot's ``code`` field: seconds per class and the biggest functions of the job's own code
        (:data:`~gpu_exporter.training.protocol.MAX_CODE_FUNCTIONS` at most).

        >>> StackSampler(0, lambda: "other").snapshot()
        {'torch': 0.0, 'framework': 0.0, 'host': 0.0, 'functions': []}
        """
        with self._lock:
            seconds = dict(self._seconds)
            top = sorted(self._functions.items(), key=lambda kv: -kv[1])[:MAX_CODE_FUNCTIONS]
        return {**seconds, "functions": [{"name": name, "seconds": s} for name, s in top]}
