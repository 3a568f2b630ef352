"""The communication phase, rank and world size of distributed jobs, on real torch.distributed (gloo, CPU).

Two real processes form a gloo process group (torch.multiprocessing, TCP rendezvous on 127.0.0.1)
and train a tiny DistributedDataParallel model with gpu_exporter.training; each returns its
run's phase seconds, rank and world size. Rank 1 sleeps in its data loading: rank 0 then waits
for it inside DDP's gradient all-reduce, and that wait must be phase ``communication`` on rank 0
(not ``compute``), while rank 1 waits in ``data``. The ingest side checks the ``world_size`` field.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import pytest
from gpu_exporter.ingest import IngestSettings, TrainingStore
from gpu_exporter.training import distributed
from gpu_exporter.training.protocol import MAX_WORLD_SIZE

from testbed import free_port

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

STEPS = 12
SLOW_DATA_S = 0.05


def _worker(rank: int, port: int, slow_rank: int, results: Any) -> None:
    """One rank: DDP on a tiny model, the data of ``slow_rank`` slowed; puts its run's figures in ``results``."""
    import torch.distributed as dist
    from gpu_exporter import training
    from gpu_exporter.training.run import Run
    from torch.nn.parallel import DistributedDataParallel

    os.environ.pop("RANK", None)
    os.environ.pop("WORLD_SIZE", None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        run = Run("ddp-unit", uuid="")  # rank and world size from the process group
        model = DistributedDataParallel(torch.nn.Linear(16, 4))
        watched = distributed.watch(run, ddp_model=model)
        watched = watched and distributed.watch(run, ddp_model=model)  # twice (an integration and you): one hook
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def batches() -> Any:
            for _ in range(STEPS):
                if rank == slow_rank:
                    time.sleep(SLOW_DATA_S)
                yield torch.randn(8, 16), torch.randint(0, 4, (8,))

        for x, y in run.data(batches()):
            with run.phase("compute"):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            run.step(samples=len(y))
        loss = torch.tensor([1.0])
        dist.all_reduce(loss)  # a plain collective, also timed
        with run.phase("metrics"):
            dist.barrier()  # inside another phase: communication pauses it
        run.close()
        after_close = run.phase_seconds()["communication"]
        dist.barrier()  # after close: not timed
        # training.start on an initialized process group times its collectives by itself (no exporter listens).
        started = training.start("ddp-auto", url="http://127.0.0.1:1", uuid="", push_interval=60)
        with started.phase("compute"):
            dist.barrier()
        auto = (started.rank, started.world_size, started.phase_seconds()["communication"] > 0)
        started.close()
        results.put({"rank": run.rank, "world_size": run.world_size, "watched": watched, "auto": auto,
                     "phases": run.phase_seconds(), "after_close": after_close, "loss": float(loss[0])})
    finally:
        dist.destroy_process_group()


def _run_job(slow_rank: int) -> dict[str, dict[str, Any]]:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(free_port(), slow_rank, results), nprocs=2, join=True, start_method="spawn")
    out = [results.get() for _ in range(2)]
    return {r["rank"]: r for r in out}


@pytest.mark.slow
def test_ddp_wait_for_a_slow_rank_is_communication_not_compute() -> None:
    ranks = _run_job(slow_rank=1)
    assert set(ranks) == {"0", "1"}
    for rank, r in ranks.items():
        assert (r["world_size"], r["watched"], r["loss"]) == (2, True, 2.0), rank
        assert r["phases"]["communication"] > 0, rank
        assert r["after_close"] == r["phases"]["communication"], rank  # nothing timed after close
        assert r["auto"] == (rank, 2, True), rank
    waiting, slow = ranks["0"]["phases"], ranks["1"]["phases"]
    # Rank 0 waits for rank 1's data (STEPS x SLOW_DATA_S in all) inside the all-reduce ...
    assert waiting["communication"] > 0.6 * STEPS * SLOW_DATA_S, waiting
    assert waiting["communication"] > 3 * waiting["compute"], waiting
    # ... while rank 1 spends that time in data and hardly waits in collectives.
    assert slow["data"] >= STEPS * SLOW_DATA_S, slow
    assert slow["communication"] < waiting["communication"] / 3, (slow, waiting)


def test_watch_without_a_process_group_does_nothing() -> None:
    from gpu_exporter.training.run import Run

    run = Run("solo", uuid="")
    assert distributed.watch(run) is False
    assert run.world_size == 1 and run.snapshot()["world_size"] == 1
    assert run.snapshot()["phases"]["communication"] == 0.0


def test_world_size_from_argument_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_exporter.training.run import Run

    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "5")
    run = Run("env", uuid="")
    assert (run.rank, run.world_size) == ("5", 8)
    assert Run("arg", uuid="", world_size=4, rank=1).world_size == 4
    monkeypatch.setenv("WORLD_SIZE", "eight")
    with pytest.raises(ValueError, match=r"\$WORLD_SIZE must be a whole number from 1 to"):
        Run("bad", uuid="")
    with pytest.raises(ValueError, match="world_size must be a whole number"):
        Run("bad", uuid="", world_size=0)


