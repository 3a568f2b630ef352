"""Evidence for GPU processes nobody instrumented: /proc readings of real processes, the collector on
simulated GPUs whose process is a real one, and the evidence table (hints.HINTS) row by row."""

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
from gpu_exporter.collectors.base import PollContext
from gpu_exporter.collectors.evidence import MAX_AGE, STATES, Evidence, EvidenceCollector, ProcReader, parse_stat
from gpu_exporter.nvml import Gpu
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.hints import HINTS, MAIN_BUSY, STORAGE_WAIT, WORKERS_BUSY, ProcessSignals, find_hints
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
    assert [h.name for h, _ in find_hints(p, T)] == expected


def test_every_hint_is_m1_with_advice() -> None:
    assert [h.name for h in HINTS] == [STORAGE_WAIT, MAIN_BUSY, WORKERS_BUSY]
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
            names.append(hint.name)
            expected.append({"labels": f'process:gpu_process_hint:value{{code="{hint.code}",gpu="{gpu}",'
                                       f'hint="{hint.name}",instance="n1:9445",job="gpu-exporter",pid="{pid}",'
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


# --- the /proc budget: evidence.cpu_share --------------------------------------------------------

class _FakeProc(ProcReader):
    """Every PID is a sleeping process; each read costs ``cost`` seconds of a fake CPU clock."""

    def __init__(self, cost: float) -> None:
        super().__init__("/nonexistent")
        self.cost, self.cpu = cost, 0.0
        self.read: list[int] = []

    def evidence(self, pid: int) -> Evidence | None:
        self.cpu += self.cost
        self.read.append(pid)
        return Evidence("sleeping", 1.0 + len(self.read), 0.0, 0, None)


def _budgeted(cpu_share: float, cost: float = 0.001) -> tuple[EvidenceCollector, _FakeProc]:
    proc = _FakeProc(cost)
    return EvidenceCollector(proc, cpu_share=cpu_share, cpu_clock=lambda: proc.cpu), proc


def _poll(collector: EvidenceCollector, now: float, pids: dict[str, list[int]]) -> None:
    gpus = [Gpu(i, uuid, None, "NVIDIA H100 80GB HBM3", f"00000000:{i:02X}:00.0", "hopper", False)
            for i, uuid in enumerate(pids)]
    ctx = PollContext(nvml=None, gpus=gpus, now=now,  # type: ignore[arg-type]  # the process lists are given
                      _processes={uuid: dict.fromkeys(p, 0) for uuid, p in pids.items()})
    assert collector.poll(ctx)


def test_reads_keep_to_the_cpu_share_oldest_first_and_every_process_stays_exported() -> None:
    node = {f"GPU-{g}": [1000 * (g + 1) + n for n in range(25)] for g in range(4)}  # 100 processes
    collector, proc = _budgeted(cpu_share=0.02)  # 20 ms of CPU per second; a read costs 1 ms
    _poll(collector, 0.0, node)
    assert len(proc.read) == 100  # new processes are read at once
    last_read: dict[int, float] = dict.fromkeys(proc.read, 0.0)
    for second in range(1, 26):
        proc.read.clear()
        _poll(collector, float(second), node)
        if second <= 5:  # the first poll's 100 ms are paid back first
            assert proc.read == []
        else:
            assert 15 <= len(proc.read) <= 25, len(proc.read)  # about 20 per poll: 2% of a CPU
        oldest = min(last_read.values())
        assert all(last_read[pid] == oldest or second - last_read[pid] >= 4 for pid in proc.read)  # oldest first
        last_read.update(dict.fromkeys(proc.read, float(second)))
        text = collector.exposition.decode()
        assert text.count("gpu_process_cpu_seconds_total{") == 100  # read or not, every process is exported
        assert max(second - t for t in last_read.values()) <= (11 if second < 11 else 6)  # then about every 5 s
    states = collector._counters[("GPU-0", 1000)].states
    assert sum(states.values()) == pytest.approx(last_read[1000])  # the time between reads, none lost
    proc.read.clear()
    node["GPU-3"].append(9999)  # a new process is read at once, whatever the budget
    _poll(collector, 21.0, node)
    assert 9999 in proc.read


def test_a_budget_that_covers_every_process_reads_each_at_every_poll_and_zero_means_no_budget() -> None:
    node = {"GPU-0": list(range(100, 108))}
    for share, cost in ((0.02, 0.0002), (0.0, 0.01)):  # 8 x 0.2 ms within 20 ms; no budget at 10 ms a read
        collector, proc = _budgeted(cpu_share=share, cost=cost)
        for second in range(5):
            proc.read.clear()
            _poll(collector, float(second), node)
            assert sorted(proc.read) == node["GPU-0"]


def test_no_process_waits_longer_than_max_age() -> None:
    node = {"GPU-0": list(range(100, 400))}
    collector, proc = _budgeted(cpu_share=0.001, cost=0.001)  # 1 read per second for 300 processes
    last: dict[int, float] = {}
    for second in range(int(MAX_AGE) + 10):
        proc.read.clear()
        _poll(collector, float(second), node)
        last.update(dict.fromkeys(proc.read, float(second)))
        assert all(second - t <= MAX_AGE for t in last.values())
