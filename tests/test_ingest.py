"""The exporter's training ingest: every rejection reason, incarnations, expiry, caps and the metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from gpu_exporter.ingest import OUTCOMES, IngestSettings, TrainingStore
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

JSON = "application/json"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def snapshot(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": 1, "run": "resnet50", "rank": "0", "uuid": "GPU-1111", "started_at": 1_700_000_000.0,
        "pid": 42, "phases": {"other": 1.0, "data": 6.0, "compute": 3.0, "metrics": 0.0, "checkpoint": 0.0},
        "current_phase": "data", "steps": 10, "samples": 320, "batch_size": 32, "finished": False,
    }
    doc.update(changes)
    return doc


def push(store: TrainingStore, doc: Any, content_type: str | None = JSON,
         authorization: str | None = None) -> tuple[int, str]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return store.handle_push(body, content_type, authorization)


def scrape(store: TrainingStore) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(store)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def outcome_count(store: TrainingStore, outcome: str) -> float:
    return scrape(store)[("gpu_exporter_ingest_requests_total", (("outcome", outcome),))]


def test_accepted_snapshot_becomes_metrics() -> None:
    store = TrainingStore(IngestSettings())
    alloc = {"allocated_bytes": 1e9, "reserved_bytes": 3e9, "retries": 2, "ooms": 0}
    assert push(store, snapshot(allocator=alloc)) == (202, "accepted")
    m = scrape(store)
    key = (("rank", "0"), ("run", "resnet50"), ("uuid", "GPU-1111"))
    assert m[("gpu_training_phase_seconds_total", (("phase", "data"), *key))] == 6.0
    assert m[("gpu_training_current_phase", (("phase", "data"), *key))] == 1.0
    assert m[("gpu_training_current_phase", (("phase", "compute"), *key))] == 0.0
    assert m[("gpu_training_steps_total", key)] == 10
    assert m[("gpu_training_samples_total", key)] == 320
    assert m[("gpu_training_batch_size", key)] == 32
    assert m[("gpu_training_allocator_reserved_bytes", key)] == 3e9
    assert m[("gpu_training_allocator_retries_total", key)] == 2
    assert m[("gpu_exporter_training_runs", ())] == 1
    assert m[("gpu_exporter_ingest_requests_total", (("outcome", "accepted"),))] == 1
    assert all(("gpu_exporter_ingest_requests_total", (("outcome", o),)) in m for o in OUTCOMES)


def test_allocator_series_only_when_reported() -> None:
    store = TrainingStore(IngestSettings())
    push(store, snapshot())
    assert not [k for k in scrape(store) if k[0].startswith("gpu_training_allocator")]


BAD: list[tuple[str, Any, int, str]] = [
    ("not json", b"{nope", 400, "malformed_json"),
    ("not utf-8", b"\xff\xfe{}", 400, "malformed_json"),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, 413, "too_large"),
    ("nested within limit", b"[" * 30_000 + b"]" * 30_000, 400, "malformed_json"),
    ("array", [1, 2], 400, "invalid_schema"),
    ("wrong version", snapshot(version=2), 400, "invalid_schema"),
    ("bool version", snapshot(version=True), 400, "invalid_schema"),
    ("run missing", {k: v for k, v in snapshot().items() if k != "run"}, 400, "invalid_schema"),
    ("run not string", snapshot(run=5), 400, "invalid_schema"),
    ("run with space", snapshot(run="my run"), 400, "invalid_label"),
    ("run with newline", snapshot(run="a\nb"), 400, "invalid_label"),
    ("run too long", snapshot(run="r" * 129), 400, "invalid_label"),
    ("quote in uuid", snapshot(uuid='GPU-"}'), 400, "invalid_label"),
    ("empty rank", snapshot(rank=""), 400, "invalid_label"),
    ("phase name", snapshot(phases={"da ta": 1.0}, current_phase=""), 400, "invalid_label"),
    ("no phases", snapshot(phases={}), 400, "invalid_schema"),
    ("phase value string", snapshot(phases={"data": "1"}, current_phase="data"), 400, "invalid_schema"),
    ("NaN phase", b'{"version":1,"run":"r","rank":"0","uuid":"","started_at":1,"phases":{"data":NaN},'
                  b'"current_phase":"data","steps":0,"samples":0,"batch_size":0}', 400, "non_finite"),
    ("infinite started_at", snapshot(started_at=float("inf")), 400, "non_finite"),
    ("huge int", snapshot(phases={"data": 10**400}, current_phase="data"), 400, "non_finite"),
    ("negative phase", snapshot(phases={"data": -1.0}, current_phase="data"), 400, "negative_value"),
    ("negative steps", snapshot(steps=-1), 400, "negative_value"),
    ("float steps", snapshot(steps=1.5), 400, "invalid_schema"),
    ("zero started_at", snapshot(started_at=0), 400, "invalid_schema"),
    ("unknown current phase", snapshot(current_phase="nap"), 400, "invalid_schema"),
    ("finished not bool", snapshot(finished="yes"), 400, "invalid_schema"),
    ("allocator not object", snapshot(allocator=[1]), 400, "invalid_schema"),
    ("allocator field missing", snapshot(allocator={"allocated_bytes": 1}), 400, "invalid_schema"),
    ("too many phases", snapshot(phases={f"p{i}": 0.0 for i in range(17)}, current_phase=""), 422,
     "too_many_phases"),
]


@pytest.mark.parametrize(("body", "status", "outcome"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_rejection_is_a_4xx_with_its_reason_and_counted(body: Any, status: int, outcome: str) -> None:
    store = TrainingStore(IngestSettings(max_body_bytes=150_000))
    got_status, reason = push(store, body)
    assert (got_status, reason.split(":")[0]) == (status, f"rejected ({outcome})")
    assert "\n" not in reason
    assert outcome_count(store, outcome) == 1
    assert scrape(store)[("gpu_exporter_training_runs", ())] == 0


def test_size_and_media_type() -> None:
    store = TrainingStore(IngestSettings(max_body_bytes=100))
    assert push(store, b"{" + b" " * 200 + b"}")[0] == 413
    assert store.max_body_bytes == 100
    small = TrainingStore(IngestSettings())
    assert push(small, snapshot(), content_type="text/plain")[0] == 415
    assert push(small, snapshot(), content_type=None)[0] == 415
    assert push(small, snapshot(), content_type="Application/JSON; charset=utf-8")[0] == 202


def test_decreasing_counters_are_rejected_within_one_incarnation() -> None:
    store = TrainingStore(IngestSettings())
    assert push(store, snapshot())[0] == 202
    assert push(store, snapshot(steps=9))[:1] == (409,)
    lower = snapshot()
    lower["phases"] = {**lower["phases"], "data": 5.0}
    status, reason = push(store, lower)
    assert status == 409 and "phases.data went from 6.0 to 5.0" in reason
    dropped = snapshot()
    del dropped["phases"]["checkpoint"]
    assert push(store, dropped)[0] == 409
    alloc = {"allocated_bytes": 1, "reserved_bytes": 1, "retries": 5, "ooms": 1}
    assert push(store, snapshot(steps=11, allocator=alloc))[0] == 202
    assert push(store, snapshot(steps=12, allocator={**alloc, "ooms": 0}))[0] == 409
    assert push(store, snapshot(steps=12, allocator={**alloc, "allocated_bytes": 0}))[0] == 202  # a gauge
    assert outcome_count(store, "decreasing_counter") == 4


def test_a_restarted_job_is_a_new_incarnation_and_old_pushes_are_refused() -> None:
    clock = Clock()
    store = TrainingStore(IngestSettings(), clock=clock)
    assert push(store, snapshot(steps=100))[0] == 202
    clock.now += 500
    restarted = snapshot(started_at=1_700_000_490.0, steps=1, phases={"other": 0.1}, current_phase="other")
    assert push(store, restarted)[0] == 202
    assert scrape(store)[("gpu_training_steps_total", (("rank", "0"), ("run", "resnet50"), ("uuid", "GPU-1111")))] == 1
    status, reason = push(store, snapshot(steps=101))
    assert status == 409 and reason.startswith("rejected (old_incarnation)")


def test_stale_runs_expire_and_free_their_slot() -> None:
    clock = Clock()
    store = TrainingStore(IngestSettings(max_runs=2, stale_after_seconds=60), clock=clock)
    for run in ("a", "b", "a", "b"):  # each pushes twice: confirmed live runs are never evicted
        assert push(store, snapshot(run=run))[0] == 202
    status, reason = push(store, snapshot(run="c"))
    assert status == 429 and "ingest.max_runs" in reason
    assert push(store, snapshot(run="a", steps=11))[0] == 202  # known runs still update
    clock.now += 61
    assert scrape(store)[("gpu_exporter_training_runs", ())] == 0
    assert push(store, snapshot(run="c"))[0] == 202
    assert outcome_count(store, "too_many_runs") == 1


def current_phases(store: TrainingStore) -> dict[str, str]:
    """Each run's phase where its gpu_training_current_phase is 1 (what /metrics says)."""
    return {dict(labels)["run"]: dict(labels)["phase"] for (name, labels), value in scrape(store).items()
            if name == "gpu_training_current_phase" and value == 1.0}


