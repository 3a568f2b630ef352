"""The training library's timing: phases add up to wall time, custom phases, sync_every, identity."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import pynvml
import pytest
from gpu_exporter import catalog
from gpu_exporter.ingest import IngestSettings, TrainingStore
from gpu_exporter.training import OTHER, STANDARD_PHASES, Run
from gpu_exporter.training import device as dev
from gpu_exporter.training.distributed import resolve_rank


def test_phases_add_up_to_wall_time_and_idle_time_is_other() -> None:
    run = Run("wall", uuid="")
    t0 = run._start

    def slow_batches() -> list[int]:
        time.sleep(0.03)
        return [1, 2]

    for batch in run.data(iter([slow_batches(), slow_batches()])):
        with run.phase("compute"):
            time.sleep(0.02)
        time.sleep(0.01)  # in no phase: counts as "other"
        run.step(samples=len(batch))
    seconds = run.phase_seconds()
    wall = perf_counter() - t0
    assert set(seconds) == {OTHER, *STANDARD_PHASES}
    assert sum(seconds.values()) == pytest.approx(wall, abs=2e-3)
    assert seconds["compute"] == pytest.approx(0.04, abs=0.015)
    # both slow batches were built before run.data() took them, so "other" holds their 60 ms too
    assert seconds[OTHER] >= 0.02 + 0.06
    assert run.steps == 2 and run.samples == 4 and run.batch_size == 2


def test_data_phase_counts_time_blocked_in_next() -> None:
    run = Run("data", uuid="")

    def loader() -> Iterator[int]:
        for i in range(3):
            time.sleep(0.02)
            yield i

    assert list(run.data(loader())) == [0, 1, 2]
    assert run.phase_seconds()["data"] == pytest.approx(0.06, abs=0.015)


def test_nested_phase_pauses_the_outer_one() -> None:
    run = Run("nest", uuid="")
    with run.phase("compute"):
        time.sleep(0.02)
        with run.phase("metrics"):
            time.sleep(0.03)
            with run.phase("metrics"):  # re-entering the current phase changes nothing
                time.sleep(0.01)
        assert run.current_phase.name == "compute"
    s = run.phase_seconds()
    assert s["metrics"] == pytest.approx(0.04, abs=0.01)
    assert s["compute"] == pytest.approx(0.02, abs=0.01)
    assert run.current_phase.name == OTHER


def test_exception_inside_a_phase_still_closes_it() -> None:
    run = Run("exc", uuid="")
    with pytest.raises(RuntimeError), run.phase("compute"):
        raise RuntimeError("boom")
    assert run.current_phase.name == OTHER


def test_open_and_close_end_a_phase_however_it_was_entered() -> None:
    """The integration API: open() never nests, close() leaves the phase at any depth, close_phases() all."""
    start = perf_counter()
    run = Run("api", uuid="", gpu_timing=False)
    compute, metrics = run.phase("compute"), run.phase("metrics")
    assert run.other_phase is run.phase(OTHER) and run.current_phase is run.other_phase and run.other_phase.is_open
    assert compute.open() and not compute.open() and compute.is_open
    compute.close()
    assert run.current_phase is run.other_phase
    with compute, compute, compute:  # nested twice: one close() leaves it all the same
        metrics.close()  # not the open one: nothing happens
        assert compute.is_open
        compute.close()
        assert run.current_phase is run.other_phase
    assert run.current_phase is run.other_phase  # the with blocks' exits found it closed: no change
    compute.open()
    metrics.open()
    time.sleep(0.01)
    run.close_phases()
    assert run.current_phase is run.other_phase and not metrics.is_open and metrics.run is run
    seconds = run.phase_seconds()
    assert seconds["metrics"] >= 0.01 and seconds["metrics"] <= sum(seconds.values()) <= perf_counter() - start


def test_the_docs_integration_example_times_its_events() -> None:
    """docs/training.md's "Writing an integration" example, copied verbatim, driven through a loop of events."""
    text = (Path(__file__).parent.parent / "docs" / "training.md").read_text()
    section = text[text.index("## Writing an integration"):]
    section = section[:section.index("\n## ", 1)]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/training.md", "exec"), namespace)

    class Batch:
        shape = (16, 3)

    run = Run("doc-integration", uuid="", gpu_timing=False)
    callback = namespace["MyFrameworkCallback"](run=run)
    callback.on_train_start()
    for _ in range(3):
        time.sleep(0.01)  # the fetch
        callback.on_batch_start(Batch())
        time.sleep(0.005)  # the framework's bookkeeping: other
        callback.on_forward_start()
        callback.on_forward_start()  # a nested model call
        time.sleep(0.01)
        callback.on_forward_end()
        assert run.current_phase.name == "compute"
        callback.on_forward_end()
        assert run.current_phase.name == OTHER
        callback.on_batch_end(Batch())
        assert run.current_phase.name == "data"
    callback.on_train_end()
    seconds = run.phase_seconds()
    assert (run.steps, run.samples, run.current_phase) == (3, 48, run.other_phase)
    assert seconds["data"] >= 0.03 and seconds["compute"] >= 0.03 and seconds[OTHER] >= 0.015
    assert not run.closed  # the run was given: the callback does not close it