def _push(store: TrainingStore, **fields: Any) -> tuple[int, str]:
    doc = {"version": 1, "run": "r", "rank": "0", "uuid": "GPU-1", "started_at": time.time() - 10,
           "phases": {"compute": 1.0, "communication": 2.0}, "current_phase": "compute", "steps": 1,
           "samples": 1, "batch_size": 1, **fields}
    return store.handle_push(json.dumps(doc).encode(), "application/json", None)


def _world_sizes(store: TrainingStore) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for family in store.collect() if family.name == "gpu_training_world_size"
            for s in family.samples]


def test_ingest_keeps_world_size_and_refuses_bad_ones() -> None:
    store = TrainingStore(IngestSettings())
    assert _push(store, world_size=4) == (202, "accepted")
    assert _world_sizes(store) == [({"run": "r", "rank": "0", "uuid": "GPU-1"}, 4.0)]
    old = TrainingStore(IngestSettings())
    assert _push(old) == (202, "accepted")  # older clients send none: 1
    assert _world_sizes(old) == [({"run": "r", "rank": "0", "uuid": "GPU-1"}, 1.0)]
    for bad in (0, -1, 2.5, "2", True, MAX_WORLD_SIZE + 1):
        status, reason = _push(TrainingStore(IngestSettings()), world_size=bad)
        assert status == 400 and "world_size" in reason, (bad, reason)


def _exposition(t: float, world_size: int = 2) -> str:
    """Two GPUs, two ranks of run ddp after ``t`` seconds: rank 0 waits 70% in communication for rank 1's data."""
    shares = {"0": {"data": 0.05, "compute": 0.25, "communication": 0.7},
              "1": {"data": 0.7, "compute": 0.25, "communication": 0.05}}
    lines = ["gpu_exporter_last_sample_age_seconds 0"]
    for rank, phases in shares.items():
        gpu = f'gpu="{rank}",uuid="GPU-r{rank}"'
        run = f'run="ddp",rank="{rank}",uuid="GPU-r{rank}"'
        lines += [f'gpu_info{{{gpu},name="T"}} 1', f"gpu_busy_seconds_total{{{gpu}}} {0.2 * t}",
                  f"gpu_memory_used_bytes{{{gpu}}} 8e9", f"gpu_memory_total_bytes{{{gpu}}} 80e9",
                  f"gpu_training_steps_total{{{run}}} {4 * t}", f"gpu_training_world_size{{{run}}} {world_size}",
                  f"gpu_training_last_push_timestamp_seconds{{{run}}} 0", f"gpu_training_batch_size{{{run}}} 16"]
        for phase, share in phases.items():
            lines += [f'gpu_training_phase_seconds_total{{{run},phase="{phase}"}} {share * t}',
                      f'gpu_training_current_phase{{{run},phase="{phase}"}} {1 if phase == "compute" else 0}']
    return "\n".join(lines) + "\n"


def test_live_page_and_diagnose_judge_show_the_ranks_side_by_side() -> None:
    from gpu_exporter.status_page import StatusPage
    from gpu_exporter.thresholds import load_thresholds
    from prometheus_client.parser import text_string_to_metric_families

    clock = [100.0]
    page = StatusPage(lambda: text_string_to_metric_families(_exposition(clock[0])), load_thresholds(),
                      clock=lambda: clock[0], wall=lambda: 0.0)
    page.status()
    clock[0] = 110.0
    doc = page.status()
    verdicts = {g["uuid"]: g["verdict"] for g in doc["gpus"]}
    assert verdicts["GPU-r0"]["code"] == "ST" and verdicts["GPU-r1"]["code"] == "M1"
    assert ("waiting for rank 1 (straggler): rank 1 is input-bound (M1), 70% of its time in data"
            in verdicts["GPU-r0"]["reason"])
    assert "the run's step would take ~0.0875 s instead of 0.25 s" in verdicts["GPU-r0"]["reason"]
    (run,) = doc["distributed_runs"]
    assert (run["run"], run["world_size"], run["straggler"]) == ("ddp", 2, "1")
    assert [r["rank"] for r in run["ranks"]] == ["0", "1"] and run["projected_step_seconds"] == pytest.approx(0.0875)
    # the page embeds the same document; its script draws the ranks' table from it (tests/test_status_page.py)
    html = page.html().decode()
    embedded = re.search(r'<script id="status-doc" type="application/json">(.*?)</script>', html, re.S)
    assert embedded is not None and json.loads(embedded.group(1))["distributed_runs"] == doc["distributed_runs"]


def test_ranks_that_report_elsewhere_are_counted_and_named() -> None:
    """Two of four ranks on this node: the table says so and points to Prometheus for the whole run."""
    from gpu_exporter.status_page import judge_node
    from gpu_exporter.thresholds import load_thresholds
    from gpu_exporter.verdict import ranks
    from gpu_exporter.verdict.samples import snapshot_of
    from prometheus_client.parser import text_string_to_metric_families

    prev, cur = (snapshot_of(text_string_to_metric_families(_exposition(t, world_size=4)), t, 0.0) for t in (100, 110))
    (run,) = ranks.distributed_runs(judge_node(prev, cur, load_thresholds(), 10.0))
    assert (run.world_size, len(run.ranks), run.straggler) == (4, 2, "1")
    assert "Run ddp: 2 of 4 ranks reporting (the others report elsewhere" in ranks.render_text([run])
