"""The HTTP server under attack: a real exporter process on simulated GPUs, spoken to over raw sockets.

Each test replays one attack from issue 13 and asserts on what the server controls (status lines,
headers, what one recv returns, connection and thread counts, the rejection counters), never on
how fast a busy machine happens to be.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gpu_exporter.config import DEFAULTS
from prometheus_client.parser import text_string_to_metric_families

from testbed import exporter_env, free_port, http_get, wait_until

pytestmark = pytest.mark.slow


@dataclass
class Exporter:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def threads(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]

    def scrape(self) -> dict[str, float]:
        """Every sample of /metrics as {'name{label="v"}': value} (labels sorted)."""
        out = {}
        for family in text_string_to_metric_families(http_get(self.url + "/metrics", timeout=10)):
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def rejected(self, reason: str) -> float:
        return self.scrape()[f'gpu_exporter_http_rejected_total{{reason="{reason}"}}']


@contextlib.contextmanager
def exporter(*flags: str, tmp_path: Path, open_files: int | None = None) -> Iterator[Exporter]:
    port = free_port()
    log = tmp_path / f"exporter-{port}.log"

    def limit_open_files() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpu_exporter", "--simulate", "--poll-interval", "0.5",
                                 "--web.listen-address", f"127.0.0.1:{port}", *flags],
                                env=exporter_env(), stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=limit_open_files)
        try:
            running = Exporter(proc, port, log)
            wait_until(lambda: proc.poll() is None and http_get(running.url + "/healthz") == "ok\n", 30,
                       what="the exporter to serve")
            yield running
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response (status, lower-cased headers, body) delimited by Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, headers = parse_head(head)
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed inside the body")
        body += chunk
    assert len(body) == length, "more bytes than Content-Length: a second response?"
    return status, headers, body


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closes the connection (EOF or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exporter]:
    with exporter("--web.read-timeout", "1", "--web.idle-timeout", "2",
                  tmp_path=tmp_path_factory.mktemp("http")) as running:
        yield running


def test_idle_connections_cannot_starve_scrapes_or_pile_up_threads(tmp_path: Path) -> None:
    limit = DEFAULTS.web_max_connections
    with exporter(tmp_path=tmp_path) as running:
        baseline = running.threads()
        idle = [connect(running.port) for _ in range(limit + 72)]
        try:
            text = http_get(running.url + "/metrics", timeout=10)
            assert "gpu_info" in text
            # Closed connections' threads end as soon as they are scheduled: wait for that, not for luck.
            wait_until(lambda: running.threads() <= baseline + limit + 1, 10, what="threads to stay bounded")
            assert running.scrape()["gpu_exporter_http_connections"] <= limit
            # Room was made by closing the longest-idle connections, not by refusing anyone.
            assert running.rejected("max_connections") == 0
            assert closed_by_server(idle[0], within=10)
        finally:
            for sock in idle:
                sock.close()


def test_excess_requests_get_503_counted_and_logged(tmp_path: Path) -> None:
    with exporter("--web.max-requests", "1", "--web.read-timeout", "60", tmp_path=tmp_path) as running:
        slow: list[socket.socket] = []

        def refused() -> bool:
            # A push whose body never finishes holds the only request slot until the read timeout
            # (unless a scrape held the slot when it came: then it got the 503, and we try again).
            for sock in slow:
                sock.close()
            slow[:] = [connect(running.port)]
            slow[0].sendall(b"POST /api/v1/training HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n{")
            time.sleep(0.5)
            return _status(running.url + "/metrics")[0] == 503

        wait_until(refused, 60, what="a 503 while the slot is held")
        assert _status(running.url + "/healthz") == (200, "ok\n")  # probes are exempt
        slow[0].close()
        wait_until(lambda: running.rejected("max_requests") >= 1, 15, what="the slot to come free")
        assert "web.max_requests" in running.log.read_text()


def _status(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()


def test_a_request_that_never_finishes_is_cut_at_the_read_timeout(shared: Exporter) -> None:
    before = shared.rejected("read_timeout")
    sock = connect(shared.port)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
    assert closed_by_server(sock, within=15)
    sock.close()
    assert shared.rejected("read_timeout") == before + 1


def test_kept_alive_connections_close_after_the_idle_timeout(shared: Exporter) -> None:
    sock = connect(shared.port)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock)[0] == 200
    assert closed_by_server(sock, within=15)
    sock.close()


def test_each_response_is_one_write(shared: Exporter) -> None:
    """Headers and body in one segment: a single recv holds the whole response, every time."""
    with connect(shared.port) as sock:
        for _ in range(20):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = sock.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            assert parse_head(head)[0] == 200 and body == b"ok\n", data


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("OPTIONS", "/metrics", "GET, HEAD"), ("PUT", "/metrics", "GET, HEAD"), ("DELETE", "/", "GET, HEAD"),
    ("POST", "/metrics", "GET, HEAD"), ("GET", "/api/v1/training", "POST"), ("PATCH", "/api/v1/training", "POST"),
])
def test_other_methods_get_405_with_allow(shared: Exporter, method: str, path: str, allow: str) -> None:
    with connect(shared.port) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        status, headers, body = read_response(sock)
    assert status == 405 and headers["allow"] == allow
    assert headers["content-type"].startswith("text/plain") and b"<" not in body


@pytest.mark.parametrize(("request_line", "length"), [
    ("POST /api/v1/training", b"\xb9"),  # SUPERSCRIPT ONE in Latin-1: str.isdigit() says yes
    ("POST /api/v1/training", b"1" * 4301),  # more digits than int() converts
    ("GET /metrics", b"12abc"),
    ("GET /metrics", b"-1"),
])
def test_bad_content_length_is_400_and_counted(shared: Exporter, request_line: str, length: bytes) -> None:
    before = shared.rejected("bad_request")
    with connect(shared.port) as sock:
        sock.sendall(request_line.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}")
        status, headers, body = read_response(sock)
        assert closed_by_server(sock, within=10)
    assert status == 400 and headers["connection"] == "close" and b"Content-Length" in body
    assert shared.rejected("bad_request") == before + 1


def test_transfer_encoding_with_content_length_cannot_smuggle_a_request(shared: Exporter) -> None:
    before = shared.rejected("bad_request")
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    chunked = b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n"
    with connect(shared.port) as sock:
        sock.sendall(b"POST /api/v1/training HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunked)
        status, _, body = read_response(sock)
        assert closed_by_server(sock, within=10)  # and no second response came before the close
    assert status == 400 and b"Transfer-Encoding" in body
    assert shared.rejected("bad_request") == before + 1


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),  # a 70 KB request line
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),  # a 70 KB header
    (b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n", 431),
])
def test_an_oversized_request_is_answered_counted_and_logged(shared: Exporter, request_bytes: bytes,
                                                               status: int) -> None:
    """Too long a request line gets 414, too large headers 431: an answer the client can read, not a reset."""
    before = shared.rejected("too_large")
    with connect(shared.port) as sock:
        sock.sendall(request_bytes)
        answer, headers, _ = read_response(sock)
        assert closed_by_server(sock, within=10)
    assert answer == status and headers["connection"] == "close"
    assert shared.rejected("too_large") == before + 1


def test_an_oversized_request_line_is_logged(tmp_path: Path) -> None:
    """Its own exporter: each reason is logged at most once per 10 s, so the shared one may stay silent."""
    with exporter(tmp_path=tmp_path) as running, connect(running.port) as sock:
        sock.sendall(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 414
        assert running.rejected("too_large") == 1
        assert "answered 414 to 127.0.0.1: the request line is longer than 65536 bytes" in running.log.read_text()


def test_metrics_are_gzipped_when_the_scraper_accepts_it(shared: Exporter) -> None:
    with connect(shared.port) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n")
        status, headers, body = read_response(sock)
    assert status == 200 and headers["content-encoding"] == "gzip"
    names = {f.name for f in text_string_to_metric_families(gzip.decompress(body).decode())}
    assert {"gpu_info", "gpu_exporter_http_rejected", "process_resident_memory_bytes"} <= names
    plain = http_get(shared.url + "/metrics")
    assert len(body) * 3 < len(plain.encode())


def test_listen_backlog_is_configurable(tmp_path: Path) -> None:
    def backlog(port: int) -> int:
        out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
        return int(out.split()[2])  # Send-Q of a listening socket is its backlog

    with exporter(tmp_path=tmp_path) as running:
        assert backlog(running.port) == DEFAULTS.web_listen_backlog >= 128
    with exporter("--web.listen-backlog", "200", tmp_path=tmp_path) as running:
        assert backlog(running.port) == 200


def test_refused_connections_are_counted_and_logged(tmp_path: Path) -> None:
    """When every connection is busy mid-request, a new one is closed at once: counted and logged."""
    with exporter("--web.max-connections", "2", "--web.read-timeout", "60", tmp_path=tmp_path) as running:
        busy: list[socket.socket] = []

        def refused() -> bool:
            for sock in list(busy):  # one the server closed to make room before it got busy
                if select.select([sock], [], [], 0)[0]:
                    busy.remove(sock)
                    sock.close()
            while len(busy) < 2:
                busy.append(connect(running.port))
                busy[-1].sendall(b"GET /metrics HTTP/1.1\r\n")  # busy: a request has begun
            time.sleep(0.5)
            with connect(running.port) as extra:
                return closed_by_server(extra, within=2)

        wait_until(refused, 60, what="a refused connection")
        assert "web.max_connections" in running.log.read_text()
        for sock in busy:
            sock.close()
        wait_until(lambda: running.rejected("max_connections") >= 1, 15, what="the count")


def test_at_the_open_file_limit_the_server_frees_descriptors_logs_and_does_not_spin(tmp_path: Path) -> None:
    """A max_connections above the process's open-file limit: accept fails with EMFILE."""
    with exporter("--web.max-connections", "1000", tmp_path=tmp_path, open_files=96) as running:
        idle = [connect(running.port) for _ in range(150)]
        try:
            # Each failed accept closes the longest-idle connection, so a scrape gets in.
            text = wait_until(lambda: http_get(running.url + "/metrics", timeout=5), 30, what="a scrape")
            assert "open-file limit" in running.log.read_text()
            # That scrape came while the backlog still took every freed descriptor, yet process_* are whole.
            process = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name.startswith("process_")}
            assert {"process_cpu_seconds_total", "process_open_fds", "process_max_fds",
                    "process_resident_memory_bytes"} <= process.keys(), process
            cpu_before, wall_before = running.scrape()["process_cpu_seconds_total"], time.monotonic()
            time.sleep(4)
            cpu = running.scrape()["process_cpu_seconds_total"] - cpu_before
            assert cpu < 0.25 * (time.monotonic() - wall_before), f"{cpu:.2f} s of CPU in 4 s: the accept loop spins"
            assert running.rejected("open_files") >= 1
        finally:
            for sock in idle:
                sock.close()


