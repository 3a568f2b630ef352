"""Whose code holds the GPU idle inside the step: framework overhead (FO) and host work (HW), two rows of the table.

The training library's stack sampler (gpu_exporter.training.sampler) counts the seconds the training thread runs
the framework's own code (Lightning, Transformers, accelerate; in ``compute`` and between the phases) and the
job's own code inside ``compute`` (a numpy loss, a Python augmentation), with the job's biggest function by name.
The exporter exports them as ``gpu_training_code_seconds_total{code}`` and
``gpu_training_host_function_seconds_total{function}``; the rules record their shares of the step
(:data:`RECORDS`). The compute phase's idle GPU time then has three named parts: launch overhead (M3, the CPU inside
torch operators), framework overhead (FO) and host work (HW). :class:`CodeShare` is their kind: a share of the step
above ``metrics_bound_share`` (the threshold of every other "CPU work in the step that is not GPU work" cause) on a
GPU below target. HW names the function: ``train.py:88 `augment()` takes 31% of the step`` (:func:`function_text`),
in diagnose --url (from :attr:`RunSignals.host_function <gpu_exporter.verdict.signals.RunSignals>`) and in the
alert's text (a lookup of the recorded share).

>>> function_text("train.py:88:augment", 0.31)
'train.py:88 `augment()` takes 31% of the step'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from gpu_exporter import catalog
from gpu_exporter.training.protocol import COMPUTE, OTHER
from gpu_exporter.verdict.format import pct
from gpu_exporter.verdict.kinds import HIDDEN, Cause, Found
from gpu_exporter.verdict.promql import RUN_SEL, C
from gpu_exporter.verdict.samples import Labels, window_shares
from gpu_exporter.verdict.signals import RunSignals

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["FUNCTION_RECORDS", "RECORDS", "CodeShare", "FrameworkOverhead", "HostWork", "IdleSplit", "function_text",
           "idle_split", "window_code"]

CODE_SHARE = catalog.RUN_TRAINING_CODE_SHARE5M.name
FUNCTION_SHARE = catalog.RUN_TRAINING_HOST_FUNCTION_SHARE5M.name
_WALL = (f"/ on ({C}, run, rank, uuid) group_left ()\n"
         f"sum by ({C}, run, rank, uuid) (rate({catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name}[5m]))\n")
RECORDS = (
    (CODE_SHARE, f"rate({catalog.GPU_TRAINING_CODE_SECONDS_TOTAL.name}[5m])\n{_WALL}",
     "The share of the step (0-1) the training thread runs the framework's own code (part=framework) or the job's "
     "own code inside compute (part=host), by the library's stack sampler."),)
"""FO's recording rule (name, expression, comment): the shares both FO and HW read."""
FUNCTION_RECORDS = (
    (FUNCTION_SHARE, f"rate({catalog.GPU_TRAINING_HOST_FUNCTION_SECONDS_TOTAL.name}[5m])\n{_WALL}",
     "The share of the step (0-1) the run's biggest function of its own code takes inside compute (label function)."),
)
"""HW's recording rule: the share of its biggest function, which its verdict and alert name."""


def function_text(name: str, share: float) -> str:
    """A function of the job's own code (``file.py:line:name``) in the verdict's words."""
    where, _, function = name.rpartition(":")
    words = f"{where} `{function}()`" if where else f"`{name}`"
    return f"{words} takes {pct(share)} of the step"


class CodeShare(Cause):
    """FO, HW: the share of the step the training thread runs one class of code (:attr:`part`) in, from the stack
    sampler; HW's verdict names the job's biggest function (:attr:`names_function`)."""

    projected_by = HIDDEN
    owns = "{} of its time in {part} code"
    names_function: ClassVar[bool] = False

    def value_of(self, run: RunSignals) -> float:
        return (run.code or {}).get(self.part, 0.0)

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str,
             window_seconds: float) -> Found:
        found = super().find(u, memory, run, t, lvl, window_seconds)
        function = run.host_function if self.names_function else None
        return replace(found, callback=function_text(*function)) if found and function else found

    def promql(self) -> str:
        return f'max without (part) ({CODE_SHARE}{{part="{self.part}"}}) > ${{{self.keys[0]}}}'

    def alert_reason(self, table: Sequence[Cause]) -> str:
        base = super().alert_reason(table)
        if not self.names_function:
            return base
        sel, args = RUN_SEL
        query = f'printf "topk(1, {FUNCTION_SHARE}{sel})" {args}'
        return (f"{base}{{{{ with {query} | query }}}} Its biggest function: "
                f"`{{{{ . | first | label \"function\" }}}}` takes "
                "{{ . | first | value | humanizePercentage }} of the step.{{ end }}")

    def records(self) -> tuple[tuple[str, str, str], ...]:
        return FUNCTION_RECORDS if self.names_function else RECORDS

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        """Not projected for a finished run: the report reads phases, and the sampler's classes are no phase."""
        return None


