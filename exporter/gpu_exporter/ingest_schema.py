"""The schema of a pushed training snapshot: its JSON body, parsed and validated into one stored entry.

A push to /api/v1/training is untrusted JSON (docs/training.md has the schema). The store
(gpu_exporter.ingest) checks what the request says about itself (size, token, content type);
this module checks what the body says: labels limited in charset and length, numbers finite
and not negative, phases bounded in number, ``started_at`` not ahead of the exporter's clock.
A broken required field raises :class:`Rejected`, whose outcome the store counts in
``gpu_exporter_ingest_requests_total{outcome}``; a broken optional field (``run_id``, ``tags``,
``callbacks``, ``code``) costs only itself and is named in the answer. Example::

    key, entry, refused = parse_snapshot(body, IngestSettings(), time.time)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .config import IngestSettings
from .training.protocol import (
    CONTEXT_FIELDS,
    MAX_WORLD_SIZE,
    SCHEMA_VERSION,
    check_callbacks,
    check_code,
    check_label,
    check_tags,
)

MAX_CLOCK_SKEW_SECONDS = 30.0
"""How far a pushed ``started_at`` may lie ahead of the exporter's clock, and a new
incarnation's start before the live one's last push (push latency; jobs share the node's clock)."""

ALLOCATOR_FIELDS = ("allocated_bytes", "reserved_bytes", "retries", "ooms")
"""The fields of a snapshot's ``allocator`` object, each a number."""


class Rejected(Exception):
    """A pushed snapshot was refused: ``outcome`` is the metric label, the message says why."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class Entry:
    """The newest accepted snapshot of one (run, rank, uuid)."""

    started_at: float
    phases: dict[str, float]
    current_phase: str
    steps: int
    samples: int
    batch_size: int
    finished: bool
    allocator: dict[str, float] | None
    received_at: float
    confirmed: bool = False
    """True once the key pushed more than once (or came back after an eviction)."""
    world_size: int = 1
    """Ranks in the run's distributed job (snapshot field ``world_size``, default 1)."""
    context: dict[str, float] | None = None
    """The snapshot's validated ``context`` (loader settings, cores, GPU memory; gpu_exporter.verdict.remedies)."""
    source: str = ""
    """"" for a pushed snapshot; "sampled" for phases the stack sampler estimated (gpu_exporter.collectors.stacks)."""
    run_id: str = ""
    """The launch's id (snapshot field ``run_id``; "" from a library that sends none)."""
    tags: tuple[tuple[str, str], ...] = ()
    """The run's validated tags (snapshot field ``tags``), sorted by key."""
    callback: tuple[str, str, float] | None = None
    """The run's biggest callback hook, (name, phase, seconds), of the snapshot's ``callbacks``."""
    code: tuple[tuple[str, float], ...] = ()
    """The stack sampler's seconds of the framework's and the job's own code (snapshot field ``code``)."""
    host_function: tuple[str, float] | None = None
    """The biggest function of the job's own code inside compute, (name, seconds), of the snapshot's ``code``."""


Key = tuple[str, str, str]
"""What an entry is stored under: (run, rank, uuid)."""


def parse_snapshot(body: bytes, settings: IngestSettings, clock: Callable[[], float]) -> tuple[Key, Entry, str]:
    """Parse and validate a pushed body: (key, entry, what was refused); :class:`Rejected` says why not.

    ``clock`` gives the entry's ``received_at`` (the exporter's time of the push).
    """
    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise Rejected("malformed_json", f"body is not UTF-8 JSON ({str(err)[:80]})") from None
    if not isinstance(doc, dict):
        raise Rejected("invalid_schema", "body must be a JSON object")
    if doc.get("version") != SCHEMA_VERSION or isinstance(doc.get("version"), bool):
        raise Rejected("invalid_schema", f"version must be {SCHEMA_VERSION}")
    run = _label(doc, "run", settings.max_label_length)
    rank = _label(doc, "rank", settings.max_label_length)
    uuid = _label(doc, "uuid", settings.max_label_length, allow_empty=True)
    started_at = _number(doc, "started_at")
    if started_at <= 0:
        raise Rejected("invalid_schema", "started_at must be a Unix time > 0")
    received_at = clock()
    if started_at > received_at + MAX_CLOCK_SKEW_SECONDS:
        raise Rejected("implausible_started_at", f"started_at lies {started_at - received_at:.0f} s ahead of "
                                                 "the exporter's clock")
    phases_doc = doc.get("phases")
    if not isinstance(phases_doc, dict) or not phases_doc:
        raise Rejected("invalid_schema", "phases must be a non-empty object of phase name -> seconds")
    if len(phases_doc) > settings.max_phases_per_run:
        raise Rejected("too_many_phases", f"{len(phases_doc)} phases exceed ingest.max_phases_per_run="
                                          f"{settings.max_phases_per_run}")
    phases: dict[str, float] = {}
    for name in phases_doc:
        problem = check_label("phase name", name, settings.max_label_length)
        if problem is not None:
            raise Rejected("invalid_label", problem)
        phases[name] = _number(phases_doc, name, f"phases.{name}")
    current = doc.get("current_phase")
    if not isinstance(current, str) or (current and current not in phases):
        raise Rejected("invalid_schema", "current_phase must be one of the phases, or \"\"")
    finished = doc.get("finished", False)
    if not isinstance(finished, bool):
        raise Rejected("invalid_schema", "finished must be true or false")
    allocator: dict[str, float] | None = None
    allocator_doc = doc.get("allocator")
    if allocator_doc is not None:
        if not isinstance(allocator_doc, dict):
            raise Rejected("invalid_schema", "allocator must be an object")
        allocator = {f: _number(allocator_doc, f, f"allocator.{f}") for f in ALLOCATOR_FIELDS}
    entry = Entry(started_at=started_at, phases=phases, current_phase="" if finished else current,
                  steps=_integer(doc, "steps"), samples=_integer(doc, "samples"),
                  batch_size=_integer(doc, "batch_size"), finished=finished, allocator=allocator,
                  received_at=received_at, world_size=_world_size(doc),
                  context=_context(doc))
    run_id, tags, refused = _identity(doc, settings.max_label_length)
    callback, problem = _callback(doc, settings.max_label_length)
    code, function, code_problem = _code(doc, settings.max_label_length)
    refused = "; ".join(r for r in (refused, problem, code_problem) if r)
    return (run, rank, uuid), replace(entry, run_id=run_id, tags=tags, callback=callback, code=code,
                                      host_function=function), refused


def _label(doc: dict[str, Any], field: str, max_length: int, allow_empty: bool = False) -> str:
    value = doc.get(field)
    if not isinstance(value, str):
        raise Rejected("invalid_schema", f"{field} must be a string")
    if allow_empty and value == "":
        return value
    problem = check_label(field, value, max_length)
    if problem is not None:
        raise Rejected("invalid_label", problem)
    return value


def _number(doc: dict[str, Any], field: str, shown: str | None = None) -> float:
    value = doc.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Rejected("invalid_schema", f"{shown or field} must be a number")
    result = float(value) if isinstance(value, float) or abs(value) < 2**63 else math.inf
    if not math.isfinite(result):
        raise Rejected("non_finite", f"{shown or field} must be finite")
    if result < 0:
        raise Rejected("negative_value", f"{shown or field} must not be negative")
    return result


def _integer(doc: dict[str, Any], field: str) -> int:
    value = doc.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Rejected("invalid_schema", f"{field} must be an integer")
    if value < 0:
        raise Rejected("negative_value", f"{field} must not be negative")
    if value >= 2**63:
        raise Rejected("invalid_schema", f"{field} is implausibly large")
    return value


def parse_context(doc: Any) -> dict[str, float]:
    """The validated ``context`` object of a snapshot (training/context.py; None/absent -> {}); ValueError says
    what is wrong.

    >>> parse_context({"num_workers": 4, "pin_memory": True, "cpu_cores": 7.5, "later_field": "ignored"})
    {'num_workers': 4.0, 'pin_memory': 1.0, 'cpu_cores': 7.5}
    """
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ValueError("context must be an object")
    out: dict[str, float] = {}
    for key, kind in CONTEXT_FIELDS.items():
        value = doc.get(key)
        if value is None:
            continue
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"context.{key} must be true or false")
            out[key] = float(value)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"context.{key} must be a finite number >= 0")
        if kind == "count" and (not isinstance(value, int) or value >= 2**31):
            raise ValueError(f"context.{key} must be a whole number")
        out[key] = float(value)
    return out


