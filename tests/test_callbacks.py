"""The job's own callbacks by name (gpu_exporter.training.callbacks), without a framework: what a hook counts as, the
snapshot field, the exporter's one series per run, a bad field dropped with a reason, and the verdict's words.

The real Lightning and Transformers jobs are in tests/test_integrations.py (the attribution tests)."""

from __future__ import annotations

import json
import time
from typing import Any

from gpu_exporter.ingest import IngestSettings, TrainingStore
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.training.callbacks import CallbackTimer
from gpu_exporter.training.hooks import PhaseStack
from gpu_exporter.training.run import Run
from gpu_exporter.verdict.causes import BY_ID, find_causes
from gpu_exporter.verdict.signals import RunSignals

SLEEP = 0.02


class Base:
    def on_step_end(self) -> None:
        pass

    def on_step_begin(self) -> None:
        pass


def _timer() -> tuple[Run, CallbackTimer]:
    run = Run("cb", uuid="", gpu_timing=False)
    stack = PhaseStack(run)
    return run, CallbackTimer(stack, run.phase("checkpoint"), run.phase("callbacks"))


def test_a_hook_that_saves_is_checkpoint_as_a_whole_from_its_second_call_and_the_others_are_callbacks() -> None:
    run, hooks = _timer()
    seen: list[tuple[str, str]] = []  # (phase at the call's start, phase after its write) of each call

    class SaveEvery(Base):
        def on_step_end(self) -> None:
            before = run.current_phase.name  # the Python before the write
            hooks.saving()  # what the save timers call as a write begins
            time.sleep(SLEEP)  # the work on the file after the write
            seen.append((before, run.current_phase.name))

    class Probe(Base):
        def on_step_begin(self) -> None:
            seen.append((run.current_phase.name, "probe"))

    saver, probe = SaveEvery(), Probe()
    hooks.wrap(saver, ("on_step_end", "on_step_begin"), Base)  # on_step_begin is inherited: not wrapped
    hooks.wrap(probe, ("on_step_end", "on_step_begin"), Base)
    assert "on_step_begin" not in vars(saver) and "on_step_end" not in vars(probe)
    for _ in range(4):
        probe.on_step_begin()
        saver.on_step_end()
    # the first call starts as callbacks (nothing predicts a write yet) and turns checkpoint at its write; every later
    # call is checkpoint from its start; the hook that writes nothing is callbacks, never metrics
    assert seen == [("callbacks", "probe"), ("callbacks", "checkpoint"),
                    *[("callbacks", "probe"), ("checkpoint", "checkpoint")] * 3], seen
    seconds = run.cpu_phase_seconds()
    assert seconds["checkpoint"] >= 4 * SLEEP and seconds["metrics"] == 0.0 and run.current_phase is run.other_phase
    listed = hooks.snapshot()
    assert [(c["name"], c["phase"]) for c in listed] == [("SaveEvery.on_step_end", "checkpoint"),
                                                          ("Probe.on_step_begin", "callbacks")]
    assert listed[0]["seconds"] >= 4 * SLEEP
    hooks.undo()
    assert "on_step_end" not in vars(saver) and "on_step_begin" not in vars(probe)


def test_a_hook_that_saves_every_third_call_is_predicted_on_the_third() -> None:
    run, hooks = _timer()
    starts: list[str] = []

    class Every3(Base):
        def on_step_end(self) -> None:
            starts.append(run.current_phase.name)
            if len(starts) % 3 == 0:
                hooks.saving()

    hook = Every3()
    hooks.wrap(hook, ("on_step_end",), Base)
    for _ in range(12):
        hook.on_step_end()
    # writes on calls 3, 6, 9, 12: after the first, call 4 is predicted to write (it wrote on the previous call) and
    # does not; once the gap is known (3, after the second write), exactly the writing calls start as checkpoint
    assert [i + 1 for i, phase in enumerate(starts) if phase == "checkpoint"] == [4, 9, 12], starts