def test_custom_phases_up_to_the_cap() -> None:
    run = Run("custom", uuid="", max_custom_phases=2)
    with run.phase("eval"):
        pass
    assert run.phase("eval") is run.phase("eval")
    run.phase("upload")
    with pytest.raises(ValueError, match="already has 2 custom phases"):
        run.phase("third")
    with pytest.raises(ValueError, match="may only contain"):
        Run("custom2", uuid="").phase("bad phase")
    assert set(run.phase_seconds()) == {OTHER, *STANDARD_PHASES, "eval", "upload"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "has space"}, "may only contain"),
    ({"name": ""}, "must not be empty"),
    ({"name": "x" * 129}, "limit is 128"),
    ({"name": "ok", "sync_every": -1}, "sync_every"),
    ({"name": "ok", "rank": "a b"}, "rank"),
])
def test_bad_arguments_give_one_line_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Run(**kwargs)  # type: ignore[arg-type]  # deliberately wrong types
    assert "\n" not in str(info.value)


def test_sync_every_synchronises_only_on_every_nth_step() -> None:
    run = Run("sync", uuid="", sync_every=2)
    calls: list[str] = []
    run._sync_fn = lambda: calls.append(run.current_phase.name)
    compute = run.phase("compute")
    for step in range(1, 6):
        with compute:
            pass
        calls.append(f"step{step}")
        run.step()
    # boundaries synchronise on the steps after steps 2 and 4: before entering and before leaving
    assert calls == ["step1", "step2", OTHER, "compute", "step3", "step4", OTHER, "compute", "step5"]


def test_sync_every_without_cuda_is_a_no_op() -> None:
    """Without CUDA the boundary's synchronizer is the stand-in that waits for nothing; timing goes on as before."""
    from gpu_exporter.training.run import _no_sync

    run = Run("nocuda", uuid="", sync_every=1)
    run.step()
    assert run._sync_fn is None  # not looked up before a boundary needs it
    with run.phase("compute"):
        time.sleep(0.02)
    assert run._sync_fn is _no_sync  # the boundary synchronised, with the no-op
    assert run.phase_seconds()["compute"] == pytest.approx(0.02, abs=0.015)


def test_concurrent_snapshots_never_go_down() -> None:
    """The pusher thread reads while the training thread switches phases (the seqlock)."""
    run = Run("race", uuid="")
    stop = threading.Event()
    phases = [run.phase(p) for p in ("data", "compute", "metrics")]

    def train() -> None:
        while not stop.is_set():
            for p in phases:
                with p:
                    pass
            run.step(samples=1)

    thread = threading.Thread(target=train)
    thread.start()
    previous: dict[str, float] = {}
    try:
        for _ in range(3000):
            now = run.phase_seconds()
            for name, value in previous.items():
                assert now[name] >= value, (name, previous, now)
            previous = now
    finally:
        stop.set()
        thread.join()


