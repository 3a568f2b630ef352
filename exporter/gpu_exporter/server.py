"""HTTP: ``/metrics``, ``/healthz``, ``/readyz``, and ``POST /api/v1/training`` (snapshot ingest).

The server only reads what the sampler and the other collectors have published; it never
calls NVML. Basic auth and TLS come from an exporter-toolkit web config file; the health
endpoints and the ingest endpoint (which has its own bearer token) are exempt from basic auth
so that orchestrator probes and training jobs need no scrape credentials.

Example::

    server = MetricsServer(("127.0.0.1", 9445), sources, ready=lambda: (True, "ok"))
    server.serve_forever()
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from gpu_exporter.collectors.base import render

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/training"
CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"


class Source(Protocol):
    """Anything with ``collect()`` (a prometheus_client Collector); polling collectors also
    carry a pre-rendered ``exposition``."""

    def collect(self) -> Iterable[Any]: ...


class Ingest(Protocol):
    """The training snapshot store (gpu_exporter.ingest.TrainingStore)."""

    @property
    def max_body_bytes(self) -> int: ...

    def handle_push(self, body: bytes, content_type: str | None, authorization: str | None) -> tuple[int, str]: ...

    def count_rejection(self, reason: str) -> None: ...


class AddressInUse(RuntimeError):
    """The listen address is taken or cannot be bound; the message says how to fix it."""


def exposition(sources: Sequence[Source]) -> bytes:
    """Text exposition of every source, using pre-rendered text where a source has it."""
    parts = []
    for source in sources:
        cached = getattr(source, "exposition", None)
        parts.append(cached if isinstance(cached, bytes) else render(source.collect()))
    return b"".join(parts)


class MetricsServer(ThreadingHTTPServer):
    """A threading HTTP(S) server for the exporter's endpoints."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], sources: Sequence[Source], *,
                 ready: Callable[[], tuple[bool, str]], telemetry_path: str = "/metrics",
                 ingest: Ingest | None = None, ssl_context: ssl.SSLContext | None = None,
                 check_auth: Callable[[str | None], bool] | None = None,
                 on_auth_failure: Callable[[], None] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.sources = sources
        self.extra_headers = dict(headers or {})
        self.ready = ready
        self.telemetry_path = telemetry_path
        self.ingest = ingest
        self.check_auth = check_auth
        self.on_auth_failure = on_auth_failure
        host, port = address
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        if host == "":
            self.address_family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
        shown = f"{host or '*'}:{port}"
        try:
            super().__init__((host, port), _Handler)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise AddressInUse(f"cannot listen on {shown}: the address is already in use; stop the other "
                                   "process or choose another with --web.listen-address") from None
            raise AddressInUse(f"cannot listen on {shown}: {err.strerror}; "
                               "choose another with --web.listen-address") from None
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)

    def run_in_thread(self) -> threading.Thread:
        """Serve in a daemon thread; returns it."""
        thread = threading.Thread(target=self.serve_forever, name="gpu-exporter-http", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"
    server_version = "gpu-exporter"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**self.server.extra_headers, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        check = self.server.check_auth
        if check is None or check(self.headers.get("Authorization")):
            return True
        if self.server.on_auth_failure is not None:
            self.server.on_auth_failure()
        self._send(HTTPStatus.UNAUTHORIZED, b"Unauthorized\n",
                   headers={"WWW-Authenticate": 'Basic realm="gpu-exporter"'})
        return False

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(HTTPStatus.OK, b"ok\n")
        elif path == "/readyz":
            ok, reason = self.server.ready()
            self._send(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, reason.encode() + b"\n")
        elif not self._authorized():
            return
        elif path == self.server.telemetry_path:
            self._send(HTTPStatus.OK, exposition(self.server.sources), CONTENT_TYPE_LATEST)
        elif path == "/":
            page = (f"<html><head><title>GPU utilization exporter</title></head><body>"
                    f"<h1>GPU utilization exporter</h1><p><a href=\"{self.server.telemetry_path}\">Metrics</a> "
                    f"&middot; <a href=\"/healthz\">healthz</a> &middot; <a href=\"/readyz\">readyz</a></p>"
                    f"</body></html>\n")
            self._send(HTTPStatus.OK, page.encode(), "text/html; charset=utf-8")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"Not found\n")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        ingest = self.server.ingest
        if path != INGEST_PATH or ingest is None:
            self._send(HTTPStatus.NOT_FOUND, b"Not found (training ingest is at POST /api/v1/training "
                                             b"and may be disabled by ingest.enabled)\n")
            return
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            ingest.count_rejection("length_required")
            self._send(HTTPStatus.LENGTH_REQUIRED, b"a Content-Length header is required\n",
                       headers={"Connection": "close"})
            self.close_connection = True
            return
        length = int(length_header)
        if length > ingest.max_body_bytes:
            ingest.count_rejection("too_large")
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                       f"snapshot of {length} bytes exceeds the limit of {ingest.max_body_bytes}\n".encode(),
                       headers={"Connection": "close"})
            self.close_connection = True
            return
        body = self.rfile.read(length)
        status, reason = ingest.handle_push(body, self.headers.get("Content-Type"), self.headers.get("Authorization"))
        self._send(status, reason.encode() + b"\n")
