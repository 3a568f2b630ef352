"""The kinds of cause: what differs between the rows of the cause table, one class per kind.

Its one job is the kinds (:class:`Cause` and its subclasses :class:`Phase`, :class:`CallbackPhase`,
:class:`Launch`, :class:`Allocator`, :class:`Straggler`, :class:`Communication`) and what they find
(:class:`Finding`). A kind gives each thing twice: in Python for the judge (``diagnose --url``, the status page,
the report) and as PromQL and Prometheus/Grafana alert text (Go templates) for the generated rules
(monitoring/causes.py), side by side so the two read alike. The rows themselves, and the judge that applies
them, are the cause table (:mod:`~gpu_exporter.verdict.causes`).

The projection is an upper bound: hiding a phase of share ``s`` (overlapping it with compute) shortens the step to
``1 - s`` of its time with the same GPU work, so utilization can reach at most ``u' / (1 - s)`` (``u'`` the run's
useful utilization, :func:`~gpu_exporter.verdict.levels.useful_utilization`); a launch-bound GPU (M3) can reach at
most the compute share. (M3 needs ``u < compute / 2``, where ``u' = u``: its condition reads the same with either.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypeAlias

from gpu_exporter import catalog
from gpu_exporter.verdict.alerts import runbook_anchor
from gpu_exporter.verdict.callbacks import NamedCallback
from gpu_exporter.verdict.format import Labelled, pct, seconds
from gpu_exporter.verdict.levels import threshold, useful_text
from gpu_exporter.verdict.promql import CAUSE_SHARE, LIVE, C, cause_share, projected_query, run_query, share
from gpu_exporter.verdict.remedies import Context, Remedy
from gpu_exporter.verdict.signals import RunSignals, common_communication, straggler_of

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["COMPUTED", "HIDDEN", "LABEL", "Allocator", "CallbackPhase", "Cause", "Communication", "Finding",
           "Launch", "Phase", "Straggler"]

HIDDEN, COMPUTED = "hidden", "computed"
"""How ``run:gpu_training_cause:projected_utilization`` projects a kind: ``u / (1 - share)``, or ``u + share``."""
UTIL, STEP = f"max by ({C}, uuid) ({catalog.GPU_UTILIZATION_AVG5M.name})", catalog.RUN_TRAINING_STEP_SECONDS_AVG5M.name
LABEL = "straggler_rank"
"""The label of a waiting rank's ST series that names the rank it waits for."""
Found: TypeAlias = "Finding | None"


