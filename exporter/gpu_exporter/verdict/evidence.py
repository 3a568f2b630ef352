"""Process evidence for the verdict: what /proc showed of the processes on each GPU.

The exporter's ``evidence`` collector exports gpu_process_* counters (CPU of the process and of
its children, worker children, bytes read, main-thread state seconds). Here they become one
:class:`~gpu_exporter.verdict.hints.ProcessSignals` per process: from two readings of an exporter
(the counter deltas over the window, :func:`from_snapshots`) or from Prometheus: the recording rules
of monitoring/evidence.py, whose hint series say which rows of :data:`~gpu_exporter.verdict.hints.HINTS`
passed (:func:`from_series`, which ``diagnose --prometheus-url`` calls with its query), or the raw counters'
rates over any window (:func:`from_window`: ``diagnose --window``, ``report``; the table then finds the
hints). The rates of both are :func:`rates` (the rules' with the window 5m). The verdict uses
them for GPUs with work but no live training run: the verdict "not instrumented" then says what
the evidence shows and, when a hint passes, which remedy it points at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from gpu_exporter import catalog
from gpu_exporter.verdict.hints import HINTS_BY_ID, Hint, ProcessSignals, find_hints, hint_text
from gpu_exporter.verdict.samples import Labels, Snapshot

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds

__all__ = ["HINTS_BY_ID", "WINDOWED", "ProcessSignals", "explain", "from_series", "from_snapshots", "from_window",
           "rates"]

Key = tuple[str, str]
"""(GPU uuid, pid)."""

_COUNTERS = (catalog.GPU_PROCESS_CPU_SECONDS_TOTAL.name, catalog.GPU_PROCESS_CHILDREN_CPU_SECONDS_TOTAL.name,
             catalog.GPU_PROCESS_READ_BYTES_TOTAL.name)
_STATES = catalog.GPU_PROCESS_MAIN_THREAD_STATE_SECONDS_TOTAL.name
WINDOWED = (*_COUNTERS, _STATES)
"""The counters whose rates over a window are the processes' evidence: CPU cores, the children's cores, bytes read
per second, main-thread state seconds per second (a share of the window once divided by their sum)."""


def rates(window: str) -> tuple[str, ...]:
    """``rate(<counter>[window])`` of each counter of :data:`WINDOWED`, in its order: with ``5m`` the recording
    rules' (monitoring/evidence.py), with any window :func:`from_window`'s queries."""
    return tuple(f"rate({name}[{window}])" for name in WINDOWED)


def _key(labels: Labels) -> Key:
    return labels.get("uuid", ""), labels.get("pid", "")


def _by_key(pairs: Iterable[tuple[Labels, float]]) -> dict[Key, float]:
    return {_key(labels): value for labels, value in pairs}


def _states(pairs: Iterable[tuple[Labels, float]]) -> dict[Key, dict[str, float]]:
    out: dict[Key, dict[str, float]] = {}
    for labels, value in pairs:
        out.setdefault(_key(labels), {})[labels.get("state", "other")] = value
    return out


def _signals(cpu: Mapping[Key, float], children: Mapping[Key, float], kids: Mapping[Key, float],
             reads: Mapping[Key, float], states: Mapping[Key, Mapping[str, float]],
             names: Mapping[Key, str]) -> dict[str, list[ProcessSignals]]:
    out: dict[str, list[ProcessSignals]] = {}
    for key, cores in sorted(cpu.items()):
        raw = states.get(key, {})
        total = sum(v for v in raw.values() if v > 0)
        shares = {s: round(max(v, 0.0) / total, 4) for s, v in raw.items()} if total > 0 else {}
        out.setdefault(key[0], []).append(ProcessSignals(
            pid=key[1], cpu_cores=round(max(cores, 0.0), 4),
            children_cpu_cores=round(max(children.get(key, 0.0), 0.0), 4),
            child_processes=int(kids.get(key, 0)), states=shares,
            read_bytes_per_second=reads.get(key), name=names.get(key, "")))
    return out


def _names(pairs: Iterable[tuple[Labels, float]]) -> dict[Key, str]:
    return {_key(labels): labels.get("process_name", "") for labels, _ in pairs}


def from_snapshots(prev: Snapshot, cur: Snapshot) -> dict[str, list[ProcessSignals]]:
    """Per GPU uuid, the processes seen in both scrapes, with rates over the time between them."""
    elapsed = cur.at - prev.at
    if elapsed <= 0:
        return {}
    rates: list[dict[Key, float]] = []
    for name in _COUNTERS:
        before = _by_key(prev.series(name))
        rates.append({k: max(v - before[k], 0.0) / elapsed for k, v in _by_key(cur.series(name)).items()
                      if k in before})
    old_states = _states(prev.series(_STATES))
    states = {k: {s: v - old_states.get(k, {}).get(s, 0.0) for s, v in d.items()}
              for k, d in _states(cur.series(_STATES)).items() if k in old_states}
    return _signals(rates[0], rates[1], _by_key(cur.series(catalog.GPU_PROCESS_CHILD_PROCESSES.name)), rates[2], states,
                    _names(cur.series(catalog.GPU_PROCESS_MEMORY_USED_BYTES.name)))


def from_window(query: Callable[[str], list[tuple[Labels, float]]], window: str) -> dict[str, list[ProcessSignals]]:
    """Per GPU uuid, the processes' readings over ``window`` from the raw counters (:func:`rates`; the child
    processes and names as they are at its end), as :func:`from_snapshots` reads two scrapes, the state shares as
    ``process:gpu_process_main_thread_state:share5m`` has them. No hints: the table finds them (:func:`explain`)."""
    cpu, children, read, states = (query(expr) for expr in rates(window))
    return _signals(_by_key(cpu), _by_key(children), _by_key(query(catalog.GPU_PROCESS_CHILD_PROCESSES.name)),
                    _by_key(read), _states(states), _names(query(catalog.GPU_PROCESS_MEMORY_USED_BYTES.name)))


SERIES = tuple(f.name for f in (
    catalog.PROCESS_CPU_RATE5M, catalog.PROCESS_CHILDREN_CPU_RATE5M, catalog.GPU_PROCESS_CHILD_PROCESSES,
    catalog.PROCESS_READ_BYTES_RATE5M, catalog.PROCESS_MAIN_THREAD_STATE_SHARE5M, catalog.GPU_PROCESS_MEMORY_USED_BYTES,
    catalog.PROCESS_HINT_VALUE))
"""The series :func:`from_series` reads, in its order (diagnose sends them with its other queries)."""


def from_series(query: Callable[[str], list[tuple[Labels, float]]]
                ) -> tuple[dict[str, list[ProcessSignals]], dict[Key, list[tuple[Hint, float]]]]:
    """The processes' readings from the recording rules, and the hints the rules found per (uuid, pid) (``query``:
    Prometheus' instant query of a PromQL expression, as (labels, value) pairs)."""
    cpu, children, kids, read, states, memory, found = (query(name) for name in SERIES)
    signals = _signals(_by_key(cpu), _by_key(children), _by_key(kids), _by_key(read), _states(states), _names(memory))
    hints: dict[Key, list[tuple[Hint, float]]] = {}
    for labels, value in found:
        hint = HINTS_BY_ID.get(labels.get("hint", ""))
        if hint is not None:
            hints.setdefault(_key(labels), []).append((hint, value))
    order = list(HINTS_BY_ID)
    return signals, {k: sorted(v, key=lambda hv: order.index(hv[0].name)) for k, v in hints.items()}


def explain(uuid: str, processes: Iterable[ProcessSignals], t: Thresholds,
            hints: Mapping[Key, list[tuple[Hint, float]]] | None) -> tuple[str, tuple[Hint, str] | None]:
    """(one sentence per process, the first hint that passes with its text) for a GPU nobody instrumented;
    ``hints``: the recording rules' findings (Prometheus), None: apply the table here."""
    sentences, first = [], None
    for p in processes:
        sentences.append(p.describe() + ".")
        found = find_hints(p, t) if hints is None else hints.get((uuid, p.pid), [])
        if found and first is None:
            hint, value = found[0]
            first = (hint, f"pid {p.pid}: {hint_text(hint, value)}")
    return " ".join(sentences), first
