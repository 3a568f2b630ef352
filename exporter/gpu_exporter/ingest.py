"""Ingest of training snapshots pushed by instrumented jobs, and their gpu_training_* metrics.

The HTTP server hands every POST to /api/v1/training to ``TrainingStore.handle_push`` and
registers the store as a prometheus_client collector. Pushed bodies are untrusted: each is
size-checked, parsed, validated against the schema (docs/training.md; the body's checks live in
gpu_exporter.ingest_schema), limited in label charset, label length and cardinality, and
checked for counters that go down. A rejection is
a 4xx with a one-line reason, counted in ``gpu_exporter_ingest_requests_total{outcome}``.

A job restarted under the same run name sends a new ``started_at``: that is a new
incarnation, whose counters may start again from zero (Prometheus sees a counter reset).
Within one incarnation counters must not decrease; pushes from an older incarnation are
refused. Without a token anyone on the node can push, so two rules keep a bogus push from
taking over a live job (``implausible_started_at``): a ``started_at`` later than the
exporter's clock (plus MAX_CLOCK_SKEW_SECONDS) is refused, and a new incarnation replaces a
live (unfinished) one only if it started after the live one's last push, as a real restart
does.

At ``ingest.max_runs`` a new run evicts, in order, the oldest finished run, then the oldest
unconfirmed one (pushed once and never again): a flood of one-shot junk cannot lock out a
real job, which pushes again and again. Only when every slot holds a confirmed live run is
the new one refused (``too_many_runs``). Evictions are counted in
gpu_exporter_ingest_evictions_total; a key that comes back after eviction counts as
confirmed at once. Example::

    store = TrainingStore(IngestSettings())
    status, reason = store.handle_push(body, "application/json", None)
    registry.register(store)
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from . import catalog
from .config import IngestSettings as IngestSettings  # defined with the other settings; re-exported
from .exposition import render
from .ingest_schema import ALLOCATOR_FIELDS, MAX_CLOCK_SKEW_SECONDS, Entry, Key, Rejected, parse_snapshot
from .ingest_schema import parse_context as parse_context  # re-exported: the schema's one public check of a context
from .training.protocol import TAG_LABEL_PREFIX
from .verdict import remedies

if TYPE_CHECKING:
    from .collectors.base import Assembly

log = logging.getLogger(__name__)

OUTCOMES = (
    "accepted", "disabled", "unauthorized", "length_required", "too_large", "unsupported_media_type", "malformed_json",
    "invalid_schema", "invalid_label", "non_finite", "negative_value", "decreasing_counter",
    "old_incarnation", "implausible_started_at", "too_many_phases", "too_many_runs",
)
"""Every value of the ``outcome`` label of gpu_exporter_ingest_requests_total."""

_STATUS = {
    "disabled": 404, "unauthorized": 401, "length_required": 411, "too_large": 413, "unsupported_media_type": 415,
    "malformed_json": 400, "invalid_schema": 400, "invalid_label": 400, "non_finite": 400,
    "negative_value": 400, "decreasing_counter": 409, "old_incarnation": 409, "implausible_started_at": 409,
    "too_many_phases": 422, "too_many_runs": 429,
}

_ALLOCATOR_COUNTERS = ("retries", "ooms")
_ALLOCATOR_FAMILIES = (catalog.GPU_TRAINING_ALLOCATOR_ALLOCATED_BYTES, catalog.GPU_TRAINING_ALLOCATOR_RESERVED_BYTES,
                       catalog.GPU_TRAINING_ALLOCATOR_RETRIES_TOTAL, catalog.GPU_TRAINING_ALLOCATOR_OOMS_TOTAL)
_RUN_FAMILIES = ((catalog.GPU_TRAINING_STEPS_TOTAL, "steps"), (catalog.GPU_TRAINING_SAMPLES_TOTAL, "samples"),
                 (catalog.GPU_TRAINING_BATCH_SIZE, "batch_size"), (catalog.GPU_TRAINING_WORLD_SIZE, "world_size"),
                 (catalog.GPU_TRAINING_LAST_PUSH_TIMESTAMP_SECONDS, "received_at"))
"""The one-sample-per-run families and the Entry field each shows."""
_LAUNCH_AND_CODE_FAMILIES = (
    catalog.GPU_TRAINING_RUN_INFO, catalog.GPU_TRAINING_RUN_START_TIMESTAMP_SECONDS,
    catalog.GPU_TRAINING_CALLBACK_SECONDS_TOTAL, catalog.GPU_TRAINING_CODE_SECONDS_TOTAL,
    catalog.GPU_TRAINING_HOST_FUNCTION_SECONDS_TOTAL)


class TrainingStore:
    """Validated training snapshots, exposed as gpu_training_* metrics (a prometheus_client collector).

    Thread-safe: the HTTP server's threads push while the scrape thread collects.

    >>> store = TrainingStore(IngestSettings())
    >>> store.handle_push(b"{}", "application/json", None)[0]
    400
    """

    name = "training"

    @classmethod
    def build(cls, assembly: Assembly) -> TrainingStore:
        """The exporter's (gpu_exporter.collectors); simulated GPUs that follow training read its phases."""
        wanted = {f.name for f in fields(IngestSettings)}
        store = cls(IngestSettings(**{k: v for k, v in assembly.config.section("ingest").items() if k in wanted}))
        if assembly.simulated is not None:
            assembly.simulated.set_training_source(store.latest_phases)
        return store

    def __init__(self, settings: IngestSettings, clock: Callable[[], float] = time.time) -> None:
        for name in ("max_body_bytes", "max_runs", "max_phases_per_run", "max_label_length"):
            if getattr(settings, name) < 1:
                raise ValueError(f"ingest.{name} must be at least 1, not {getattr(settings, name)}")
        if not settings.stale_after_seconds > 0:
            raise ValueError(f"ingest.stale_after_seconds must be > 0, not {settings.stale_after_seconds}")
        self._settings = settings
        self._clock = clock
        self._token = _read_token(settings.token_file) if settings.token_file else None
        self._lock = threading.Lock()
        self._entries: dict[Key, Entry] = {}
        self._evicted: dict[Key, None] = {}  # recently evicted keys, oldest first (bounded)
        self._evictions = 0
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._rendered: tuple[tuple[int, ...], bytes] | None = None  # (fingerprint, text): see exposition
        self._warned: set[Key] = set()  # run keys whose refused tags or run id were logged once

    @property
    def max_body_bytes(self) -> int:
        """Largest body accepted; the server answers 413 for a larger Content-Length without reading it."""
        return self._settings.max_body_bytes

    def count_rejection(self, reason: str) -> None:
        """Count a push the server refused itself (for example ``"too_large"`` from Content-Length).

        >>> TrainingStore(IngestSettings()).count_rejection("too_large")
        """
        if reason not in self._outcomes or reason == "accepted":
            raise ValueError(f"unknown ingest rejection {reason!r}; use one of {OUTCOMES[1:]}")
        with self._lock:
            self._outcomes[reason] += 1

    def handle_push(self, body: bytes, content_type: str | None,
                    authorization: str | None) -> tuple[int, str]:
        """Validate and store one pushed snapshot; return (HTTP status, one-line reason). Never raises.

        >>> TrainingStore(IngestSettings()).handle_push(b"x", "text/plain", None)
        (415, 'rejected (unsupported_media_type): send Content-Type: application/json')
        """
        try:
            key, entry, refused = self._validate(body, content_type, authorization)
            with self._lock:
                self._store(key, entry)
                self._outcomes["accepted"] += 1
            if refused:
                self._warn_refused(key, refused)
                return 202, f"accepted without {refused}"
            return 202, "accepted"
        except Rejected as rejected:
            self.count_rejection(rejected.outcome)
            return _STATUS[rejected.outcome], f"rejected ({rejected.outcome}): {rejected}"
        except Exception as err:  # a validation bug must still not become a 5xx
            self.count_rejection("invalid_schema")
            return 400, f"rejected (invalid_schema): {type(err).__name__}"

    def _warn_refused(self, key: Key, refused: str) -> None:
        """One log line per run key whose identity fields were refused (the snapshot itself was kept)."""
        with self._lock:
            if key in self._warned:
                return
            if len(self._warned) >= 4 * self._settings.max_runs:
                self._warned.clear()
            self._warned.add(key)
        log.warning("training run %s rank %s: stored without %s", key[0], key[1], refused)

    def has_reported_run(self, uuid: str) -> bool:
        """True while a live run pushes its own phases from GPU ``uuid`` (the stack sampler leaves it alone).

        >>> TrainingStore(IngestSettings()).has_reported_run("GPU-1")
        False
        """
        with self._lock:
            self._expire()
            return any(u == uuid and not e.finished and not e.source for (_, _, u), e in self._entries.items())

    def put_sampled(self, uuid: str, pid: int, phases: dict[str, float], current: str, started_at: float) -> None:
        """Store the phase seconds collectors/stacks.py estimated for GPU process ``pid`` as run ``pid-<pid>``.

        Its series carry ``source="sampled"``. Sampled runs count against ``ingest.max_runs`` like
        pushed ones (a full store refuses them silently: pushed runs come first).
        """
        entry = Entry(started_at=started_at, phases=phases, current_phase=current, steps=0, samples=0,
                      batch_size=0, finished=False, allocator=None, received_at=self._clock(), confirmed=True,
                      source="sampled")
        with self._lock:
            try:
                self._store((f"pid-{pid}", "0", uuid), entry)
            except Rejected as err:
                log.debug("sampled phases of pid %d not stored: %s", pid, err)
            self._rendered = None

    def latest_phases(self, uuid: str) -> dict[str, float] | None:
        """Cumulative phase seconds of the most recently pushed live run on GPU ``uuid``, or None.

        The simulator drives ``follow_training`` GPUs from the compute share between two of these.

        >>> TrainingStore(IngestSettings()).latest_phases("GPU-1") is None
        True
        """
        with self._lock:
            self._expire()
            live = [e for (_, _, u), e in self._entries.items() if u == uuid and not e.finished]
        return dict(max(live, key=lambda e: e.received_at).phases) if live else None

    def describe(self) -> list[Metric]:
        """No fixed description: the families depend on what was pushed."""
        return []

    @property
    def exposition(self) -> bytes:
        """Text of :meth:`collect`, rendered once per change, not per scrape (exposition.Source).

        Every change moves the fingerprint: a stored push counts ``accepted``, a refusal its
        outcome, an eviction ``evictions``, an expiry shrinks the runs.
        """
        with self._lock:
            self._expire()
            key = (*self._outcomes.values(), self._evictions, len(self._entries))
            cached = self._rendered
            if cached is not None and cached[0] == key:
                return cached[1]
        text = render(self.collect())
        with self._lock:
            self._rendered = (key, text)
        return text

    def collect(self) -> Iterator[Metric]:
        """Yield the gpu_training_* families and the ingest health metrics."""
        with self._lock:
            self._expire()
            entries = sorted(self._entries.items())
            outcomes = dict(self._outcomes)
            evictions = self._evictions
        labels = list(catalog.RUN)
        source = ["source"] if any(e.source for _, e in entries) else []  # sampled phases say so (collectors/stacks.py)
        phase_seconds = catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.new(labels=[*labels, "phase", *source])
        current = catalog.GPU_TRAINING_CURRENT_PHASE.new(labels=[*labels, "phase", *source])
        per_run = [(family.new(), field) for family, field in _RUN_FAMILIES]
        allocator = [(family.new(), key) for family, key in zip(_ALLOCATOR_FAMILIES, ALLOCATOR_FIELDS, strict=True)]
        # Only the info and start series carry ``run_id``, and only the info series the tags: the other series keep
        # their labels, so a tag costs no series (one info series per rank), and a launch is found by its id.
        info, started, callbacks, code, functions = (family.new() for family in _LAUNCH_AND_CODE_FAMILIES)
        for (run, rank, uuid), entry in entries:
            values = [run, rank, uuid]
            for phase, seconds in entry.phases.items():
                marked = [*values, phase, entry.source][:len(labels) + 1 + len(source)]
                phase_seconds.add_metric(marked, seconds)
                current.add_metric(marked, 1.0 if phase == entry.current_phase else 0.0)
            for family, field in per_run:
                family.add_metric(values, getattr(entry, field))
            if entry.allocator is not None:
                for family, field in allocator:
                    family.add_metric(values, entry.allocator[field])
            if not entry.source:  # sampled phases (collectors/stacks.py) are no launch of an instrumented job
                launch = {"run": run, "rank": rank, "uuid": uuid, "run_id": entry.run_id}
                started.add_metric(list(launch.values()), entry.started_at)
                launch.update((TAG_LABEL_PREFIX + key, value) for key, value in entry.tags)
                info.samples.append(Sample(info.name, launch, 1.0, None, None))
            if entry.callback is not None:
                callbacks.add_metric([*values, entry.callback[0], entry.callback[1]], entry.callback[2])
            for part, seconds in entry.code:
                code.add_metric([*values, part], seconds)
            if entry.host_function is not None:
                functions.add_metric([*values, entry.host_function[0]], entry.host_function[1])
        yield from (phase_seconds, current, *(family for family, _ in per_run), *(family for family, _ in allocator))
        yield from (info, started)
        yield from context_families((key, entry.context or {}) for key, entry in entries)
        yield from (callbacks, code, functions)
        requests = catalog.GPU_EXPORTER_INGEST_REQUESTS_TOTAL.new()
        for outcome, count in outcomes.items():
            requests.add_metric([outcome], count)
        yield requests
        yield catalog.GPU_EXPORTER_TRAINING_RUNS.new(len(entries))
        yield catalog.GPU_EXPORTER_INGEST_EVICTIONS_TOTAL.new(evictions)

    # -- validation (the request here, its body in ingest_schema) ------------------------------

    def _validate(self, body: bytes, content_type: str | None,
                  authorization: str | None) -> tuple[Key, Entry, str]:
        s = self._settings
        if len(body) > s.max_body_bytes:
            raise Rejected("too_large", f"body of {len(body)} bytes exceeds ingest.max_body_bytes="
                                        f"{s.max_body_bytes}")
        if not s.enabled:
            raise Rejected("disabled", "training ingest is off (ingest.enabled: false)")
        if self._token is not None:
            scheme, _, offered = (authorization or "").strip().partition(" ")
            token = offered.strip().encode("utf-8", "replace")
            if scheme.lower() != "bearer" or not token or not hmac.compare_digest(token, self._token):
                raise Rejected("unauthorized", "send Authorization: Bearer <token from ingest.token_file>")
        if content_type is None or content_type.split(";", 1)[0].strip().lower() != "application/json":
            raise Rejected("unsupported_media_type", "send Content-Type: application/json")
        return parse_snapshot(body, s, self._clock)

    # -- storage (called with the lock held) ------------------------------------------------

    def _store(self, key: Key, entry: Entry) -> None:
        self._expire()
        old = self._entries.get(key)
        if old is None:
            if len(self._entries) >= self._settings.max_runs:
                self._evict_one()
            came_back = key in self._evicted
            self._evicted.pop(key, None)
            entry = replace(entry, confirmed=came_back)
        elif entry.started_at < old.started_at:
            raise Rejected("old_incarnation", f"run {key[0]} rank {key[1]} restarted at {old.started_at}; "
                                              "this push is from an older process")
        elif entry.started_at == old.started_at:
            _check_monotonic(old, entry)
            entry = replace(entry, confirmed=True)
        else:
            if not old.finished and entry.started_at < old.received_at - MAX_CLOCK_SKEW_SECONDS:
                ago = entry.received_at - old.received_at
                raise Rejected("implausible_started_at",
                               f"run {key[0]} rank {key[1]} is live (last push {ago:.0f} s ago); a restarted "
                               f"process must have started after that push, this one claims "
                               f"{old.received_at - entry.started_at:.0f} s before it")
            entry = replace(entry, confirmed=old.confirmed)
        self._entries[key] = entry

    def _evict_one(self) -> None:
        """Make room for a new run: drop the oldest finished run, else the oldest unconfirmed one."""
        for wanted in (lambda e: e.finished, lambda e: not e.confirmed):
            candidates = [(e.received_at, k) for k, e in self._entries.items() if wanted(e)]
            if candidates:
                victim = min(candidates)[1]
                del self._entries[victim]
                self._evicted[victim] = None
                while len(self._evicted) > 4 * self._settings.max_runs:
                    del self._evicted[next(iter(self._evicted))]
                self._evictions += 1
                return
        raise Rejected("too_many_runs", f"already {len(self._entries)} confirmed live runs (ingest.max_runs); "
                                        "retry after stale runs expire")

    def _expire(self) -> None:
        cutoff = self._clock() - self._settings.stale_after_seconds
        for key in [k for k, e in self._entries.items() if e.received_at < cutoff]:
            del self._entries[key]


