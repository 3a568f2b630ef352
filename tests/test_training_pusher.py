"""The pusher against a stub exporter on 127.0.0.1: down, slow, then up loses nothing; forks never report."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from time import perf_counter

import pytest
import torch
from gpu_exporter import training
from gpu_exporter.ingest import IngestSettings, TrainingStore
from gpu_exporter.training.protocol import INGEST_PATH
from pythons import pythons
from torch.utils.data import DataLoader, Dataset

from testbed import free_port, wait_until

EXPORTER = Path(__file__).resolve().parents[1] / "exporter"


class StubExporter:
    """A minimal ingest endpoint: a real TrainingStore behind an HTTP server, optionally slow."""

    def __init__(self, port: int, delay: float = 0.0, token: str | None = None,
                 tmp: str | None = None) -> None:
        settings = IngestSettings()
        if token is not None and tmp is not None:
            path = os.path.join(tmp, "token")
            with open(path, "w") as fh:
                fh.write(token + "\n")
            settings = IngestSettings(token_file=path)
        self.store = TrainingStore(settings)
        self.bodies: list[dict[str, object]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                time.sleep(delay)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, reason = stub.store.handle_push(body, self.headers.get("Content-Type"),
                                                        self.headers.get("Authorization"))
                if status < 300:
                    stub.bodies.append(json.loads(body))
                with contextlib.suppress(OSError):  # the client may have timed out already
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(reason.encode())

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def stub_exporter(port: int, delay: float = 0.0, token: str | None = None,
                  tmp: str | None = None) -> Iterator[StubExporter]:
    stub = StubExporter(port, delay, token, tmp)
    try:
        yield stub
    finally:
        stub.close()


def train_for(run: training.Run, seconds: float) -> float:
    """Run a fake loop for ``seconds``; return the slowest phase enter+exit seen (training must not block)."""
    slowest = 0.0
    compute = run.phase("compute")
    end = perf_counter() + seconds
    while perf_counter() < end:
        t = perf_counter()
        with compute:
            pass
        slowest = max(slowest, perf_counter() - t)
        time.sleep(0.002)
        run.step(samples=4)
    return slowest


def test_exporter_down_then_slow_then_up_loses_nothing() -> None:
    port = free_port()
    run = training.start("pusher-test", url=f"http://127.0.0.1:{port}", uuid="GPU-stub", push_interval=0.1,
                         timeout=0.2)
    pusher = run.pusher
    assert pusher is not None
    try:
        slowest = train_for(run, 0.6)  # nothing listens on the port
        with stub_exporter(port, delay=0.5):  # answers only after the client gave up
            slowest = max(slowest, train_for(run, 0.6))
        assert pusher.pushes_ok == 0
        with stub_exporter(port) as up:
            wait_until(lambda: up.bodies, 5, what="a push to the exporter that is up")
            slowest = max(slowest, train_for(run, 0.3))
            run.close()
            wall = perf_counter() - run._start
            final = up.bodies[-1]
        assert run.closed
        assert final["finished"] is True
        assert final["steps"] == run.steps and final["samples"] == 4 * run.steps
        seconds = final["phases"]
        assert isinstance(seconds, dict)
        assert sum(seconds.values()) == pytest.approx(wall, abs=0.05)
        assert seconds["compute"] > 0
        assert slowest < 0.05, f"a phase change took {slowest * 1000:.1f} ms while the exporter was unreachable"
    finally:
        run.close()


def test_bearer_token_is_sent(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("GPU_EXPORTER_TOKEN", "s3cret")
    monkeypatch.setenv("GPU_EXPORTER_URL", f"http://127.0.0.1:{port}/")
    with stub_exporter(port, token="s3cret", tmp=str(tmp_path)) as stub:
        run = training.start("token-test", uuid="", push_interval=0.1)
        wait_until(lambda: stub.bodies, 5, what="an authorised push")
        run.close()
        samples = list(stub.store.collect())
    outcomes = {s.labels["outcome"]: s.value for m in samples if m.name == "gpu_exporter_ingest_requests"
                for s in m.samples}
    assert outcomes["unauthorized"] == 0 and outcomes["accepted"] >= 2


def test_a_url_without_scheme_works_as_in_the_cli(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU_EXPORTER_URL=HOST:PORT, which `gpu-exporter query --url` takes, reaches the exporter too."""
    port = free_port()
    monkeypatch.setenv("GPU_EXPORTER_URL", f"localhost:{port}")
    with stub_exporter(port, tmp=str(tmp_path)) as stub:
        run = training.start("url-test", uuid="", push_interval=0.1)
        wait_until(lambda: stub.bodies, 5, what="a push to localhost:PORT")
        run.close()