@dataclass(frozen=True)
class Cause(Labelled):
    """One row of the cause table; its class is its kind, which holds everything that differs between kinds.

    ``keys`` are the thresholds.yml keys its condition reads. Each thing twice, for the judge and the rules: its
    condition (:meth:`find`; :meth:`promql`: the query before the level filter, which also keeps only live runs, its
    value the share, M4: events, that explains it), the reason, the projection, how a straggler with it reads
    (:meth:`own`) and its concrete remedy (``suggests``: :meth:`suggestion`, :meth:`alert_remedy`); :meth:`records`
    are its further recording rules (name, expression, comment). A new kind is one new subclass.
    """

    cause: str
    code: str
    title: str
    alert: str
    phase: str
    keys: tuple[str, ...]
    doing: str
    hidden: str
    remedy: str
    advice: str
    suggests: Remedy | None = None
    """The concrete remedy its run's reported context gives numbers for (M1: workers, M3: batch), or None."""

    first: ClassVar[bool] = False
    """Ranked before the others by :func:`~gpu_exporter.verdict.causes.cause_order` (it also explains them)."""
    run_wide: ClassVar[bool] = False
    """Judged across the ranks of a run: never a rank's own cause (what a straggler is named for)."""
    waits: ClassVar[bool] = False
    """Its findings wait for another rank (``Finding.straggler``, the step time projected without the wait)."""
    projected_by: ClassVar[str] = HIDDEN
    """How the projected-utilization rule projects it (:data:`HIDDEN`, :data:`COMPUTED`; "": not at all)."""
    part: ClassVar[str] = ""
    """FO, HW: the class of the sampler's code it reads (``framework``, ``host``: a label value of its series)."""
    measures, owns, alert_amount = "share of the step", "{} of its time in {phase}", "{{ $v | humanizePercentage }}"
    """What a value is in the Grafana alert's words; a straggler with it after its label (``{}`` the value);
    a value ``$v`` as Go template text."""

    @property
    def anchor(self) -> str:
        """The runbook section of the cause's alert (:func:`~gpu_exporter.verdict.alerts.runbook_anchor`)."""
        return runbook_anchor(self.alert)

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str,
             window_seconds: float) -> Found:
        """The finding of ``run`` at useful utilization ``u`` and level ``lvl``, or None (``window_seconds``: the
        judged window, 0 for the rules' own; only a counted kind, M4, scales its limit by it)."""
        value = self.value_of(run)
        return Finding(self, lvl, value, _hidden(u, value)) if value > threshold(t, self.keys[0]) else None

    def value_of(self, run: RunSignals) -> float:
        """The share of the step :meth:`find` compares with ``keys[0]``: its phase's."""
        return run.shares.get(self.phase, 0.0)

    def promql(self) -> str:
        return f"{share(self.phase)} > ${{{self.keys[0]}}}"

    def value_text(self) -> str:
        return "the share of the step it takes"

    def projection(self, f: Finding, now: str) -> str:
        """``"8% now, at most ~80% if loading overlapped compute"`` (``f.projected`` is set)."""
        return f"{now} now, at most ~{pct(f.projected or 0.0)} {self.hidden}"

    def alert_projection(self) -> str:
        return (f"{{{{ with {projected_query(self.cause)} | query }}}} If that were removed the GPU could reach at "
                f"most {{{{ . | first | value | humanizePercentage }}}} ({self.hidden}).{{{{ end }}}}")

    def reason(self, f: Finding, run: str, rank: str) -> str:
        """One sentence on what the run does, for diagnose, with the hook or function behind it (``f.callback``)."""
        said = f"run {run} rank {rank} spends {pct(f.value)} of its time {self.doing}"
        return f"{said}: {f.callback}." if f.callback else f"{said}."

    def alert_reason(self, table: Sequence[Cause]) -> str:
        """The alert's reason, Go template text (``table``: the cause table, for a straggler's own cause)."""
        return f"spends {{{{ $value | humanizePercentage }}}} of its time {self.doing}."

    def amount(self, value: float) -> str:
        """A finding's value in words: ``"38%"`` (M4: ``"3"`` events)."""
        return pct(value)

    def own(self, value: float) -> str:
        return self.owns.format(self.amount(value), phase=self.phase, part=self.part)

    def alert_own(self) -> str:
        return self.owns.format(self.alert_amount, phase=self.phase, part=self.part)

    def records(self) -> tuple[tuple[str, str, str], ...]:
        return ()

    def suggestion(self, ctx: Context, shares: Mapping[str, float], batch: float | None, utilization: float | None,
                   gpu_used: float | None, gpu_total: float | None, memory_target: float) -> str:
        """Its concrete remedy for one run from the run's readings (:attr:`suggests`), or ""."""
        return ("" if self.suggests is None
                else self.suggests.text(ctx, shares, batch, utilization, gpu_used, gpu_total, memory_target))

    def alert_remedy(self) -> str:
        """Template text: its concrete remedy from the recorded remedy series, before the advice of its alerts."""
        return "" if self.suggests is None else self.suggests.alert_text()

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        """The share of a finished run's wall time the cause takes (the report's projection, docs/cli.md), from its
        phase's ``share``, the ranks' ``communication`` shares and its mean ``utilization``; None: not projected."""
        return min(share, 1.0)


class Phase(Cause):
    """A phase of the step above its share (M1, M2, CK): the base class's behaviour."""


class CallbackPhase(NamedCallback, Phase):
    """A phase cause (CK, CB) whose verdict names the job's own callback hook that fills it (verdict/callbacks.py)."""


