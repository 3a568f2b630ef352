"""Evidence for GPU processes nobody instrumented: /proc readings of real processes, the collector on
simulated GPUs whose process is a real one, and the evidence table (causes.HINTS) row by row."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from evidence_standins import direct_io_works
from gpu_exporter.causes import HINTS, MAIN_BUSY, STORAGE_WAIT, WORKERS_BUSY, ProcessSignals, find_hints
from gpu_exporter.collectors.evidence import STATES, ProcReader, parse_stat
from gpu_exporter.thresholds import load_thresholds
from harness import Harness

STANDINS = Path(__file__).with_name("evidence_standins.py")
T = load_thresholds()


def standin(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(STANDINS), *args])


def test_parse_stat_takes_the_name_up_to_the_last_parenthesis() -> None:
    raw = b"7 (a) R (b)) D 3 7 7 0 -1 0 0 0 0 0 300 100 40 2 20 0 1 0 1 0 0"
    st = parse_stat(raw)
    assert (st.state, st.ppid, st.cpu_ticks, st.children_ticks) == ("D", 3, 400, 42)


def test_reader_gone_process_is_none(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert ProcReader().evidence(proc.pid) is None
    assert ProcReader(tmp_path).evidence(os.getpid()) is None  # another PID namespace: nothing to see


def test_reader_counts_worker_children_and_their_cpu() -> None:
    parent = standin("workers", "3", "2")
    try:
        reader = ProcReader()
        deadline = time.monotonic() + 10
        ev = reader.evidence(parent.pid)
        while (ev is None or ev.child_processes < 2 or ev.children_cpu_seconds < 0.2) and time.monotonic() < deadline:
            time.sleep(0.1)
            ev = reader.evidence(parent.pid)
        assert ev is not None and ev.child_processes == 2
        assert ev.children_cpu_seconds >= 0.2  # the children's busy loops, seen from the parent
        assert ev.cpu_seconds < ev.children_cpu_seconds  # the parent itself sleeps
        assert ev.state in STATES.values()
    finally:
        parent.wait(timeout=30)


def test_reader_sees_a_main_thread_in_disk_wait(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    if not direct_io_works(data):
        pytest.skip(f"{tmp_path} does not take O_DIRECT reads (tmpfs?)")
    proc = standin("io", "3", str(data))
    try:
        reader = ProcReader()
        seen: set[str] = set()
        first = None
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and proc.poll() is None:
            ev = reader.evidence(proc.pid)
            if ev is not None:
                seen.add(ev.state)
                first = first if first is not None else ev.read_bytes
                last = ev.read_bytes
            time.sleep(0.01)
        assert "disk" in seen, seen
        if first is not None:  # /proc/PID/io needs privileges; as root (here) it is readable
            assert last is not None and last - first >= 8 << 20  # at least one chunk read from storage
    finally:
        proc.wait(timeout=30)


def scenario(tmp_path: Path, pids: list[int]) -> Path:
    procs = ", ".join(f"{{pid: {pid}, name: standin, memory_gib: 1}}" for pid in pids)
    path = tmp_path / "evidence.yaml"
    path.write_text("gpus:\n  - name: NVIDIA A100-SXM4-80GB\n    architecture: ampere\n    memory_gib: 80\n"
                    f"    utilization: {{constant: 0.03}}\n    processes: [{procs}]\n")
    return path


def test_collector_exports_real_process_evidence_on_a_simulated_gpu(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpu_exporter.collectors.evidence")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    busy = standin("cpu", "5")
    try:
        with Harness(scenario(tmp_path, [busy.pid, gone.pid])) as h:
            before = h.value("gpu_process_cpu_seconds_total", pid=str(busy.pid))
            h.advance(1.0)
            time.sleep(1.0)
            h.advance(1.0)
            assert h.value("gpu_process_cpu_seconds_total", pid=str(busy.pid)) > before
            assert h.value("gpu_process_child_processes", pid=str(busy.pid)) == 0
            states = {s.labels["state"]: s.value for s in h.samples("gpu_process_main_thread_state_seconds_total",
                                                                      pid=str(busy.pid))}
            assert set(states) == {"running", "sleeping", "disk", "other"}
            assert sum(states.values()) == pytest.approx(2.0)  # every simulated second went to a state
            assert not h.samples("gpu_process_cpu_seconds_total", pid=str(gone.pid))  # no such process: no series
            assert h.value("gpu_exporter_collector_success", collector="evidence") == 1
            assert not [r for r in caplog.records if "hostPID" in r.getMessage()]  # simulated PIDs: no hint
    finally:
        busy.wait(timeout=30)


def signals(running: float = 0.0, children: float = 0.0, kids: int = 0, disk: float = 0.0) -> ProcessSignals:
    return ProcessSignals("1", running, children, kids, {"running": running, "sleeping": 1.0 - running - disk,
                                                          "disk": disk})


@pytest.mark.parametrize(("p", "expected"), [
    (signals(running=T.evidence_busy_core_ratio), [MAIN_BUSY]),
    (signals(running=T.evidence_busy_core_ratio - 0.01), []),
    (signals(running=0.99, kids=1), []),
    (signals(running=0.1, children=2 * T.evidence_busy_core_ratio, kids=2), [WORKERS_BUSY]),
    (signals(running=0.1, children=2 * T.evidence_busy_core_ratio - 0.02, kids=2), []),
    (signals(disk=T.evidence_io_wait_share + 0.01), [STORAGE_WAIT]),
    (signals(disk=T.evidence_io_wait_share), []),
    (signals(running=0.5, disk=0.5), [STORAGE_WAIT]),
])
def test_hint_table_rows(p: ProcessSignals, expected: list[str]) -> None:
    assert [h.hint for h, _ in find_hints(p, T)] == expected


def test_every_hint_is_m1_with_advice() -> None:
    assert [h.hint for h in HINTS] == [STORAGE_WAIT, MAIN_BUSY, WORKERS_BUSY]
    assert all(h.code == "M1" and h.advice.startswith("M1:") for h in HINTS)


# --- the PromQL of monitoring/evidence.py finds exactly the hints find_hints finds --------------------

@dataclass(frozen=True)
class Case:
    """One GPU process held steady: main-thread state shares, CPU (cores), workers; its GPU's utilization."""

    running: float
    disk: float
    cpu: float = 0.5
    children: float = 0.0
    kids: int = 0
    utilization: float = 0.05
    reported: bool = False