def test_current_phase_is_each_live_runs_own_until_it_finishes_or_expires() -> None:
    clock = Clock()
    store = TrainingStore(IngestSettings(stale_after_seconds=30), clock=clock)
    assert current_phases(store) == {}
    push(store, snapshot(run="old", current_phase="data"))
    clock.now += 1
    push(store, snapshot(run="new", current_phase="compute", uuid="GPU-2222"))
    assert current_phases(store) == {"old": "data", "new": "compute"}
    push(store, snapshot(run="new", current_phase="", finished=True, uuid="GPU-2222"))
    assert current_phases(store) == {"old": "data"}  # finished: every phase of the run at 0
    assert ("gpu_training_current_phase", (("phase", "compute"), ("rank", "0"), ("run", "new"),
                                           ("uuid", "GPU-2222"))) in scrape(store)
    clock.now += 31
    assert current_phases(store) == {}


def test_bearer_token_from_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    store = TrainingStore(IngestSettings(token_file=str(token_file)))
    assert push(store, snapshot())[0] == 401
    assert push(store, snapshot(), authorization="Bearer wrong")[0] == 401
    assert push(store, snapshot(), authorization="Basic s3cret")[0] == 401
    assert push(store, snapshot(), authorization="Bearer s3cret")[0] == 202
    assert outcome_count(store, "unauthorized") == 3