class FrameworkOverhead(CodeShare):
    """FO: the framework's own code (Lightning's loop, hooks and optimizer closure, the Trainer's, accelerate's)."""

    part = "framework"


class HostWork(CodeShare):
    """HW: the job's own code inside compute (host work in the step), its biggest function named."""

    part = "host"
    names_function = True


def window_code(run_key: Callable[[Labels], Any], prev: Iterable[tuple[Labels, float]],
                cur: Iterable[tuple[Labels, float]], prev_functions: Iterable[tuple[Labels, float]],
                cur_functions: Iterable[tuple[Labels, float]], phase_window: Mapping[Any, Mapping[str, float]],
                ) -> tuple[dict[Any, dict[str, float]], dict[Any, tuple[str, float]]]:
    """Each run's code shares over a window between two readings of an exporter (``diagnose --url``, as
    gpu_exporter.verdict.samples.window_shares reads them), and its biggest function's (name, share), from
    gpu_training_code_seconds_total and gpu_training_host_function_seconds_total.

    >>> key = lambda labels: labels["run"]
    >>> host, fn = {"run": "r", "part": "host"}, {"run": "r", "function": "train.py:88:augment"}
    >>> window_code(key, [(host, 1.0)], [(host, 4.0)], [(fn, 1.0)], [(fn, 3.5)], {"r": {"compute": 10.0}})
    ({'r': {'host': 0.3}}, {'r': ('train.py:88:augment', 0.25)})
    """
    shares: dict[Any, dict[str, float]] = {}
    for key, labels, share in window_shares(run_key, "part", prev, cur, phase_window, new_ones=True):
        shares.setdefault(key, {})[labels.get("part", "")] = min(share, 1.0)
    functions: dict[Any, tuple[str, float]] = {}
    for key, labels, share in window_shares(run_key, "function", prev_functions, cur_functions, phase_window):
        if share > functions.get(key, ("", -1.0))[1]:
            functions[key] = (labels.get("function", ""), min(share, 1.0))
    return shares, functions


@dataclass(frozen=True)
class IdleSplit:
    """The GPU's idle time in ``compute`` and between the phases (``other``, where a framework runs its loop), and
    what explains it, each a share of the step: framework overhead (FO's reading), host work inside compute (HW's),
    launch overhead (M3: the rest of the idle time inside compute, where the run has M3), and the rest, for which no
    cause is known. ``sampled`` is False where the run sends no stack sampler readings (FO and HW then read 0)."""

    idle: float
    framework: float
    host: float
    launch: float
    unexplained: float
    sampled: bool = True

    def text(self) -> str:
        """The verdict's line.

        >>> IdleSplit(0.5, 0.3, 0.1, 0.0, 0.1).text()
        'GPU idle 50% of the step in compute and between the phases, 80% of it explained: framework overhead (FO) \
30%, host work (HW) 10%, launch overhead (M3) 0%; no cause known for 10%'
        """
        if self.idle <= 0:
            return "GPU idle 0% of the step in compute and between the phases"
        parts = (f"framework overhead (FO) {pct(self.framework)}, host work (HW) {pct(self.host)}, launch overhead "
                 f"(M3) {pct(self.launch)}")
        missing = "" if self.sampled else " (no stack samples from the job: FO and HW unmeasured)"
        return (f"GPU idle {pct(self.idle)} of the step in compute and between the phases, "
                f"{pct((self.idle - self.unexplained) / self.idle)} of it explained: {parts}; no cause known for "
                f"{pct(self.unexplained)}{missing}")


def idle_split(utilization: float, shares: Mapping[str, float], code: Mapping[str, float] | None,
               launch_bound: bool) -> IdleSplit:
    """The GPU's idle time in ``compute`` and ``other`` (their shares less ``utilization``), split by what explains
    it (:class:`IdleSplit`; launch overhead only where the run is ``launch_bound``), each part capped by the idle
    time left before it.

    >>> s = idle_split(0.15, {"compute": 0.4, "other": 0.35, "data": 0.25}, {"framework": 0.36, "host": 0.0}, False)
    >>> round(s.idle, 2), round(s.framework, 2), round(s.launch, 2), round(s.unexplained, 2)
    (0.6, 0.36, 0.0, 0.24)
    >>> round(idle_split(0.15, {"compute": 0.4, "other": 0.35}, {"framework": 0.36}, True).launch, 2)
    0.24
    """
    compute, other = shares.get(COMPUTE, 0.0), shares.get(OTHER, 0.0)
    idle = max(0.0, compute + other - utilization)
    framework = min(max((code or {}).get("framework", 0.0), 0.0), idle)
    host = min(max((code or {}).get("host", 0.0), 0.0), idle - framework)
    launch = 0.0
    if launch_bound:
        launch = max(0.0, min(compute - utilization - host, idle - framework - host))
    return IdleSplit(idle, framework, host, launch, max(0.0, idle - framework - host - launch), code is not None)