class Launch(Cause):
    """M3: the GPU idle inside the compute phase while memory is left: its value is compute share - ``u``."""

    projected_by = COMPUTED
    owns = "its GPU idle for {} of the step inside compute"

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str,
             window_seconds: float) -> Found:
        compute = run.shares.get(self.phase, 0.0)
        compute_key, busy_key, memory_key = self.keys
        if (compute > threshold(t, compute_key) and u / compute < threshold(t, busy_key)
                and memory is not None and memory < threshold(t, memory_key)):
            return Finding(self, lvl, compute - u, min(1.0, compute), run.batch_size)
        return None

    def promql(self) -> str:
        compute_key, busy_key, memory_key = self.keys
        compute = f"({share(self.phase)} > ${{{compute_key}}})"
        return (f"(\n    {compute}\n  - on ({C}, uuid) group_left ()\n    {UTIL}\n)\n"
                f"and\n(\n    {UTIL}\n  / on ({C}, uuid) group_right ()\n    {compute}\n"
                f"  < ${{{busy_key}}}\n)\n"
                f"and on ({C}, uuid)\n(max by ({C}, uuid) ({catalog.GPU_MEMORY_USED_RATIO.name})"
                f" < ${{{memory_key}}})")

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        return max(0.0, share - utilization) if utilization is not None else None

    def reason(self, f: Finding, run: str, rank: str) -> str:
        batch = f" with batch size {f.batch_size:.0f}" if f.batch_size is not None else ""
        return (f"run {run} rank {rank} computes{batch}, but the GPU is idle for {pct(f.value)} of the "
                "step inside the compute phase (small kernels, launch overhead).")

    def alert_reason(self, table: Sequence[Cause]) -> str:
        _, busy_key, memory_key = self.keys
        return ("keeps its GPU idle for {{ $value | humanizePercentage }} of the step inside the compute phase: "
                f"the GPU is busy for less than ${{{busy_key}|percent}} of the time the job computes while less "
                f"than ${{{memory_key}|percent}} of its memory is used (small batches or kernels, launch "
                "overhead).")


class Allocator(Cause):
    """M4: allocator retries above the window's limit, or an OOM: counted, not timed (no projection)."""

    first = True
    projected_by, measures, owns = "", "allocator events", "{} allocator retries and OOMs"
    alert_amount = "{{ $v | humanize }}"

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str,
             window_seconds: float) -> Found:
        found = run.allocator_ooms > 0 or run.allocator_retries > self.limit(t, window_seconds)
        return Finding(self, lvl, run.allocator_retries + run.allocator_ooms, None) if found else None

    def limit(self, t: Thresholds, window_seconds: float) -> float:
        """The retry limit for a window: ``allocator_retries_threshold`` per ``allocator_window``, never less (its
        keys: window, then retries per window; diagnose's window may be longer than the rules')."""
        window_key, retries_key = self.keys
        return threshold(t, retries_key) * max(1.0, window_seconds / threshold(t, window_key))

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        return None

    def promql(self) -> str:
        window_key, retries_key = self.keys
        retries = f"increase({catalog.GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL.name}[${{{window_key}}}])"
        ooms = f"increase({catalog.GPU_TRAINING_ALLOCATOR_OOMS_TOTAL.name}[${{{window_key}}}])"
        return f"{retries} + {ooms}\nand\n({retries} > ${{{retries_key}}} or {ooms} > 0)"

    def value_text(self) -> str:
        return f"allocator retries + OOMs in ${{{self.keys[0]}}}"

    def amount(self, value: float) -> str:
        return f"{value:.0f}"

    def alert_projection(self) -> str:
        return ""

    def reason(self, f: Finding, run: str, rank: str) -> str:
        return f"run {run} rank {rank}: the CUDA caching allocator had {self.amount(f.value)} retries/OOMs."

    def alert_reason(self, table: Sequence[Cause]) -> str:
        window_key, retries_key = self.keys
        return ("had {{ $value | humanize }} caching-allocator retries and out-of-memory errors in the last "
                f"${{{window_key}}} (the limit is ${{{retries_key}}} retries and no OOM); each "
                "retry frees the cache and stalls the GPU.")


