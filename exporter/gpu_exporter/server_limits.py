"""The HTTP server's bounds on what one client can hold: connections, requests at once, read deadlines.

The node network is untrusted, so the server (gpu_exporter.server) bounds every resource a
client can hold (``web.*`` keys, :class:`Limits`). :class:`LimitedServer` is the
ThreadingHTTPServer under it that keeps those bounds: it tracks each open connection (idle
between requests or busy, with a read deadline), closes the longest-idle one to make room at
``max_connections`` (or the new one when none is idle), closes connections past their deadline,
frees descriptors at the open-file limit, and holds one slot per request served at once
(``max_requests``). The request handler marks each connection's phase and takes the slots.

Every refusal is counted in ``gpu_exporter_http_rejected_total{reason}`` and logged (at most
once per 10 s per reason), under the server's logger name. Example::

    class Server(LimitedServer): ...
    Server(("127.0.0.1", 9445), Handler, limits=Limits.from_config(DEFAULTS), accept_guard=threading.Lock())
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import Metric

from gpu_exporter import catalog
from gpu_exporter.config import Config
from gpu_exporter.exposition import Body

log = logging.getLogger("gpu_exporter.server")  # the refusals are the HTTP server's, logged under its name

REJECT_REASONS = ("max_requests", "max_connections", "read_timeout", "bad_request", "too_large", "open_files")
"""Every value of the ``reason`` label of gpu_exporter_http_rejected_total."""
LOG_EVERY_SECONDS = 10.0


@dataclass(frozen=True)
class Limits:
    """The server's bounds; defaults and help live in config.SETTINGS (keys ``web.<field>``).

    >>> from gpu_exporter.config import DEFAULTS
    >>> Limits.from_config(DEFAULTS).max_requests
    40
    """

    max_requests: int
    max_connections: int
    listen_backlog: int
    read_timeout: float
    idle_timeout: float

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        web = config.section("web")
        return cls(**{f.name: web[f.name] for f in fields(cls)})


@dataclass
class _Connection:
    """Bookkeeping of one open connection: a deadline, and whether it waits idle between requests."""

    sock: socket.socket
    idle: bool
    since: float
    deadline: float = math.inf
    expired: bool = False


def _shutdown(sock: socket.socket) -> None:
    """Wake the connection's thread with end-of-file; the thread itself closes the socket."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also for TLS: no TLS alert


class LimitedServer(ThreadingHTTPServer):
    """A threading HTTP(S) server that keeps :class:`Limits`; also a collector of its own counters. ``body`` is
    the subclass's /metrics body: a refusal invalidates what was rendered ahead."""

    body: Body

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *, limits: Limits,
                 accept_guard: contextlib.AbstractContextManager[Any]) -> None:
        self.accept_guard = accept_guard  # held by whoever needs the next free descriptors
        self.limits = limits
        self.request_queue_size = limits.listen_backlog
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, _Connection] = {}
        self.slots = threading.BoundedSemaphore(limits.max_requests)
        """One per request served at once (``max_requests``); health probes take none."""
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)
        self._unlogged = dict.fromkeys(REJECT_REASONS, 0)
        self._last_log = dict.fromkeys(REJECT_REASONS, -math.inf)
        super().__init__(address, handler)

    def reject(self, reason: str, message: str) -> None:
        """Count a refusal and log it, at most once per LOG_EVERY_SECONDS per reason."""
        now = time.monotonic()
        self.body.invalidate()  # a body rendered ahead would not show this count
        with self._lock:
            self._rejected[reason] += 1
            if now - self._last_log[reason] < LOG_EVERY_SECONDS:
                self._unlogged[reason] += 1
                return
            self._last_log[reason], more, self._unlogged[reason] = now, self._unlogged[reason], 0
        log.warning("HTTP: %s%s", message, f" ({more} more since the last such message)" if more else "")

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            with self.accept_guard:
                return super().get_request()
        except OSError as err:
            if err.errno in (errno.EMFILE, errno.ENFILE):
                self.reject("open_files", f"cannot accept a connection: {err.strerror}; raise the open-file "
                                          "limit or lower web.max_connections")
                with self._lock:
                    victim = self._take_idle()
                if victim is not None:
                    _shutdown(victim.sock)  # frees its descriptor when its thread ends
                time.sleep(0.1)  # the listening socket stays readable: do not spin
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = len(self._connections) >= self.limits.max_connections
            victim = self._take_idle() if full else None
            if not full or victim is not None:
                self._connections[request] = _Connection(request, idle=True, since=time.monotonic())
        if victim is not None:
            log.debug("closed the longest-idle connection to make room for %s", client_address[0])
            _shutdown(victim.sock)
        elif full:
            self.reject("max_connections", f"closed a new connection from {client_address[0]}: all "
                                           f"{self.limits.max_connections} connections are busy (web.max_connections)")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _take_idle(self) -> _Connection | None:
        """Forget the longest-idle connection and return it (None when none is idle); hold the lock."""
        idle = [c for c in self._connections.values() if c.idle]
        if not idle:
            return None
        victim = min(idle, key=lambda c: c.since)
        del self._connections[victim.sock]
        return victim

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._connections.pop(request, None)

    def phase(self, sock: socket.socket, *, idle: bool, timeout: float = math.inf) -> bool:
        """Mark a connection idle (between requests) or busy, with a deadline; False once it was closed."""
        now = time.monotonic()
        with self._lock:
            conn = self._connections.get(sock)
            if conn is None or conn.expired:
                return False
            conn.idle, conn.since, conn.deadline = idle, now, now + timeout
            return True

    def expired(self, sock: socket.socket) -> bool:
        with self._lock:
            conn = self._connections.get(sock)
            return conn is None or conn.expired

    def service_actions(self) -> None:
        """Close connections past their read deadline (called by serve_forever every half second)."""
        now = time.monotonic()
        with self._lock:
            late = [c.sock for c in self._connections.values() if c.deadline < now and not c.expired]
        for sock in late:
            self.timed_out(sock)

    def timed_out(self, sock: socket.socket) -> None:
        """A request did not arrive in time: count it once (the deadline or the socket timeout may see it first)."""
        with self._lock:
            conn = self._connections.get(sock)
            if conn is None or conn.expired:
                return
            conn.expired = True
        self.reject("read_timeout", f"closed a connection: its request did not arrive within "
                                    f"{self.limits.read_timeout:g}s (web.read_timeout)")
        _shutdown(sock)

    # -- the server's own metrics ---------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """gpu_exporter_http_* families (the server is one of its own sources)."""
        with self._lock:
            rejected, open_now = dict(self._rejected), len(self._connections)
        counter = catalog.GPU_EXPORTER_HTTP_REJECTED_TOTAL.new()
        for reason, count in rejected.items():
            counter.add_metric([reason], count)
        yield counter
        yield catalog.GPU_EXPORTER_HTTP_CONNECTIONS.new(open_now)