@pytest.mark.parametrize(("text", "accepted"), [
    ("localhost:1", True), ("127.0.0.1:1/", True), ("http://127.0.0.1:1", True), ("https://localhost", True),
    ("http://[::1]:1", True), ("ftp://node7:21", False), ("node7:port", False), ("http://", False),
    ("node7:99999", False)])
def test_library_and_cli_take_the_same_urls(text: str, accepted: bool) -> None:
    """One rule (training.protocol.normalize_url): training.start and the CLI accept and refuse the same URLs."""
    from gpu_exporter.commands.client_http import MetricsError, normalize_url

    cli: str | None = None
    cli_error = ""
    try:
        cli = normalize_url(text, "", "exporter")
    except MetricsError as problem:
        cli_error = str(problem)
    if accepted:
        run = training.start("url-test", url=text, uuid="", push_interval=60)
        try:
            assert run.pusher is not None and cli is not None
            assert run.pusher.endpoint == cli + INGEST_PATH
        finally:
            run.close()
    else:
        assert cli is None
        with pytest.raises(ValueError) as err:
            training.start("url-test", url=text)
        assert str(err.value) == f"training.start: {cli_error}"


class _WorkerProbe(Dataset[torch.Tensor]):
    """Each item is made in a forked worker, which tries to report through the inherited run."""

    def __init__(self, run: training.Run) -> None:
        self.run = run

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        with self.run.phase("data"):
            pass
        closed_before = self.run.closed
        self.run.close()  # what atexit would do in a child that exits normally
        return torch.tensor([float(os.getpid()), float(closed_before)])


def test_forked_dataloader_workers_never_report_as_the_parent() -> None:
    port = free_port()
    with stub_exporter(port) as stub:
        run = training.start("fork-test", url=f"http://127.0.0.1:{port}", uuid="", push_interval=0.05)
        loader = DataLoader(_WorkerProbe(run), batch_size=2, num_workers=2,
                            multiprocessing_context="fork")
        rows = torch.cat([batch for batch in run.data(loader)])
        time.sleep(0.2)  # give a misbehaving child time to push
        assert not run.closed
        run.close()
    worker_pids = {int(pid) for pid in rows[:, 0].tolist()}
    assert os.getpid() not in worker_pids and len(worker_pids) >= 1
    assert rows[:, 1].tolist() == [1.0] * 8, "the run was still open in a forked worker"
    assert {body["pid"] for body in stub.bodies} == {os.getpid()}
    assert stub.bodies[-1]["finished"] is True


EXITING_JOB = """
import sys, time
from gpu_exporter import training
run = training.start("exits", url=sys.argv[1], uuid="")
with run.phase("compute"):
    time.sleep(0.3)
"""  # never closes its run: the final push happens at interpreter exit


def test_the_final_push_at_exit_arrives_on_every_python_here(tmp_path: Path) -> None:
    """Python 3.12 starts no thread at interpreter shutdown; the final push (from atexit) must not need one."""
    found = {(3, 10): Path(sys.executable), **{v: p for v, p in pythons().items() if v >= (3, 10)}}
    for version, python in sorted(found.items()):
        port = free_port()
        with stub_exporter(port) as stub:
            job = subprocess.run([str(python), "-c", EXITING_JOB, f"http://127.0.0.1:{port}"], capture_output=True,
                                 text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(EXPORTER)})
        assert job.returncode == 0 and "Traceback" not in job.stderr, (version, job.stderr[-2000:])
        finished = [body for body in stub.bodies if body.get("finished")]
        assert len(finished) == 1, (version, stub.bodies)
        phases = finished[0]["phases"]
        assert isinstance(phases, dict) and phases["compute"] >= 0.3, (version, phases)
