"""Sampled phases (opt-in ``sampling.rate``): py-spy samples the Python stack of real CPU PyTorch loops
(tests/cause_loops.py) that stand on simulated GPUs; the exporter's estimates, published with
``source="sampled"``, must be within 0.1 of each loop's own timers, and reach the cause table and diagnose.
At 50 samples/s a loop gets about 1000 samples in the 21 s compared, so the estimate's own noise is about
0.015 (one standard deviation); the loops keep every phase's time in code the sampler can see (no sleep
inside a phase, no tensor work in the loop's own frame: tests/cause_loops.py). SAMPLING_OUTPUT=DIR keeps
the shares and diagnose's text.

Each loop reports its own phases (the truth) under GPU-e2e-<loop>; the simulated GPU GPU-s-<loop> lists the
loop's real pid and has no reported run, so only the sampler speaks for it. It is the loop's ops-mode device GPU
(``device: true``, ``$CAUSE_LOOP_DEVICE``): busy exactly while the loop is inside torch operators. The sampler
cannot tell metrics from the rest of the loop: its ``other`` is compared with the loop's metrics + other.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2e import keep_output, run_clis, shipped_fast_rules
from gpu_exporter.collectors.stacks import parse_raw, phase_of, pyspy_binary
from gpu_exporter.ingest import IngestSettings, TrainingStore
from prometheus_client.parser import text_string_to_metric_families
from test_query import run_cli

from testbed import exporter_env, free_port, http_get, promql, run_exporter, run_prometheus, scrape_config, wait_until

LOOPS = Path(__file__).with_name("cause_loops.py")
NAMES = ("mixed", "checkpoint", "metrics40", "healthy")
FRAMES = {
    "data": "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)",
    "checkpoint": "save (torch/serialization.py:1002)",
    "compute": "Module._call_impl (torch/nn/modules/module.py:1784)",
}


@pytest.mark.parametrize("phase", sorted(FRAMES))
def test_the_outermost_recognised_frame_names_the_phase(phase: str) -> None:
    inner = "Tensor.backward (torch/_tensor.py:623)"  # compute, but inside the outer frame
    assert phase_of(["<module> (train.py:3)", "train (train.py:9)", FRAMES[phase], inner]) == phase
    assert phase_of(["<module> (train.py:3)", "f1_macro (train.py:20)"]) == "other"
    assert phase_of(["<lambda> (train.py:9)", "Module.state_dict (torch/nn/modules/module.py:2200)"]) == "checkpoint"


def test_only_the_main_thread_counts() -> None:
    raw = ("thread (7): MainThread;<module> (a.py:1);" + FRAMES["data"] + " 6\n"
           "thread (9): gpu-exporter-push[r];Thread.run (threading.py:982);" + FRAMES["compute"] + " 50\n")
    assert parse_raw(raw, 7) == {"data": 6}


def test_sampled_runs_are_marked_and_never_shadow_a_reported_one() -> None:
    store = TrainingStore(IngestSettings())
    store.put_sampled("GPU-1", 42, {"data": 3.0, "compute": 1.0, "checkpoint": 0.0, "other": 1.0}, "data",
                      time.time() - 5)
    samples = [s for f in store.collect() for s in f.samples if s.name == "gpu_training_phase_seconds_total"]
    assert {(s.labels["run"], s.labels["source"], s.labels["phase"]) for s in samples if s.value} == {
        ("pid-42", "sampled", "data"), ("pid-42", "sampled", "compute"), ("pid-42", "sampled", "other")}
    assert not store.has_reported_run("GPU-1")  # a sampled run is no reported one
    doc = {"version": 1, "run": "real", "rank": "0", "uuid": "GPU-1", "started_at": time.time() - 5,
           "phases": {"compute": 5.0}, "current_phase": "compute", "steps": 1, "samples": 1, "batch_size": 1}
    assert store.handle_push(json.dumps(doc).encode(), "application/json", None)[0] == 202
    assert store.has_reported_run("GPU-1")
    reported = [s for f in store.collect() for s in f.samples if s.labels.get("run") == "real"]
    assert reported and all(s.labels.get("source", "") == "" for s in reported)


def _pyspy_works() -> str:
    """"" when py-spy can read a process here, else why not."""
    binary = pyspy_binary()
    if binary is None:
        return "py-spy is not installed (pip install py-spy: it is in the test extra)"
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.3)
        proc = subprocess.run([binary, "dump", "--pid", str(target.pid)], capture_output=True, text=True, timeout=20,
                              check=False)
        return "" if proc.returncode == 0 else f"py-spy dump refused: {(proc.stderr or proc.stdout).strip()[-300:]}"
    finally:
        target.kill()
        target.wait()


def _keep(name: str, text: str) -> None:
    keep_output("SAMPLING_OUTPUT", name, text)


def _phase_seconds(url: str) -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(http_get(url + "/metrics")):
        for s in family.samples:
            if s.name == "gpu_training_phase_seconds_total":
                out.setdefault((s.labels["uuid"], s.labels.get("source", "")), {})[s.labels["phase"]] = s.value
    return out


def _shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    delta = {p: after.get(p, 0.0) - before.get(p, 0.0) for p in after}
    total = sum(delta.values())
    return {p: v / total for p, v in delta.items()} if total > 0 else {}


def _sampled_rules() -> dict[str, str]:
    """The shipped rules shrunk 60-fold, but the phase-share window to 20 s only: the sampler moves its estimates
    once per 5 s window."""
    files = shipped_fast_rules()
    recording = files["rules/gpu-recording.rules.yml"]
    files["rules/gpu-recording.rules.yml"] = recording.replace("gpu_training_phase_seconds_total[5s]",
                                                               "gpu_training_phase_seconds_total[20s]")
    assert files["rules/gpu-recording.rules.yml"] != recording
    return files


@pytest.fixture(scope="module")
def sampled_stack() -> Iterator[tuple[str, dict[str, int], str]]:
    """The loops, the exporter sampling them, and Prometheus with the rules of :func:`_sampled_rules` scraping it
    from the start (so its alerts come due while the first test compares shares); yields (exporter, pids, prom)."""
    why = _pyspy_works()
    if why:
        pytest.skip(why)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        channel = {"GPU_SIM_DEVICE_DIR": tmp}  # the loops' devices write their busy intervals here
        loops = {name: subprocess.Popen([sys.executable, str(LOOPS), name, url, f"{tmp}/{name}.pt", "300"],
                                        env=exporter_env({**channel, "CAUSE_LOOP_DEVICE": f"GPU-s-{name}"}),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for name in NAMES}
        scenario = Path(tmp) / "sampled.yaml"
        scenario.write_text("gpus:\n" + "".join(
            f"  - {{name: NVIDIA H100 80GB HBM3, architecture: hopper, memory_gib: 80, uuid: GPU-s-{name}, "
            f"device: true, processes: [{{pid: {p.pid}, name: python, memory_gib: 20}}]}}\n"
            for name, p in loops.items()))
        try:
            with run_exporter(["--simulate", str(scenario), "--poll-interval", "0.5", "--sampling.rate", "50"],
                              env=channel, port=port) as exporter, \
                    run_prometheus(scrape_config(exporter, "sampled-node"), _sampled_rules()) as prom:
                yield exporter, {name: p.pid for name, p in loops.items()}, prom
        except BaseException:
            for p in loops.values():
                p.terminate()
            print({n: (p.poll(), p.communicate(timeout=30)[1][-3000:]) for n, p in loops.items()})
            raise
        finally:
            for p in loops.values():
                p.terminate()
            for p in loops.values():
                p.communicate(timeout=30)


@pytest.mark.slow
def test_sampled_shares_match_the_loops_own_timers(sampled_stack: tuple[str, dict[str, int], str]) -> None:
    url, pids, _ = sampled_stack
    def started() -> bool:  # every loop reports (torch imported, steps running) and is sampled
        seen = _phase_seconds(url)
        return all(seen.get((f"GPU-e2e-{n}", ""), {}).get("compute", 0) > 0 and (f"GPU-s-{n}", "sampled") in seen
                   for n in NAMES)
    wait_until(started, 120, interval=1.0, what="every loop to report and be sampled")
    time.sleep(6)  # one more sampling window: the windows compared hold no start-up (importing torch)
    before = _phase_seconds(url)
    with ThreadPoolExecutor(max_workers=1) as pool:  # diagnose (below) judges a 6 s window inside the 21 s compared
        diagnosing = pool.submit(run_clis, [["diagnose", "--url", url, "--window", "6s", "--output", "json"],
                                            ["diagnose", "--url", url, "--window", "6s", "--id", "GPU-s-checkpoint"]])
        time.sleep(21)
        after = _phase_seconds(url)
    for name in NAMES:
        own = _shares(before[(f"GPU-e2e-{name}", "")], after[(f"GPU-e2e-{name}", "")])
        sampled = _shares(before[(f"GPU-s-{name}", "sampled")], after[(f"GPU-s-{name}", "sampled")])
        own["other"] = own.get("other", 0.0) + own.pop("metrics", 0.0)
        _keep(f"shares-{name}.json", json.dumps({"own": own, "sampled": sampled}, indent=1))
        for phase in ("data", "compute", "checkpoint", "other"):
            assert sampled.get(phase, 0.0) == pytest.approx(own.get(phase, 0.0), abs=0.1), (name, phase, own, sampled)

    # diagnose reads the sampled run like a reported one, judges it with the cause table and says it is sampled.
    result, text_result = diagnosing.result()
    gpus = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
    (run,) = gpus["GPU-s-checkpoint"]["runs"]
    assert run["run"] == f"pid-{pids['checkpoint']}" and run["source"] == "sampled" and run["live"], run
    verdict = gpus["GPU-s-checkpoint"]["verdict"]
    assert verdict["verdict"] == "checkpoint" and "sampled from the Python stack" in verdict["reason"], verdict
    text = text_result.stdout
    _keep("diagnose-checkpoint.txt", text)
    assert "[sampled from the Python stack]" in text, text


@pytest.mark.slow
def test_sampled_phases_reach_the_rules_alerts_and_diagnose_from_prometheus(
        sampled_stack: tuple[str, dict[str, int], str]) -> None:
    """The shipped rules name the cause of a sampled run, keep source="sampled" on its series, fire the
    cause alert; diagnose --prometheus-url says it is sampled (rules: :func:`_sampled_rules`)."""
    _, pids, prom = sampled_stack
    _from_prometheus(prom, f"pid-{pids['checkpoint']}")


def _from_prometheus(prom: str, run_name: str) -> None:
    firing = wait_until(lambda: promql(prom, f'ALERTS{{alertname="GpuTrainingCheckpointBound", alertstate="firing", '
                                             f'run="{run_name}"}}'), 60, interval=1.0,
                        what="GpuTrainingCheckpointBound for the sampled checkpoint loop")
    assert firing[0]["metric"]["source"] == "sampled", firing
    result = run_cli("diagnose", "--prometheus-url", prom, "--output", "json", "--id", "GPU-s-checkpoint")
    (gpu,) = json.loads(result.stdout)["gpus"]
    assert gpu["runs"][0]["source"] == "sampled" and gpu["verdict"]["verdict"] == "checkpoint", gpu
    text = run_cli("diagnose", "--prometheus-url", prom, "--id", "GPU-s-checkpoint").stdout
    _keep("diagnose-prometheus-checkpoint.txt", text)
    assert "[sampled from the Python stack]" in text, text