def _context(doc: dict[str, Any]) -> dict[str, float] | None:
    """The optional ``context`` object, validated by :func:`parse_context`."""
    try:
        return parse_context(doc.get("context")) or None
    except ValueError as err:
        raise Rejected("invalid_schema", str(err)) from None


def _identity(doc: dict[str, Any], max_length: int) -> tuple[str, tuple[tuple[str, str], ...], str]:
    """(run id, tags, what was refused) of the optional ``run_id`` and ``tags`` fields.

    A bad run id or tag object costs only itself: the snapshot is stored without it, and the push's
    answer (202) and one log line per run say why, so a job's phases are never lost to a label.

    >>> _identity({"run_id": "rdzv-1", "tags": {"team": "vision"}}, 128)
    ('rdzv-1', (('team', 'vision'),), '')
    >>> print(_identity({"run_id": "a b", "tags": {"Team": "x"}}, 128)[2])  # doctest: +ELLIPSIS
    run_id (run_id 'a b' may only contain A-Za-z0-9_.:/@+-); tags (tag key 'Team' may only contain a-z, ...)
    """
    run_id, tags = doc.get("run_id", ""), doc.get("tags", {})
    problems = {"run_id": "run_id must be a string" if not isinstance(run_id, str) else
                None if run_id == "" else check_label("run_id", run_id, max_length),
                "tags": check_tags(tags)}
    refused = "; ".join(f"{name} ({problem})" for name, problem in problems.items() if problem is not None)
    return (run_id if problems["run_id"] is None else "",
            tuple(sorted(tags.items())) if problems["tags"] is None else (), refused)