def test_snapshot_is_accepted_by_the_exporter_store() -> None:
    run = Run("schema", rank=2, uuid="GPU-0c8b1f1e")
    run._allocator = lambda device: {"allocated_bytes": 10, "reserved_bytes": 20, "retries": 1, "ooms": 0}
    with run.phase("compute"):
        run.step(samples=16)
        snap = run.snapshot()
    assert snap["current_phase"] == "compute" and snap["rank"] == "2"
    store = TrainingStore(IngestSettings())
    assert store.handle_push(json.dumps(snap).encode(), "application/json", None) == (202, "accepted")
    assert _current_phase(store) == {"compute"}
    final = run.snapshot(finished=True)
    assert final["current_phase"] == ""
    assert store.handle_push(json.dumps(final).encode(), "application/json", None)[0] == 202
    assert _current_phase(store) == set()


def _current_phase(store: TrainingStore) -> set[str]:
    """The phases whose gpu_training_current_phase the store exports at 1."""
    return {sample.labels["phase"] for family in store.collect() for sample in family.samples
            if sample.name == catalog.GPU_TRAINING_CURRENT_PHASE.name and sample.value == 1.0}


def test_rank_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert resolve_rank(None) == "0"
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_rank(None) == "3"
    assert dev.resolve_device(None) == 3
    monkeypatch.setenv("RANK", "11")
    assert resolve_rank(None) == "11"
    assert resolve_rank(5) == "5"


def test_uuid_from_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa, MIG-bbbb")
    assert dev.resolve_uuid(None, 0) == "GPU-aaaa"
    assert dev.resolve_uuid(None, 1) == "MIG-bbbb"
    assert dev.resolve_uuid(None, 2) == ""  # not visible to this process
    assert dev.resolve_uuid("GPU-explicit", 0) == "GPU-explicit"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert dev.resolve_uuid(None, 0) == ""  # no GPU visible at all


def test_uuid_falls_back_to_nvml_and_is_empty_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    asked: list[int] = []

    def fake_nvml_uuid(index: int) -> str:
        asked.append(index)
        return "GPU-from-nvml"

    monkeypatch.setattr(dev, "_nvml_uuid", fake_nvml_uuid)
    assert dev.resolve_uuid(None, 0) == "GPU-from-nvml"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert dev.resolve_uuid(None, 1) == "GPU-from-nvml"
    assert asked == [0, 1]  # CUDA index 1 is physical GPU 1 in "3,1"
    monkeypatch.undo()

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert dev._nvml_uuid(0) == ""  # no NVIDIA driver: unknown, not an error


def test_identity_is_resolved_once_and_invalid_uuids_become_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_resolve(explicit: str | None, index: int) -> str:
        calls.append(index)
        return "weird uuid!"

    monkeypatch.setattr(dev, "resolve_uuid", fake_resolve)
    run = Run("ident", device=0)
    assert run.identity() == ("", 0)
    assert run.identity() == ("", 0)
    assert calls == [0]


def test_run_id_sources_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_id= wins, then $GPU_EXPORTER_RUN_ID, torchrun's rendezvous id (not its default 'none'), Slurm's job id,
    then one launch id per process (docs/training.md#run-identity)."""
    from gpu_exporter.training.identity import resolve_run_id

    for name in ("GPU_EXPORTER_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    launch = Run("a", uuid="").run_id
    assert launch.startswith("launch-") and len(launch) == len("launch-") + 12
    assert Run("b", uuid="").run_id == launch  # one launch id per process
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert Run("a", uuid="").run_id == launch
    monkeypatch.setenv("SLURM_JOB_ID", "8812")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert (Run("a", uuid="").run_id, Run("a", uuid="").run_id_source) == ("slurm-8812-r2", "SLURM_JOB_ID")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "3f9a-c1")
    assert Run("a", uuid="").run_id == "3f9a-c1"
    monkeypatch.setenv("GPU_EXPORTER_RUN_ID", "nightly 2026/12/04")  # the operator's: cleaned, not refused
    assert Run("a", uuid="").run_id == "nightly_2026/12/04"
    run = Run("a", uuid="", run_id="mine")
    assert (run.run_id, run.run_id_source, run.snapshot()["run_id"]) == ("mine", "argument", "mine")
    with pytest.raises(ValueError, match=r"^training.start: run_id 'a b' may only contain"):
        resolve_run_id("a b")


def test_default_names_never_collide_across_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """watch and the callbacks without a name: the script's name and the run id's tail, the same on every rank."""
    from gpu_exporter.training import hooks

    monkeypatch.setattr("sys.argv", ["/jobs/train.py"])
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a4f0e6c2-1b2c-4d5e-8f90-123456789abc")
    run, owned = hooks.start_run(None, None, {"url": "http://127.0.0.1:1", "uuid": "", "push_interval": 60})
    try:
        assert (run.name, run.run_id, owned) == ("train-123456789abc", "a4f0e6c2-1b2c-4d5e-8f90-123456789abc", True)
    finally:
        run.close()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "b7")
    run, _ = hooks.start_run(None, None, {"url": "http://127.0.0.1:1", "uuid": "", "push_interval": 60})
    run.close()
    assert run.name == "train-b7"