def _snapshot(callbacks: Any) -> bytes:
    return json.dumps({"version": 1, "run": "cb", "rank": "0", "uuid": "GPU-cb", "started_at": time.time() - 10,
                       "phases": {"compute": 2.0, "checkpoint": 6.0, "other": 2.0}, "current_phase": "compute",
                       "steps": 10, "samples": 10, "batch_size": 1, "callbacks": callbacks}).encode()


def _callback_series(store: TrainingStore) -> list[tuple[str, str, float]]:
    return [(s.labels["callback"], s.labels["phase"], s.value) for family in store.collect() for s in family.samples
            if s.name == "gpu_training_callback_seconds_total"]


def test_the_exporter_exports_the_biggest_hook_only_and_drops_a_bad_field_with_a_reason() -> None:
    store = TrainingStore(IngestSettings())
    listed = [{"name": "Probe.on_step_begin", "seconds": 1.0, "phase": "callbacks"},
              {"name": "SaveEvery.on_step_end", "seconds": 6.0, "phase": "checkpoint"}]
    assert store.handle_push(_snapshot(listed), "application/json", None) == (202, "accepted")
    assert _callback_series(store) == [("SaveEvery.on_step_end", "checkpoint", 6.0)]
    for bad, why in (([{"name": "a b", "seconds": 1, "phase": "callbacks"}], "may only contain"),
                     ([{"name": "A.b", "seconds": -1, "phase": "callbacks"}], "finite number >= 0"),
                     ([{"name": "A.b", "seconds": 1, "phase": "metrics"}], "phase must be one of"),
                     ([{}] * 4, "at most 3")):
        store = TrainingStore(IngestSettings())
        status, reason = store.handle_push(_snapshot(bad), "application/json", None)
        assert status == 202 and reason.startswith("accepted without callbacks (") and why in reason, reason
        assert "\n" not in reason
        assert _callback_series(store) == []
        phases = [s for f in store.collect() for s in f.samples if s.name == "gpu_training_phase_seconds_total"]
        assert len(phases) == 3  # the snapshot itself is kept


def test_the_verdict_names_the_hook_for_checkpoint_and_callbacks() -> None:
    t = load_thresholds()
    (ck,) = find_causes(0.2, 0.3, RunSignals({"checkpoint": 0.68, "compute": 0.2, "other": 0.12},
                                             callback=("SaveEvery.on_train_batch_end", "checkpoint", 0.63)), t)
    assert ck.cause.code == "CK"
    assert ck.cause.reason(ck, "job", "0").endswith(
        "saving checkpoints: `SaveEvery.on_train_batch_end` takes 63% of the step.")
    (cb,) = find_causes(0.2, 0.3, RunSignals({"callbacks": 0.5, "compute": 0.3, "other": 0.2},
                                             callback=("Probe.on_step_end", "callbacks", 0.45)), t)
    assert cb.cause is BY_ID["callback_bound"] and "`Probe.on_step_end` takes 45% of the step" in cb.cause.reason(
        cb, "job", "0")
    assert "every N steps" in cb.cause.remedy and "off the training thread" in cb.cause.remedy
    # a hook of the other phase is not named: the checkpoint verdict of a run whose biggest hook writes nothing
    (plain,) = find_causes(0.2, 0.3, RunSignals({"checkpoint": 0.5, "compute": 0.3, "other": 0.2},
                                                callback=("Probe.on_step_end", "callbacks", 0.1)), t)
    assert "Probe" not in plain.cause.reason(plain, "job", "0")


