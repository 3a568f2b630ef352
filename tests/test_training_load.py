"""The training library under a saturated CPU: snapshots and pushes never go down; close() is bounded.

Each test runs beside CPU-burning processes (one per core, killed when the test ends) and
with the interpreter's thread switch interval at 1 µs, so the training thread is preempted
between almost any two bytecodes. Before the seqlock fix (the clock read before the change
was marked in progress) the reader saw a phase value go down thousands of times a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from gpu_exporter import training
from gpu_exporter.ingest import IngestSettings, TrainingStore
from gpu_exporter.training import Run
from gpu_exporter.training.pusher import Pusher

BURN_SECONDS = 30.0
"""Upper bound on a burner's life, should the test process die before killing it."""


@contextlib.contextmanager
def saturated_cpu(switch_interval: float = 1e-6) -> Iterator[None]:
    """One CPU-burning process per core, and a tiny GIL switch interval, for the ``with`` body."""
    code = f"import time\nend = time.monotonic() + {BURN_SECONDS}\nwhile time.monotonic() < end: pass"
    burners = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 2)]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def _train(run: Run, stop: threading.Event) -> None:
    phases = [run.phase(p) for p in ("data", "compute", "metrics")]
    while not stop.is_set():
        for phase in phases:
            with phase:
                pass
        run.step(samples=1)


@contextlib.contextmanager
def training_thread(run: Run) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=_train, args=(run, stop))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@pytest.mark.slow  # CPU burners, seconds of wall time
def test_snapshots_never_go_down_on_a_saturated_cpu() -> None:
    run = Run("race-load", uuid="")
    reads = decreases = 0
    previous: dict[str, float] = {}
    with saturated_cpu(), training_thread(run):
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            now = run.phase_seconds()
            reads += 1
            decreases += sum(now[name] < value for name, value in previous.items())
            previous = now
    assert run.steps > 100 and reads > 1000, (run.steps, reads)
    assert decreases == 0, f"{decreases} phase values went down in {reads} reads"


class _Recorder:
    """A real TrainingStore behind an HTTP server that keeps every body it accepted, in order."""

    def __init__(self) -> None:
        self.store = TrainingStore(IngestSettings())
        self.bodies: list[dict[str, object]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, reason = recorder.store.handle_push(body, self.headers.get("Content-Type"), None)
                if status < 300:
                    recorder.bodies.append(json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", str(len(reason)))
                self.end_headers()
                self.wfile.write(reason.encode())

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def outcomes(self) -> dict[str, float]:
        return {s.labels["outcome"]: s.value for m in self.store.collect()
                if m.name == "gpu_exporter_ingest_requests" for s in m.samples}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    rec = _Recorder()
    try:
        yield rec
    finally:
        rec.close()


def _assert_never_down(bodies: list[dict[str, object]]) -> None:
    previous: dict[str, float] = {}
    for body in bodies:
        phases = body["phases"]
        assert isinstance(phases, dict)
        for name, value in previous.items():
            assert phases[name] >= value, (name, value, phases[name])
        previous = phases


@pytest.mark.slow  # CPU burners, seconds of wall time
def test_pushes_never_go_down_on_a_saturated_cpu(recorder: _Recorder) -> None:
    run = training.start("push-load", url=recorder.url, uuid="", push_interval=0.005, timeout=5.0)
    with saturated_cpu(), training_thread(run):
        time.sleep(2.0)
    run.close()
    outcomes = recorder.outcomes()
    assert outcomes["decreasing_counter"] == 0, outcomes
    assert outcomes["accepted"] >= 10 and recorder.bodies[-1]["finished"] is True, outcomes
    _assert_never_down(recorder.bodies)


def test_pusher_never_sends_a_phase_value_lower_than_before(recorder: _Recorder) -> None:
    """Whatever the run reports (here a reading that jumps back), what is sent only grows."""
    run = Run("jitter", uuid="")
    readings = iter([{"other": 1.0, "compute": 5.0}, {"other": 2.0, "compute": 4.0},
                     {"other": 0.5, "compute": 6.0}, {"other": 3.0, "compute": 6.5}])
    run.phase_seconds = lambda finished=False: dict(next(readings))  # type: ignore[method-assign]
    pusher = Pusher(run, recorder.url + "/api/v1/training", None, interval=60, timeout=5)
    assert [pusher.push() for _ in range(4)] == [True] * 4
    sent = [body["phases"] for body in recorder.bodies]
    assert sent == [{"other": 1.0, "compute": 5.0}, {"other": 2.0, "compute": 5.0},
                    {"other": 2.0, "compute": 6.0}, {"other": 3.0, "compute": 6.5}]
    assert recorder.outcomes()["decreasing_counter"] == 0


@contextlib.contextmanager
def trickling_server(bytes_per_second: float) -> Iterator[str]:
    """A server that reads the request, then answers one byte at a time, ``bytes_per_second``."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    reply = b"HTTP/1.1 202 Accepted\r\nContent-Length: 8\r\n\r\naccepted"

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.5)
            with contextlib.suppress(OSError):
                conn.recv(65536)
                for i in range(len(reply)):
                    if stop.wait(1 / bytes_per_second):
                        return
                    conn.sendall(reply[i:i + 1])

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.mark.slow  # seconds of wall time
@pytest.mark.parametrize("in_flight", [False, True], ids=["idle", "push-in-flight"])
def test_close_is_bounded_against_a_server_that_answers_one_byte_per_second(in_flight: bool) -> None:
    timeout = 2.0  # > 1 s: every read gets its byte in time, so only a total deadline ends the push
    with trickling_server(bytes_per_second=1.0) as url:
        run = training.start("trickle", url=url, uuid="", push_interval=0.05 if in_flight else 3600,
                             timeout=timeout)
        time.sleep(0.3)  # the first push (at start) is now stuck reading the trickled answer
        t0 = time.monotonic()
        run.close()
        took = time.monotonic() - t0
    assert run.closed
    assert took <= 2 * timeout + 0.5, f"close() took {took:.2f} s with timeout={timeout} s"


@pytest.mark.slow  # seconds of wall time
def test_close_is_bounded_against_a_server_that_never_answers() -> None:
    listener = socket.create_server(("127.0.0.1", 0), backlog=1)  # accepts connections, never reads
    with listener:
        run = training.start("silent", url=f"http://127.0.0.1:{listener.getsockname()[1]}", uuid="",
                             push_interval=3600, timeout=0.5)
        t0 = time.monotonic()
        run.close()
        took = time.monotonic() - t0
    assert took <= 2 * 0.5 + 0.5, f"close() took {took:.2f} s"


def test_the_server_routes_the_path_the_library_pushes_to() -> None:
    from gpu_exporter import server
    from gpu_exporter.training import protocol

    assert server.INGEST_PATH == protocol.INGEST_PATH