class Straggler(Cause):
    """ST: a rank waits in collectives for the run's least-communicating rank (``bottomk by (cluster, run)``, its
    rank as label :data:`LABEL`); the alert names that straggler's own cause from its series."""

    run_wide, waits = True, True

    def find(self, u: float, memory: float | None, run: RunSignals, t: Thresholds, lvl: str,
             window_seconds: float) -> Found:
        straggler = straggler_of(run.communication or {})
        wait = run.shares.get(self.phase, 0.0) - straggler[1] if straggler else 0.0
        return (Finding(self, lvl, wait, _hidden(u, wait), straggler=straggler[0], step_seconds=run.step_seconds)
                if straggler is not None and wait > threshold(t, self.keys[0]) else None)

    def promql(self) -> str:
        comm = share(self.phase)
        lowest = (f"label_replace(\n      bottomk by ({C}, run) (1, {comm} and {LIVE}),\n"
                  f'      "{LABEL}", "$1", "rank", "(.*)"\n    )')
        return (f"(\n    {comm}\n  - on ({C}, run) group_left ({LABEL})\n    {lowest}\n)\n"
                f"> ${{{self.keys[0]}}}")

    def projection(self, f: Finding, now: str) -> str:
        step = ("" if f.step_seconds is None else f"; the run's step would take "
                f"~{seconds(f.projected_step_seconds or 0.0)} instead of {seconds(f.step_seconds)}")
        return f"{now} now, at most ~{pct(f.projected or 0.0)} if rank {f.straggler} kept up{step}"

    def alert_projection(self) -> str:
        """The step shrinks by the wait, the alert's value: no lookup of the step time itself (every lookup of
        every waiting rank's alert costs its group ~0.1-0.4 ms an evaluation, docs/fleet.md)."""
        util = projected_query(self.cause)
        projected = run_query(catalog.RUN_TRAINING_STRAGGLER_PROJECTED_STEP_SECONDS.name)
        return (f"{{{{ with {util} | query }}}} If rank {{{{ $labels.{LABEL} }}}} kept up, the GPU could reach at "
                f"most {{{{ . | first | value | humanizePercentage }}}}{{{{ end }}}}{{{{ with {projected} | query }}}} "
                f"and the run's step would take ~{{{{ . | first | value | humanizeDuration }}}}, {{{{ $value | "
                "humanizePercentage }} less{{ end }}.")

    def reason(self, f: Finding, run: str, rank: str) -> str:
        why = f.straggler_cause or f"rank {f.straggler} is slower"
        return (f"run {run} rank {rank} is waiting for rank {f.straggler} (straggler): {why}. "
                f"{pct(f.value)} of rank {rank}'s time is that wait (its communication beyond rank "
                f"{f.straggler}'s).")

    def alert_reason(self, table: Sequence[Cause]) -> str:
        run_wide = "|".join(c.cause for c in table if c.run_wide)  # not the straggler's own cause
        query = (f'printf "topk(1, max without (level) ({CAUSE_SHARE}{{{C}=%q,run=%q,rank=%q,'
                 f'cause!~\\"{run_wide}\\"}}))" $labels.{C} $labels.run $labels.{LABEL}')
        chain = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq $c "{other.cause}" }}}}{other.label}, '
                        f"{other.alert_own()}" for i, other in enumerate(c for c in table if not c.run_wide))
        return (f"is waiting for rank {{{{ $labels.{LABEL} }}}} (straggler): {{{{ with {query} | query }}}}"
                f'{{{{ $c := . | first | label "cause" }}}}{{{{ $v := . | first | value }}}}'
                f"rank {{{{ $labels.{LABEL} }}}} is {chain}{{{{ else }}}}{{{{ $c }}}}{{{{ end }}}}"
                f"{{{{ else }}}}rank {{{{ $labels.{LABEL} }}}} has no cause of its own above the thresholds (more "
                f"work, or a slower or throttled GPU){{{{ end }}}}. {{{{ $value | humanizePercentage }}}} of this "
                f"rank's time is that wait (its communication beyond rank {{{{ $labels.{LABEL} }}}}'s).")

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        """The waiting ranks' mean communication beyond the straggler's."""
        straggler = straggler_of(communication)
        waiting = [v for r, v in communication.items() if straggler is not None and r != straggler[0]]
        return max(0.0, sum(waiting) / len(waiting) - straggler[1]) if straggler is not None and waiting else None

    def records(self) -> tuple[tuple[str, str, str], ...]:
        return ((catalog.RUN_TRAINING_STRAGGLER_PROJECTED_STEP_SECONDS.name,
                 f"{STEP}\n* on ({C}, run, rank, uuid) group_right ()\n"
                 f"(1 - max by ({C}, run, rank, uuid, {LABEL}) ({cause_share(self.cause)}))\n",
                 f"The run's step time if rank {LABEL} kept up: the waiting rank's step time without its wait."),)