def test_diagnose_from_an_exporter_names_the_hook() -> None:
    """``diagnose --url``'s path: two readings of an exporter whose run's biggest hook writes checkpoints."""
    from gpu_exporter import catalog
    from gpu_exporter.verdict.join import build_views
    from gpu_exporter.verdict.ladder import judge
    from gpu_exporter.verdict.readings import from_snapshots
    from gpu_exporter.verdict.samples import Snapshot, snapshot_of

    store = TrainingStore(IngestSettings())
    started = time.time() - 100

    def reading(at: float, phases: dict[str, float], hook_seconds: float) -> Snapshot:
        body = {"version": 1, "run": "job", "rank": "0", "uuid": "GPU-cb", "started_at": started,
                "phases": phases, "current_phase": "checkpoint", "steps": int(at), "samples": int(at), "batch_size": 1,
                "callbacks": [{"name": "SaveEvery.on_train_batch_end", "seconds": hook_seconds, "phase": "checkpoint"}]}
        assert store.handle_push(json.dumps(body).encode(), "application/json", None)[0] == 202
        gpu = {"gpu": "0", "uuid": "GPU-cb"}
        node = {catalog.GPU_INFO.name: [({**gpu, "name": "H100"}, 1.0)],
                catalog.GPU_BUSY_SECONDS_TOTAL.name: [(gpu, 0.2 * at)],
                catalog.GPU_MEMORY_USED_BYTES.name: [(gpu, 30e9)], catalog.GPU_MEMORY_TOTAL_BYTES.name: [(gpu, 80e9)]}
        training = snapshot_of(store.collect(), at, started + at).samples
        return Snapshot({**training, **node}, at=at, wall=time.time())

    prev = reading(10.0, {"compute": 2.0, "checkpoint": 7.0, "other": 1.0}, 6.0)
    cur = reading(20.0, {"compute": 4.0, "checkpoint": 14.0, "other": 2.0}, 12.5)
    t = load_thresholds()
    (view,) = build_views(from_snapshots(prev, cur), t, 10.0)
    verdict = judge(view, t)  # what diagnose prints
    assert (verdict.name, verdict.code) == ("checkpoint", "CK"), verdict
    assert "`SaveEvery.on_train_batch_end` takes 65% of the step" in verdict.reason, verdict.reason
    (run,) = view.runs
    finding = run.findings[0]
    assert finding.cause.code == "CK", run.findings
    assert finding.cause.reason(finding, "job", "0").endswith(
        "saving checkpoints: `SaveEvery.on_train_batch_end` takes 65% of the step."), finding


def test_diagnose_from_prometheus_names_the_hook() -> None:
    """``diagnose --prometheus-url``'s path: the recorded cause series and run:gpu_training_callback:share5m."""
    from gpu_exporter.commands.diagnose_sources import from_prometheus
    from gpu_exporter.verdict.join import build_views
    from gpu_exporter.verdict.ladder import judge
    from test_verdict import FakePrometheus

    gpu = {"uuid": "GPU-cb", "gpu": "0", "node": "n1"}
    run = {**gpu, "run": "job", "rank": "0"}
    prom: Any = FakePrometheus({
        "gpu_info": [({**gpu, "name": "H100"}, 1.0)],
        "gpu:gpu_utilization:avg5m": [(gpu, 0.2)], "gpu:gpu_memory_used:ratio": [(gpu, 0.4)],
        "run:gpu_training_phase:share5m": [({**run, "phase": "checkpoint"}, 0.7), ({**run, "phase": "compute"}, 0.3)],
        "gpu_training_current_phase == 1": [({**run, "phase": "compute"}, 1.0)],
        "run:gpu_useful_utilization:avg5m": [(run, 0.2)],
        "run:gpu_training_cause:share": [({**run, "cause": "checkpoint", "level": "low"}, 0.7)],
        "run:gpu_training_cause:projected_utilization": [({**run, "cause": "checkpoint"}, 0.67)],
        "run:gpu_training_callback:share5m": [({**run, "callback": "SaveEvery.on_step_end", "phase": "checkpoint"},
                                               0.63)],
    })
    t = load_thresholds()
    (view,) = build_views(from_prometheus(prom, cluster_label=""), t, 300.0)
    verdict = judge(view, t)
    assert (verdict.name, verdict.code) == ("checkpoint", "CK"), verdict
    assert "`SaveEvery.on_step_end` takes 63% of the step" in verdict.reason, verdict.reason