def _callback(doc: dict[str, Any], max_length: int) -> tuple[tuple[str, str, float] | None, str]:
    """(the biggest callback hook, what was refused) of the optional ``callbacks`` field; like tags, a bad field
    costs only itself (the snapshot is stored without it).

    >>> _callback({"callbacks": [{"name": "Save.on_step_end", "seconds": 3, "phase": "checkpoint"}]}, 128)
    (('Save.on_step_end', 'checkpoint', 3.0), '')
    >>> _callback({"callbacks": "x"}, 128)
    (None, 'callbacks (callbacks must be a list of at most 3 objects)')
    """
    items = doc.get("callbacks")
    problem = None if items is None else check_callbacks(items, max_length)
    if problem is not None:
        return None, f"callbacks ({problem})"
    top = max(items or [], key=lambda item: item["seconds"], default=None)
    return (None if top is None else (top["name"], top["phase"], float(top["seconds"]))), ""


EXPORTED_CODE = ("framework", "host")
"""The parts of a snapshot's ``code`` the exporter exports (causes FO, HW); ``torch`` is M3's, read from compute."""


def _code(doc: dict[str, Any], max_length: int) -> tuple[tuple[tuple[str, float], ...], tuple[str, float] | None, str]:
    """(seconds of :data:`EXPORTED_CODE`, the biggest function of the job's own code, what was refused) of the
    optional ``code`` field (training/sampler.py); a bad field costs only itself. A part never seen (0 s: the
    framework's in a plain loop) is left out, so it costs no series until it appears.

    >>> _code({"code": {"torch": 1, "framework": 0.5, "host": 2, "functions": [{"name": "a.py:3:f", "seconds": 2}]}},
    ...       128)
    ((('framework', 0.5), ('host', 2.0)), ('a.py:3:f', 2.0), '')
    >>> _code({"code": {"torch": 1, "framework": 0, "host": 2, "functions": []}}, 128)
    ((('host', 2.0),), None, '')
    >>> _code({"code": []}, 128)
    ((), None, 'code (code must be an object)')
    """
    body = doc.get("code")
    problem = None if body is None else check_code(body, max_length)
    if body is None or problem is not None:
        return (), None, "" if problem is None else f"code ({problem})"
    top = max(body["functions"], key=lambda item: item["seconds"], default=None)
    function = None if top is None else (top["name"], float(top["seconds"]))
    return tuple((part, float(body[part])) for part in EXPORTED_CODE if body[part] > 0), function, ""


def _world_size(doc: dict[str, Any]) -> int:
    """The optional ``world_size`` field: ranks in the distributed job, 1 when absent."""
    if "world_size" not in doc:
        return 1
    size = _integer(doc, "world_size")
    if not 1 <= size <= MAX_WORLD_SIZE:
        raise Rejected("invalid_schema", f"world_size must be from 1 to {MAX_WORLD_SIZE}")
    return size