class Communication(Cause):
    """CM: the run's lowest live communication share (``min by (cluster, run)``), what every rank pays."""

    run_wide = True

    def value_of(self, run: RunSignals) -> float:
        return common_communication(run.shares.get(self.phase, 0.0), run.communication)

    def promql(self) -> str:
        comm = share(self.phase)
        return (f"(\n    0 * {comm}\n  + on ({C}, run) group_left ()\n    min by ({C}, run) ({comm} and {LIVE})\n)\n"
                f"> ${{{self.keys[0]}}}")

    def run_share(self, share: float, communication: Mapping[str, float], utilization: float | None) -> float | None:
        """The communication every rank pays: the run's lowest share."""
        return min(communication.values()) if communication else None

    def reason(self, f: Finding, run: str, rank: str) -> str:
        return (f"run {run} rank {rank} spends {pct(f.value)} of its time in collectives that every live rank "
                "of the run pays (the run's least-communicating rank spends as much, so no straggler explains "
                "it): the gradient exchange itself is slow.")

    def alert_reason(self, table: Sequence[Cause]) -> str:
        return ("spends {{ $value | humanizePercentage }} of its time in collectives (phase communication) that "
                "every live rank of the run pays (the run's least-communicating rank spends as much, so no straggler "
                "explains it): the gradient exchange itself is slow.")


@dataclass(frozen=True)
class Finding:
    """One cause that applies: its level, the value that explains it (the share of the run's time it takes; M4:
    allocator events in the window) and the utilization the GPU could reach without it (None for M4)."""

    cause: Cause
    level: str
    value: float
    projected: float | None
    batch_size: float | None = field(default=None, compare=False)
    straggler: str = ""
    """ST: the rank this one waits for (the run's rank with the least communication)."""
    step_seconds: float | None = field(default=None, compare=False)
    """ST: this rank's step time now; times ``1 - value`` it is the run's step time if the straggler kept up."""
    straggler_cause: str = field(default="", compare=False)
    """ST: what holds the straggler back, in words (diagnose fills it from the straggler's own verdict)."""
    callback: str = field(default="", compare=False)
    """CK, CB: the callback hook of the job's own behind it, in words (verdict/callbacks.py)."""

    def summary(self, utilization: float, shares: Mapping[str, float] | None = None) -> str:
        """``"input-bound (M1): 8% now, at most ~80% if loading overlapped compute"``."""
        return f"{self.cause.label}: {self.projection(utilization, shares)}"

    def projection(self, utilization: float, shares: Mapping[str, float] | None = None) -> str:
        """``"8% now, at most ~80% if loading overlapped compute"``: ``utilization`` is the GPU's, ``shares`` the
        run's phase shares (:func:`~gpu_exporter.verdict.levels.useful_text`)."""
        now = useful_text(utilization, *(() if shares is None else (shares,)))
        return (f"{now} now; no projection (allocator stalls are counted, not timed)" if self.projected is None
                else self.cause.projection(self, now))

    @property
    def projected_step_seconds(self) -> float | None:
        """ST: the run's step time if the straggler kept up (this rank's step time without its wait)."""
        return None if self.step_seconds is None or not self.cause.waits else self.step_seconds * (1.0 - self.value)


def _hidden(utilization: float, share: float) -> float:
    """The utilization if a share ``share`` of the step were hidden: ``u / (1 - s)``, at most 1."""
    return 1.0 if share >= 1.0 else min(1.0, utilization / (1.0 - share))