def test_bad_settings_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read it"):
        TrainingStore(IngestSettings(token_file=str(tmp_path / "missing")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        TrainingStore(IngestSettings(token_file=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match=r"ingest\.max_runs"):
        TrainingStore(IngestSettings(max_runs=0))
    with pytest.raises(ValueError, match="stale_after_seconds"):
        TrainingStore(IngestSettings(stale_after_seconds=float("nan")))


def test_disabled_store_and_server_side_rejections() -> None:
    store = TrainingStore(IngestSettings(enabled=False))
    assert push(store, snapshot())[0] == 404
    store.count_rejection("too_large")
    store.count_rejection("length_required")
    assert outcome_count(store, "too_large") == 1 and outcome_count(store, "length_required") == 1
    with pytest.raises(ValueError, match="unknown ingest rejection"):
        store.count_rejection("made_up")


def steps_of(store: TrainingStore, run: str = "resnet50") -> float:
    return scrape(store)[("gpu_training_steps_total", (("rank", "0"), ("run", run), ("uuid", "GPU-1111")))]


def test_a_push_from_the_future_cannot_take_over_a_live_run() -> None:
    clock = Clock()
    store = TrainingStore(IngestSettings(), clock=clock)
    assert push(store, snapshot(steps=10))[0] == 202
    status, reason = push(store, snapshot(started_at=4_102_444_800.0, steps=0))  # 2100-01-01
    assert status == 409 and reason.startswith("rejected (implausible_started_at)") and "ahead" in reason
    clock.now += 5
    assert push(store, snapshot(steps=20))[0] == 202  # the real job goes on
    assert steps_of(store) == 20
    # a brand-new key from the future is refused too, so it cannot reserve the name either
    assert push(store, snapshot(run="squatter", started_at=clock.now + 3600))[0] == 409
    assert outcome_count(store, "implausible_started_at") == 2


def test_a_new_incarnation_must_start_after_the_live_one_last_pushed() -> None:
    clock = Clock()
    store = TrainingStore(IngestSettings(), clock=clock)
    assert push(store, snapshot(steps=10))[0] == 202
    clock.now += 600
    assert push(store, snapshot(steps=20))[0] == 202
    # claims to have restarted 300 s ago, but the live process pushed just now: refused
    status, reason = push(store, snapshot(started_at=clock.now - 300, steps=0))
    assert status == 409 and "must have started after that push" in reason
    assert steps_of(store) == 20
    clock.now += 10  # the job really restarts: its process started after the last push
    assert push(store, snapshot(started_at=clock.now - 2, steps=1))[0] == 202
    assert steps_of(store) == 1
    # once the run is finished, any later start may replace it
    assert push(store, snapshot(started_at=clock.now - 2, steps=2, finished=True, current_phase=""))[0] == 202
    clock.now += 1
    assert push(store, snapshot(started_at=clock.now, steps=0))[0] == 202


def test_a_flood_of_junk_runs_cannot_lock_out_a_real_job() -> None:
    clock = Clock()
    settings = IngestSettings()
    store = TrainingStore(settings, clock=clock)
    for step in (1, 2):  # a real job, confirmed by its second push
        assert push(store, snapshot(steps=step))[0] == 202
    for i in range(3 * settings.max_runs):  # junk: each run pushes once, and fills every slot
        clock.now += 0.01
        assert push(store, snapshot(run=f"junk-{i}"))[0] == 202
    assert scrape(store)[("gpu_exporter_training_runs", ())] == settings.max_runs
    clock.now += 1
    assert push(store, snapshot(run="second-real-job"))[0] == 202  # a new real job still gets in
    assert push(store, snapshot(steps=3))[0] == 202 and steps_of(store) == 3  # the first kept its slot
    evicted = 3 * settings.max_runs + 1 + 1 - settings.max_runs
    assert scrape(store)[("gpu_exporter_ingest_evictions_total", ())] == evicted
    assert outcome_count(store, "too_many_runs") == 0


def test_eviction_takes_finished_runs_first_and_an_evicted_run_that_returns_is_confirmed() -> None:
    clock = Clock()
    store = TrainingStore(IngestSettings(max_runs=2), clock=clock)
    assert push(store, snapshot(run="once"))[0] == 202
    clock.now += 1
    assert push(store, snapshot(run="done", finished=True, current_phase=""))[0] == 202
    clock.now += 1
    assert push(store, snapshot(run="new"))[0] == 202  # evicts "done" although "once" is older
    runs = {k[1][1][1] for k in scrape(store) if k[0] == "gpu_training_steps_total"}
    assert runs == {"once", "new"}
    clock.now += 1
    assert push(store, snapshot(run="done", steps=11))[0] == 202  # back: evicts "once", is confirmed
    clock.now += 1
    assert push(store, snapshot(run="new", steps=11))[0] == 202  # "new" confirmed by its 2nd push
    status, reason = push(store, snapshot(run="latecomer"))
    assert status == 429 and "confirmed live runs" in reason
    assert scrape(store)[("gpu_exporter_ingest_evictions_total", ())] == 2


def test_docs_list_every_outcome_with_its_status() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", doc, re.MULTILINE))
    from gpu_exporter.ingest import _STATUS
    assert {o: str(s) for o, s in _STATUS.items()} == {o: s for o, s in rows.items() if o in OUTCOMES}
    assert set(OUTCOMES) - {"accepted"} <= set(rows)


def test_run_id_and_tags_on_the_info_series_only() -> None:
    """The launch's run id and the tags label gpu_training_run_info (tags as tag_<key>); the run id also labels
    gpu_training_run_start_timestamp_seconds; no other series changes."""
    store = TrainingStore(IngestSettings(), clock=Clock())
    assert push(store, snapshot(run_id="rdzv-7f3a", tags={"team": "vision", "git": "3f2a1c9"})) == (202, "accepted")
    assert push(store, snapshot(run="old-client", uuid="GPU-2222")) == (202, "accepted")
    m = scrape(store)
    key = (("rank", "0"), ("run", "resnet50"), ("uuid", "GPU-1111"))
    assert m[("gpu_training_run_info", (("rank", "0"), ("run", "resnet50"), ("run_id", "rdzv-7f3a"),
                                        ("tag_git", "3f2a1c9"), ("tag_team", "vision"), ("uuid", "GPU-1111")))] == 1
    assert m[("gpu_training_run_start_timestamp_seconds", (*key[:2], ("run_id", "rdzv-7f3a"), key[2]))] == \
        1_700_000_000.0
    assert m[("gpu_training_run_info", (("rank", "0"), ("run", "old-client"), ("run_id", ""),
                                        ("uuid", "GPU-2222")))] == 1  # a library without run ids
    assert m[("gpu_training_steps_total", key)] == 10
    assert not [k for k in m if k[0] not in ("gpu_training_run_info", "gpu_training_run_start_timestamp_seconds")
                and any(label in ("run_id", "tag_team") for label, _ in k[1])]


@pytest.mark.parametrize(("changes", "answer"), [
    ({"tags": {"Team": "x"}}, "accepted without tags (tag key 'Team' may only contain a-z, 0-9 and _, starting "
                              "with a letter, up to 32 characters)"),
    ({"tags": {f"k{i}": "v" for i in range(9)}}, "accepted without tags (9 tags exceed the limit of 8)"),
    ({"tags": ["team"]}, "accepted without tags (tags must be an object of key -> value strings)"),
    ({"tags": {"team": "a\"}"}}, "accepted without tags (tag team 'a\"}' may only contain A-Za-z0-9_.:/@+-)"),
    ({"run_id": "a b"}, "accepted without run_id (run_id 'a b' may only contain A-Za-z0-9_.:/@+-)"),
    ({"run_id": 7}, "accepted without run_id (run_id must be a string)"),
])
def test_bad_run_id_or_tags_cost_only_themselves(changes: dict[str, Any], answer: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A push with a bad run id or bad tags is stored without them, answered 202 with what was dropped, and logged
    once per run: the phases are never lost to a label."""
    store = TrainingStore(IngestSettings(), clock=Clock())
    assert push(store, snapshot(**changes)) == (202, answer)
    assert push(store, snapshot(**changes, steps=11)) == (202, answer)
    m = scrape(store)
    key = (("rank", "0"), ("run", "resnet50"), ("uuid", "GPU-1111"))
    assert m[("gpu_training_steps_total", key)] == 11
    info = [labels for name, labels in m if name == "gpu_training_run_info"]
    assert len(info) == 1 and not any(label.startswith("tag_") for label, _ in info[0])
    assert [r.getMessage() for r in caplog.records] == [f"training run resnet50 rank 0: stored without {answer[17:]}"]
