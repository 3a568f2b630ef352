"""HTTP: ``/metrics``, ``/healthz``, ``/readyz``, and ``POST /api/v1/training`` (snapshot ingest).

The server only reads what the poller and the other collectors have published; it never
calls NVML. Basic auth and TLS come from an exporter-toolkit web config file; the health
endpoints and the ingest endpoint (which has its own bearer token) are exempt from basic auth
so that orchestrator probes and training jobs need no scrape credentials.

The node network is untrusted, so every resource a client can hold is bounded (``web.*`` keys):

- connections (``max_connections``; each holds a thread): at the bound the longest-idle
  connection is closed to make room; when none is idle the new connection is closed at once;
- requests served at once (``max_requests``): excess ones get 503; health probes are exempt;
- time: a request must arrive whole within ``read_timeout`` of its first byte, and a
  kept-alive connection may wait ``idle_timeout`` for its next request;
- framing: Content-Length must be plain ASCII digits, and a request with both
  Transfer-Encoding and Content-Length gets 400, so no body can pass as a second request;
- size: a request line over 64 KiB gets 414, a header line over 64 KiB or over 100 headers 431.

Every refusal is counted in ``gpu_exporter_http_rejected_total{reason}`` and logged (at most
once per 10 s per reason); the connections, slots and deadlines are kept by
gpu_exporter.server_limits, the request handler here reads and answers. Each response leaves
in one write, so Nagle's algorithm never holds a body back behind its headers on a kept-alive
connection.

Example::

    server = MetricsServer(("127.0.0.1", 9445), sources, ready=lambda: (True, "ok"))
    server.serve_forever()
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Protocol

from gpu_exporter.config import DEFAULTS
from gpu_exporter.exposition import CONTENT_TYPE_LATEST, Body, ScrapeForecast, Source
from gpu_exporter.server_limits import LimitedServer
from gpu_exporter.server_limits import Limits as Limits  # re-exported for the app
from gpu_exporter.training.protocol import INGEST_PATH as INGEST_PATH  # one definition, shared with the library

if TYPE_CHECKING:
    from gpu_exporter.status_page import StatusPage

log = logging.getLogger(__name__)

HEALTH_PATHS = ("/healthz", "/readyz")
PAGE_PATHS = ("/", "/api/v1/status")
"""The status page and its JSON (``/``, status_page.STATUS_PATH), named here so the page loads only when asked."""
_MAX_LENGTH_DIGITS = 18  # 1 EB; more digits is an attack, not a body
_DISCARD_LIMIT = 65536  # an unexpected body up to this size is read and dropped to keep the connection
_MAX_LINE = 65536  # request line and each header line, as http.client's parse_headers limits header lines
_LINGER_BYTES, _LINGER_SECONDS = 1 << 20, 2.0  # what is read and dropped after refusing an oversized request


class Ingest(Protocol):
    """The training snapshot store (gpu_exporter.ingest.TrainingStore)."""

    @property
    def max_body_bytes(self) -> int: ...

    def handle_push(self, body: bytes, content_type: str | None, authorization: str | None) -> tuple[int, str]: ...

    def count_rejection(self, reason: str) -> None: ...


class AddressInUse(RuntimeError):
    """The listen address is taken or cannot be bound; the message says how to fix it."""


class MetricsServer(LimitedServer):
    """A threading HTTP(S) server for the exporter's endpoints; also a collector of its own counters (LimitedServer)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], sources: Sequence[Source], *,
                 ready: Callable[[], tuple[bool, str]], telemetry_path: str = "/metrics",
                 ingest: Ingest | None = None, ssl_context: ssl.SSLContext | None = None,
                 check_auth: Callable[[str | None], bool] | None = None,
                 on_auth_failure: Callable[[], None] | None = None,
                 headers: dict[str, str] | None = None, limits: Limits | None = None,
                 accept_guard: contextlib.AbstractContextManager[Any] | None = None) -> None:
        live = [s for s in sources if getattr(s, "live", False)]  # stay last (exposition.Body)
        self.sources: list[Source] = [*(s for s in sources if s not in live), self, *live]
        self.body = Body(self.sources)
        """The /metrics body; ``body.prepare()`` renders ahead of an expected scrape."""
        self.scrapes = ScrapeForecast()
        """When the next scrape is due (the poller prepares the body ahead of it)."""
        self.extra_headers = dict(headers or {})
        self.ready = ready
        self.telemetry_path = telemetry_path
        self.get_paths = {telemetry_path, *HEALTH_PATHS, *PAGE_PATHS}
        self.ingest = ingest
        self.check_auth = check_auth
        self.on_auth_failure = on_auth_failure
        self._page: StatusPage | None = None
        self._page_lock = threading.Lock()
        host, port = address
        ipv6 = ":" in host or (host == "" and socket.has_ipv6)
        self.address_family = socket.AF_INET6 if ipv6 else socket.AF_INET
        try:
            super().__init__((host, port), _Handler, limits=limits or Limits.from_config(DEFAULTS),
                             accept_guard=accept_guard or threading.Lock())
        except OSError as err:
            why = ("the address is already in use; stop the other process or" if err.errno == errno.EADDRINUSE
                   else f"{err.strerror};")
            raise AddressInUse(f"cannot listen on {host or '*'}:{port}: {why} choose another with "
                               "--web.listen-address") from None
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def status_page(self) -> StatusPage:
        """The status page of this server, created on first use (serving loads none of it until then)."""
        with self._page_lock:
            if self._page is None:
                from gpu_exporter.status_page import StatusPage

                self._page = StatusPage(lambda: [family for source in self.sources for family in source.collect()],
                                        metrics_path=self.telemetry_path)
            return self._page

    def record_page(self) -> None:
        """After a poll: the status page, once viewed, keeps a reading (its window stays the last seconds)."""
        page = self._page
        if page is not None:
            page.record()

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    server_version = "gpu-exporter"
    _served = False  # a request came before on this connection: the next may wait idle_timeout
    _receiving = False  # the request is still being read: a timeout now is a read timeout
    _body_length: int | None = 0  # None: a Transfer-Encoding body of unknown length

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # -- one request ----------------------------------------------------------------------------

    def handle_one_request(self) -> None:
        limits, sock = self.server.limits, self.request
        self.close_connection = True
        self.connection.settimeout(limits.idle_timeout if self._served else limits.read_timeout)
        try:
            if not self.rfile.peek(1):  # type: ignore[attr-defined]
                return
        except OSError:  # timeout, reset, TLS handshake failure, or closed to make room
            return
        if not self.server.phase(sock, idle=False, timeout=limits.read_timeout):
            return
        self.connection.settimeout(limits.read_timeout)
        self._served = self._receiving = True
        self.command = self.requestline = self.request_version = ""  # what an error before parse_request reads
        try:
            self.raw_requestline = self.rfile.readline(_MAX_LINE + 1)
            if len(self.raw_requestline) > _MAX_LINE:
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG, f"the request line is longer than {_MAX_LINE} "
                                                                 "bytes")
                return
            if self.server.expired(sock) or not self.raw_requestline.endswith(b"\n"):
                return
            if not self.parse_request() or self.server.expired(sock):
                return
            self._dispatch()
        except TimeoutError:
            if self._receiving:  # else the client stopped taking the response
                self.server.timed_out(sock)
            self.close_connection = True
        finally:
            if not self.close_connection:
                self.close_connection = not self.server.phase(sock, idle=True)

    def _dispatch(self) -> None:
        problem = self._framing()
        if problem is not None:
            self.send_error(HTTPStatus.BAD_REQUEST, problem)
            return
        if self.command != "POST":
            self._drop_body()
        path = self.route = self.path.split("?", 1)[0]
        allowed = ("POST",) if path == INGEST_PATH else ("GET", "HEAD")
        known = path == INGEST_PATH or path in self.server.get_paths  # other paths answer 404 to GET and POST
        if self.command not in allowed and (known or self.command not in ("GET", "HEAD", "POST")):
            self._drop_body()
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed here\n".encode(),
                       headers={"Allow": ", ".join(allowed)})
            return
        if path in HEALTH_PATHS:
            self.do_GET()
            return
        if not self.server.slots.acquire(blocking=False):
            self.server.reject("max_requests", f"answered 503 to {self.client_address[0]}: "
                                               f"{self.server.limits.max_requests} requests in flight "
                                               "(web.max_requests)")
            self._drop_body()
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many requests in flight; retry later\n",
                       headers={"Retry-After": "1"})
            return
        try:
            (self.do_POST if self.command == "POST" else self.do_GET)()
        finally:
            self.server.slots.release()

    def _framing(self) -> str | None:
        """Check how the body is delimited; a message for a 400, or None (``_body_length`` is set)."""
        lengths = self.headers.get_all("Content-Length") or []
        if self.headers.get_all("Transfer-Encoding"):
            if lengths:
                return "a request must not carry both Transfer-Encoding and Content-Length"
            self._body_length = None
            return None
        if len(lengths) > 1:
            return "a request must carry at most one Content-Length header"
        text = lengths[0].strip() if lengths else "0"
        if not (text.isascii() and text.isdigit()) or len(text) > _MAX_LENGTH_DIGITS:
            return f"Content-Length must be at most {_MAX_LENGTH_DIGITS} ASCII digits"
        self._body_length = int(text)
        return None

    def _drop_body(self) -> None:
        """Read and drop a body the route does not use; close the connection when that is unsafe."""
        length = self._body_length
        if length is None or length > _DISCARD_LIMIT:
            self.close_connection = True
        elif length:
            self.rfile.read(length)
        self._body_length = 0
        self._received()

    def _received(self) -> None:
        """The whole request is in: its read deadline no longer applies."""
        self._receiving = False
        self.server.phase(self.request, idle=False)

    # -- responses ------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        """Write status line, headers and body with one write."""
        code = HTTPStatus(status)
        lines = [f"HTTP/1.1 {code.value} {code.phrase}", f"Server: {self.server_version}",
                 f"Date: {self.date_time_string()}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in {**self.server.extra_headers, **(headers or {})}.items()]
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + body)
        self.log_request(code.value, len(body))

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """A one-line text error, counted as ``too_large`` (414, 431) or ``bad_request``; the connection closes."""
        self.close_connection = True
        status = HTTPStatus(code)
        text = message or status.phrase
        oversized = status in (HTTPStatus.REQUEST_URI_TOO_LONG, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
        if 400 <= status < 500:
            self.server.reject("too_large" if oversized else "bad_request",
                               f"answered {status.value} to {self.client_address[0]}: {text}")
        self._send(status, text.encode("utf-8", "replace") + b"\n")
        if oversized:
            self._linger()

    def _linger(self) -> None:
        """Half-close, then drop what the client is still sending (bounded in bytes and time).

        The rest of an oversized request still sits unread; closing on unread data sends a reset,
        which can destroy the error response before the client has read it.
        """
        sock = self.connection
        deadline = time.monotonic() + _LINGER_SECONDS
        with contextlib.suppress(OSError, ValueError):
            socket.socket.shutdown(sock, socket.SHUT_WR)  # the plain socket's, also for TLS
            dropped = 0
            while dropped < _LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = self.rfile.read1(65536)
                if not chunk:
                    break
                dropped += len(chunk)

    def _authorized(self) -> bool:
        check = self.server.check_auth
        if check is None or check(self.headers.get("Authorization")):
            return True
        if self.server.on_auth_failure is not None:
            self.server.on_auth_failure()
        self.server.body.invalidate()  # a body rendered ahead would not show this failure
        self._send(HTTPStatus.UNAUTHORIZED, b"Unauthorized\n",
                   headers={"WWW-Authenticate": 'Basic realm="gpu-exporter"'})
        return False

    # -- routes ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        if self.route == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n")
        elif self.route == "/readyz":
            ok, reason = self.server.ready()
            self._send(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, reason.encode() + b"\n")
        elif not self._authorized():
            return
        elif self.route == self.server.telemetry_path:
            self.server.scrapes.arrived(self.client_address[0])
            body, encoding = self.server.body.encode(self.headers.get("Accept-Encoding"))
            headers = {"Vary": "Accept-Encoding", **({"Content-Encoding": encoding} if encoding is not None else {})}
            self._send(HTTPStatus.OK, body, CONTENT_TYPE_LATEST, headers)
        elif self.route in PAGE_PATHS:
            body, content_type = self.server.status_page().respond(self.route)
            self._send(HTTPStatus.OK, body, content_type, {"Cache-Control": "no-store"})
        else:
            self._send(HTTPStatus.NOT_FOUND, b"Not found\n")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        ingest = self.server.ingest
        if self.route != INGEST_PATH or ingest is None:
            self._drop_body()
            self._send(HTTPStatus.NOT_FOUND, b"Not found (training ingest is at POST /api/v1/training "
                                             b"and may be disabled by ingest.enabled)\n")
            return
        length = self._body_length
        if length is None or "Content-Length" not in self.headers:
            ingest.count_rejection("length_required")
            self.close_connection = True
            self._send(HTTPStatus.LENGTH_REQUIRED, b"a Content-Length header is required\n")
            return
        if length > ingest.max_body_bytes:
            ingest.count_rejection("too_large")
            self.close_connection = True
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                       f"snapshot of {length} bytes exceeds the limit of {ingest.max_body_bytes}\n".encode())
            return
        body = self.rfile.read(length)
        if len(body) < length:  # the client went away or the read deadline passed
            self.close_connection = True
            return
        self._received()
        status, reason = ingest.handle_push(body, self.headers.get("Content-Type"), self.headers.get("Authorization"))
        self._send(status, reason.encode() + b"\n")