def _server_has_read(sock: socket.socket) -> bool:
    """True when the server's end of ``sock`` has nothing unread (its thread took what we sent)."""
    client_port, server_port = sock.getsockname()[1], sock.getpeername()[1]
    out = subprocess.run(["ss", "-tnH", "state", "established",
                          f"( sport = :{server_port} and dport = :{client_port} )"],
                         capture_output=True, text=True, check=True).stdout.split()
    return bool(out) and out[0] == "0"  # Recv-Q


def test_at_the_open_file_limit_a_scrape_still_gets_every_process_metric(tmp_path: Path) -> None:
    """Every descriptor held by connections mid-request (none idle, so none to close): a scrape whose request
    began before the limit was reached still gets the process_* families, which need /proc files."""
    limit = 64
    with exporter("--web.max-connections", "1000", "--web.read-timeout", "120", tmp_path=tmp_path,
                  open_files=limit) as running, connect(running.port) as scrape:
        scrape.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # busy: the blank line comes at the limit
        wait_until(lambda: _server_has_read(scrape), 30, what="the server to read the request's start")
        time.sleep(0.2)  # from the read to marking the connection busy is a few statements
        busy: list[socket.socket] = []
        try:
            def at_limit() -> bool:  # one more connection mid-request, until accept fails for want of a descriptor
                busy.append(connect(running.port))
                busy[-1].sendall(b"GET /metrics HTTP/1.1\r\n")
                return "open-file limit" in running.log.read_text()

            wait_until(at_limit, 60, interval=0.05, what="every descriptor to be taken")
            scrape.sendall(b"\r\n")
            status, _, body = read_response(scrape)
        finally:
            for sock in busy:
                sock.close()
    assert status == 200
    process = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples
               if s.name.startswith("process_")}
    assert {"process_cpu_seconds_total", "process_open_fds", "process_max_fds", "process_resident_memory_bytes",
            "process_start_time_seconds"} <= process.keys(), process
    assert process["process_max_fds"] == limit and process["process_open_fds"] >= limit - 2, process


def test_page_routes_are_the_status_pages() -> None:
    """The server's list of page routes (for 405 answers) is the status page's own: the page and its JSON."""
    from gpu_exporter import server, status_page

    assert tuple(server.PAGE_PATHS) == ("/", status_page.STATUS_PATH)
