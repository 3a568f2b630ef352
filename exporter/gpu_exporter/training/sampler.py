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
called them, so a numpy augmentation called from ``train.py`` is the job's host work. How long each phase took
comes from the run's phase timers, only its split from the stacks: each wake-up counts the seconds the timers
measured in ``compute`` and ``other`` since the previous one (at most :data:`MAX_GAP` each, so a process stopped
for a while does not credit its last frame), split by the phase's mix, the classes of its recent stacks
(:data:`MIX_DECAY`; a phase's seconds wait until one of its stacks is read). ``host`` and ``torch`` count in
``compute`` only, ``framework`` in both phases; in ``other`` a torch frame belongs to its caller too (Lightning's
loop detaching and cloning the loss between the hooks is the framework's overhead, not the model's compute).

Why the timers, and why :data:`SWITCH_INTERVAL`: reading a stack needs the GIL, which a torch operator lets go of at
once and Python only at the interpreter's switch interval, so stacks are read mostly inside operators. Counting the
wall time per stack read a Lightning loop's framework overhead at half its share on an idle machine; at Python's
default 5 ms a 4 ms augmentation that took 71-76% of the step read 27%. So the stack is read first after the wake-up,
the timers give the seconds, and while a sampler runs the switch interval is 0.5 ms unless the process set its own
(the last sampler to stop puts the default back). The measurements are in docs/training.md ("Whose code runs in the
step") and docs/benchmarks.md ("Stack sampler"). Python frames only: a tensor operation called straight from the
job's own code (``x @ w`` in ``train.py``) has no torch frame and counts as host work; one called from a module's
``forward`` in ``torch/nn`` or through ``loss.backward()`` does not. ``GPU_EXPORTER_STACK_SAMPLING_HZ=0`` turns it off.

>>> classify(__file__), classify("/usr/lib/python3/site-packages/lightning/pytorch/loops/fit_loop.py")
('', 'framework')
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import sysconfig
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from time import perf_counter
from types import FrameType
from typing import Any

from .protocol import CODE_PARTS, MAX_CODE_FUNCTIONS, to_label

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

SAMPLED_PHASES = ("compute", "other")
"""The phases whose stacks are read (module docstring)."""

MIX_DECAY = 0.98
"""Each stack read in a phase weighs this much less in the phase's mix than the next: the last ~50 count."""

MIX_FLOOR = 0.01
"""A key of a phase's mix that weighs less than this is dropped."""

Key = tuple[str, str]
"""A stack's (class, function label): ``("host", "train.py:88:augment")``, ``("torch", "")``, ``("", "")``."""

MAX_FUNCTIONS = 2000
"""Distinct functions of the job's own code kept; beyond that new ones are counted as ``host`` only."""


TORCH = re.compile(r"[/\\](torch|functorch)[/\\]")
SIMULATED_DEVICE = re.compile(r"[/\\]gpu_exporter[/\\]simulate[/\\]")
"""The simulated GPUs' job side (``simulate/device.py``: launch, synchronize, item), this repo's stand-in for
torch.cuda: its frames count as ``torch`` (the CPU cost of a simulated launch is launch overhead, M3, not the
job's host work)."""
FRAMEWORK = re.compile(r"[/\\](lightning|pytorch_lightning|lightning_fabric|transformers|accelerate)[/\\]")
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
    return to_label(f"{os.path.basename(filename)}:{first_line}:{name}")


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
        raise ValueError(f"training: {ENV}={text!r} must be a number of samples per second from 0 (off) to {MAX_HZ:g}")
    return rate


class StackSampler:
    """Samples one thread's stack while ``phase()`` names ``compute`` or ``other`` (module docstring).

    ``phase`` is read from the sampler thread: the name of the run's current phase; ``phase_seconds`` (from the
    sampler thread too) the run's seconds per phase so far by its timers (``Run.cpu_phase_seconds``), which each
    sample counts (module docstring); without it a sample counts the wall time since the previous one. ``snapshot()``
    (any thread) gives the cumulative seconds per class and the biggest functions of the job's own code.
    """

    def __init__(self, thread_id: int, phase: Callable[[], str], rate: float = DEFAULT_HZ,
                 phase_seconds: Callable[[], Mapping[str, float]] | None = None) -> None:
        if not 0 < rate <= MAX_HZ:
            raise ValueError(f"training: the stack sampling rate must be above 0 and at most {MAX_HZ:g}, not {rate}")
        self._target = thread_id
        self._phase = phase
        self._phase_seconds = phase_seconds
        self._interval = 1.0 / rate
        self._seconds = dict.fromkeys(CODE_PARTS, 0.0)
        self._functions: dict[str, float] = {}
        self._classify = functools.cache(classify)  # one answer per file
        self._lock = threading.Lock()
        self._stopped = threading.Lock()
        self._stopped.acquire()  # held until stop(): the sampler thread waits on it between samples (no Python)
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
        with contextlib.suppress(RuntimeError):  # stopped already
            self._stopped.release()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)
        with _switch_lock:
            if self._switched:
                self._switched = False
                _switch_users -= 1
                if not _switch_users and sys.getswitchinterval() == SWITCH_INTERVAL:
                    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)

    def _loop(self) -> None:
        target, frames, phase_of, clock = self._target, sys._current_frames, self._phase, self._phase_seconds
        stopped, interval = self._stopped.acquire, self._interval
        last = perf_counter()
        before = clock() if clock is not None else {}
        mixes: dict[str, dict[Key, float]] = {name: {} for name in SAMPLED_PHASES}
        pending = dict.fromkeys(SAMPLED_PHASES, 0.0)  # a phase's seconds not counted yet (none of its stacks read)
        while not stopped(True, interval):
            frame = frames().get(target)  # first: the one wait for the GIL after the wake-up (module docstring)
            phase = phase_of()
            if frame is None:  # the training thread is gone
                return
            now = perf_counter()
            gap, last = min(now - last, MAX_GAP), now
            key = self.key(frame, phase == "compute") if phase in mixes else None
            del frame
            if key is not None:
                self.samples += 1
            if clock is None:
                if key is not None:
                    self._credit({key: 1.0}, gap)
                continue
            if key is not None:
                mix = mixes[phase] = {k: w * MIX_DECAY for k, w in mixes[phase].items() if w * MIX_DECAY >= MIX_FLOOR}
                mix[key] = mix.get(key, 0.0) + 1.0
            seconds = clock()
            for name, mix in mixes.items():  # a phase gains at most the (capped) wall time since the last wake-up
                pending[name] += min(max(seconds.get(name, 0.0) - before.get(name, 0.0), 0.0), gap)
                if mix and pending[name] > 0:
                    self._credit(mix, pending[name])
                    pending[name] = 0.0
            before = seconds

    def key(self, frame: FrameType | None, in_compute: bool) -> Key:
        """(class, function label) of the innermost classified frame of the stack that ends at ``frame``: class ""
        (not counted) for none, or outside compute for anything but the framework's (there torch's frames are passed
        over: an operator the framework calls between the phases is its bookkeeping); the label for ``host`` only."""
        classify_file = self._classify
        while frame is not None:
            code = frame.f_code
            part = classify_file(code.co_filename)
            if part and (in_compute or part != "torch"):
                break
            frame = frame.f_back
        else:
            return ("", "")
        if not in_compute and part != "framework":
            return ("", "")
        return (part, function_label(code.co_filename, code.co_firstlineno, code.co_name) if part == "host" else "")

    def _credit(self, mix: Mapping[Key, float], seconds: float) -> None:
        """Count ``seconds`` of one phase, split by the weights of ``mix`` (its recent stacks' keys)."""
        total = sum(mix.values())
        with self._lock:
            for (part, label), weight in mix.items():
                if not part:
                    continue
                share = seconds * weight / total
                self._seconds[part] += share
                if label and (label in self._functions or len(self._functions) < MAX_FUNCTIONS):
                    self._functions[label] = self._functions.get(label, 0.0) + share

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
