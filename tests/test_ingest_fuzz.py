"""Hypothesis fuzzing of the ingest endpoint: hostile input never raises, never 5xx, stays bounded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gpu_exporter.ingest import OUTCOMES, IngestSettings, TrainingStore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

LIMITS = IngestSettings(max_body_bytes=4096, max_runs=3, max_phases_per_run=4, max_label_length=16)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
labels = st.text(max_size=20) | st.sampled_from(["a", "r-1", "GPU-1", "", "x" * 17, "é", "a\"b", "a\nb"])
phase_maps = st.dictionaries(labels, st.floats() | st.integers(min_value=-5, max_value=10**30), max_size=6)

snapshots = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 1, 1, 2, "1", True]), "run": labels, "rank": labels, "uuid": labels,
     "started_at": st.floats() | st.integers(), "phases": phase_maps, "current_phase": labels,
     "steps": st.integers(min_value=-2, max_value=10**20) | json_values,
     "samples": st.integers(min_value=-2), "batch_size": st.integers(min_value=-2)},
    optional={"finished": json_values, "allocator": st.none() | json_values
              | st.fixed_dictionaries({f: st.floats() | st.integers() for f in
                                       ("allocated_bytes", "reserved_bytes", "retries", "ooms")}),
              "pid": json_values, "extra": json_values},
)


def check_invariants(store: TrainingStore, status: int, reason: str, calls: int) -> None:
    assert 200 <= status < 300 or 400 <= status < 500, (status, reason)
    assert "\n" not in reason and len(reason) < 400
    families = {m.name: m for m in store.collect()}
    runs = families["gpu_exporter_training_runs"].samples[0].value
    assert runs <= LIMITS.max_runs
    per_run: dict[tuple[str, str, str], int] = {}
    for sample in families["gpu_training_phase_seconds"].samples:
        key = (sample.labels["run"], sample.labels["rank"], sample.labels["uuid"])
        per_run[key] = per_run.get(key, 0) + 1
        assert all(len(v) <= LIMITS.max_label_length for v in sample.labels.values())
    assert all(n <= LIMITS.max_phases_per_run for n in per_run.values())
    outcomes = {s.labels["outcome"]: s.value for s in families["gpu_exporter_ingest_requests"].samples}
    assert set(outcomes) == set(OUTCOMES)
    assert sum(outcomes.values()) == calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=5000), min_size=1, max_size=5), st.sampled_from([None, "application/json",
                                                                                    "text/plain"]))
def test_random_bytes(bodies: list[bytes], content_type: str | None) -> None:
    store = TrainingStore(LIMITS)
    for calls, body in enumerate(bodies, 1):
        status, reason = store.handle_push(body, content_type, None)
        check_invariants(store, status, reason, calls)


@pytest.mark.slow  # hundreds of fuzzed cases
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(json_values, min_size=1, max_size=5))
def test_random_json(docs: list[Any]) -> None:
    store = TrainingStore(LIMITS)
    for calls, doc in enumerate(docs, 1):
        status, reason = store.handle_push(json.dumps(doc).encode(), "application/json", None)
        assert status != 202 or isinstance(doc, dict)
        check_invariants(store, status, reason, calls)


@pytest.mark.slow  # hundreds of fuzzed cases
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(snapshots, min_size=1, max_size=8), st.sampled_from([None, "Bearer t0ken", "Bearer x", "", "Bearer"]))
def test_schema_shaped_snapshots(docs: list[dict[str, Any]], authorization: str | None) -> None:
    store = TrainingStore(LIMITS)
    for calls, doc in enumerate(docs, 1):
        status, reason = store.handle_push(json.dumps(doc).encode(), "application/json", authorization)
        check_invariants(store, status, reason, calls)


good_labels = st.from_regex(r"[A-Za-z0-9_.:/@+-]{1,16}", fullmatch=True)
good_numbers = st.floats(min_value=0, max_value=1e12) | st.integers(min_value=0, max_value=2**62)
valid_snapshots = st.builds(
    lambda run, rank, phases, current, started, steps: {
        "version": 1, "run": run, "rank": rank, "uuid": "GPU-f", "started_at": started, "phases": phases,
        "current_phase": current if current in phases else "", "steps": steps, "samples": steps,
        "batch_size": 1},
    st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["0", "1"]),
    st.dictionaries(good_labels, good_numbers, min_size=1, max_size=5), good_labels,
    st.sampled_from([1.0, 2.0]), st.integers(min_value=0, max_value=2**62))


@pytest.mark.slow  # hundreds of fuzzed cases
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(valid_snapshots, min_size=1, max_size=10))
def test_well_formed_snapshots_are_accepted_or_refused_for_state_reasons(docs: list[dict[str, Any]]) -> None:
    store = TrainingStore(LIMITS)
    for calls, doc in enumerate(docs, 1):
        status, reason = store.handle_push(json.dumps(doc).encode(), "application/json", None)
        check_invariants(store, status, reason, calls)
        state_reasons = ("decreasing_counter", "old_incarnation", "implausible_started_at", "too_many_runs",
                         "too_many_phases")
        assert status == 202 or reason.split(")")[0].removeprefix("rejected (") in state_reasons, reason
        if status == 202:
            steps = [s.value for m in store.collect() if m.name == "gpu_training_steps" for s in m.samples
                     if s.labels["run"] == doc["run"] and s.labels["rank"] == doc["rank"]]
            assert steps == [doc["steps"]]