CASES = [Case(0.97, 0.0), Case(0.79, 0.0), Case(0.8, 0.0), Case(0.97, 0.0, kids=1), Case(0.3, 0.5),
         Case(0.3, 0.2), Case(0.5, 0.25), Case(0.1, 0.0, children=3.6, kids=4), Case(0.1, 0.0, children=3.0, kids=4),
         Case(0.97, 0.0, utilization=0.9), Case(0.97, 0.0, reported=True), Case(0.5, 0.4, utilization=0.5)]
MINUTES = 10


def _promtool_doc() -> tuple[dict[str, Any], list[str]]:
    series: list[dict[str, str]] = []
    expected, names = [], []

    def add(name: str, values: str, **labels: str) -> None:
        every = {"instance": "n1:9445", "job": "gpu-exporter", **labels}
        body = ",".join(f'{k}="{v}"' for k, v in sorted(every.items()))
        series.append({"series": f"{name}{{{body}}}", "values": values})

    for i, c in enumerate(CASES):
        gpu, uuid, pid = str(i), f"GPU-{i}", str(100 + i)
        add("gpu_info", f"1x{MINUTES}", gpu=gpu, uuid=uuid)
        add("gpu_busy_seconds_total", f"0+{c.utilization * 60:g}x{MINUTES}", gpu=gpu, uuid=uuid)
        proc = {"gpu": gpu, "uuid": uuid, "pid": pid}
        add("gpu_process_cpu_seconds_total", f"0+{c.cpu * 60:g}x{MINUTES}", **proc)
        add("gpu_process_children_cpu_seconds_total", f"0+{c.children * 60:g}x{MINUTES}", **proc)
        add("gpu_process_child_processes", f"{c.kids}x{MINUTES}", **proc)
        sleeping = 1.0 - c.running - c.disk
        for state, share in (("running", c.running), ("sleeping", sleeping), ("disk", c.disk), ("other", 0.0)):
            add("gpu_process_main_thread_state_seconds_total", f"0+{share * 60:g}x{MINUTES}", state=state, **proc)
        if c.reported:
            add("gpu_training_current_phase", f"1x{MINUTES}", run="r", rank="0", uuid=uuid, phase="compute")
        signals = ProcessSignals(pid, c.cpu, c.children, c.kids, {"running": c.running, "sleeping": sleeping,
                                                                   "disk": c.disk, "other": 0.0})
        below = c.utilization < T.utilization_target and not c.reported
        for hint, value in (find_hints(signals, T) if below else []):
            names.append(hint.hint)
            expected.append({"labels": f'process:gpu_process_hint:value{{code="{hint.code}",gpu="{gpu}",'
                                       f'hint="{hint.hint}",instance="n1:9445",job="gpu-exporter",pid="{pid}",'
                                       f'uuid="{uuid}"}}', "value": value})
    doc = {"rule_files": [str(Path(__file__).resolve().parents[1] / "prometheus" / "rules" /
                              "gpu-recording.rules.yml")],
           "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
               {"expr": "process:gpu_process_hint:value", "eval_time": "8m", "exp_samples": expected}]}]}
    return doc, names


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promql_hints_equal_find_hints(tmp_path: Path) -> None:
    doc, names = _promtool_doc()
    # every row passes somewhere and fails somewhere; busy GPUs and reporting ones get no hint
    assert names == [MAIN_BUSY, MAIN_BUSY, STORAGE_WAIT, STORAGE_WAIT, WORKERS_BUSY, STORAGE_WAIT]
    path = tmp_path / "evidence-conformance.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([str(shutil.which("promtool")), "test", "rules", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_only_real_gpus_suggest_hostpid_for_hidden_processes() -> None:
    from gpu_exporter.app import polling_collectors
    from gpu_exporter.collectors.evidence import EvidenceCollector

    def evidence(simulated: bool) -> EvidenceCollector:
        return next(c for c in polling_collectors(simulated=simulated) if isinstance(c, EvidenceCollector))

    assert evidence(simulated=False).hint_hidden and not evidence(simulated=True).hint_hidden
    assert not [c for c in polling_collectors({"evidence"}) if isinstance(c, EvidenceCollector)]