def _check_monotonic(old: Entry, new: Entry) -> None:
    pairs = [(f"phases.{p}", v, new.phases.get(p, -1.0)) for p, v in old.phases.items()]
    pairs += [("steps", old.steps, new.steps), ("samples", old.samples, new.samples)]
    if old.allocator is not None and new.allocator is not None:
        pairs += [(f"allocator.{f}", old.allocator[f], new.allocator[f]) for f in _ALLOCATOR_COUNTERS]
    for field, before, after in pairs:
        if after < before:
            shown = "missing" if after < 0 else after
            raise Rejected("decreasing_counter", f"{field} went from {before} to {shown} within one run "
                                                 "incarnation (same started_at)")


def context_families(entries: Iterable[tuple[tuple[str, str, str], Mapping[str, float]]]) -> list[Metric]:
    """The gpu_training_* context gauges of every run that reported the field."""
    families = {key: family.new() for key, family in remedies.GAUGES.items()}
    for labels, context in entries:
        for key, value in context.items():
            if key in families:
                families[key].add_metric(list(labels), value)
    return list(families.values())


def _read_token(path: str) -> bytes:
    try:
        token = Path(path).read_bytes().strip()
    except OSError as err:
        raise ValueError(f"ingest.token_file {path}: cannot read it ({err.strerror})") from None
    if not token:
        raise ValueError(f"ingest.token_file {path} is empty; put the bearer token in it")
    return token