@pytest.mark.parametrize(("tags", "message"), [
    ({"Team": "x"}, "tag key 'Team' may only contain a-z, 0-9 and _, starting with a letter, up to 32 characters"),
    ({"team": "a b"}, "tag team 'a b' may only contain A-Za-z0-9_.:/@+-"),
    ({"team": "v" * 65}, "tag team is 65 characters long; the limit is 64"),
    ({f"k{i}": "v" for i in range(9)}, "9 tags exceed the limit of 8"),
    ({"team": 3}, "tag team must be a string, not int"),
])
def test_bad_tags_give_one_line_errors(tags: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as err:
        Run("a", uuid="", tags=tags)  # type: ignore[arg-type]
    assert str(err.value) == f"training.start: {message}"


def test_tags_from_the_environment_and_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_EXPORTER_TAGS", "team=nlp, user=ana")
    run = Run("a", uuid="", tags={"team": "vision", "git": "3f2a1c9"})
    assert run.snapshot()["tags"] == {"git": "3f2a1c9", "team": "vision", "user": "ana"}
    monkeypatch.setenv("GPU_EXPORTER_TAGS", "team")
    with pytest.raises(ValueError, match=r"^training.start: \$GPU_EXPORTER_TAGS: 'team' is not key=value$"):
        Run("a", uuid="")
    monkeypatch.delenv("GPU_EXPORTER_TAGS")
    assert "tags" not in Run("a", uuid="").snapshot()


def test_a_cuda_run_without_a_pusher_keeps_a_bounded_number_of_events(tmp_path: Path) -> None:
    """A ``Run`` on CUDA that nobody reads (no pusher, as in ``Run``'s docstring) folds the reached events on the
    training thread every FOLD_EVERY phase changes: 4,000 phase changes make a few dozen CUDA events, not 4,000,
    and the phases still add up to the GPU's time."""
    torch = pytest.importorskip("torch")
    from gpu_exporter.simulate import torch_cuda
    from gpu_exporter.simulate.device import AsyncDevice
    from gpu_exporter.training.run import FOLD_EVERY

    device = AsyncDevice("GPU-bounded", directory=tmp_path)
    undo = torch_cuda.install(device)
    made = [0]
    new_event = torch.cuda.Event

    def counting(**kwargs: Any) -> Any:
        made[0] += 1
        return new_event(**kwargs)

    torch.cuda.Event = counting  # undo() puts torch's own back
    try:
        run = Run("no-pusher", uuid="GPU-bounded")
        data, compute = run.phase("data"), run.phase("compute")
        for _ in range(1000):  # 4 phase changes each: into data, back to other, into compute, back
            with data:
                pass
            with compute:
                device.launch(1e-5)
        assert made[0] <= 2 * FOLD_EVERY, made[0]
        device.synchronize()
        seconds = run.phase_seconds(finished=True)  # the GPU's up to the last event, then the CPU's clock
        cpu = run.cpu_phase_seconds()
        run.close()
    finally:
        undo()
        device.close()
    assert seconds["compute"] > 0
    assert sum(seconds.values()) == pytest.approx(sum(cpu.values()), rel=0.05)  # both: wall time since the start
