"""The background thread that pushes a run's cumulative snapshots to the exporter.

Training never waits for it: the thread copies the run's state, POSTs it under a deadline
and drops the failure if the exporter is down or slow. Because every snapshot carries
totals since the start of the run, the next successful push carries everything the failed
ones would have. Two guarantees hold whatever the exporter does:

- Every POST ends by its deadline (``timeout`` seconds for a periodic push). A socket
  timeout alone bounds each read, not the request: a server that trickles one byte per
  second would hold it forever. A timer shuts the socket down at the deadline instead.
- No phase value sent is lower than one sent before (the exporter would refuse the push as
  a decreasing counter, and Prometheus would read a reset): each value is raised to the
  highest one already sent. Pushes are serialised, so the exporter sees them in that order.

Example::

    pusher = Pusher(run, "http://127.0.0.1:9445/api/v1/training", token=None, interval=5.0, timeout=2.0)
    pusher.start()
    ...
    pusher.stop()  # one final push marked finished; returns within about 2 x timeout
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.parse

from .interfaces import PushedRun

log = logging.getLogger("gpu_exporter.training")

_MAX_REPLY = 4096
"""Bytes of the exporter's reply read at most (it is a one-line reason)."""


class Pusher:
    """Push ``run.snapshot()`` to ``endpoint`` every ``interval`` seconds from a daemon thread."""

    def __init__(self, run: PushedRun, endpoint: str, token: str | None, interval: float, timeout: float) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"training.start: push_interval ({interval}) and timeout ({timeout}) must be > 0")
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"training.start: exporter URL {endpoint!r} must be http(s)://host[:port]/...")
        self._run = run
        self.endpoint = endpoint
        """The ingest URL the snapshots go to."""
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._path = url.path or "/"
        # The exporter is node-local: pushes never go through an HTTP proxy from the environment.
        self._headers = {"Content-Type": "application/json", "User-Agent": "gpu-exporter-training",
                         "Connection": "close"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._interval = interval
        self._timeout = timeout
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one push at a time, so the exporter sees them in order
        self._sent: dict[str, float] = {}  # highest value sent per phase
        self._thread = threading.Thread(target=self._loop, name=f"gpu-exporter-push[{run.name}]", daemon=True)
        self._last_problem = ""
        self.pushes_ok = 0
        """Snapshots the exporter accepted (for tests and diagnostics)."""

    def start(self) -> None:
        """Start the daemon thread; the first push happens at once."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and send one last snapshot marked finished, all within 2 x timeout.

        A periodic push still in flight ends by its own deadline (``timeout``); the final
        push gets what is left of the total.
        """
        deadline = time.monotonic() + 2 * self._timeout
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - time.monotonic()))
        self.push(finished=True, deadline=deadline)

    def _loop(self) -> None:
        self.push()
        while not self._stop.wait(self._interval):
            self.push()

    def push(self, finished: bool = False, deadline: float | None = None) -> bool:
        """Send one snapshot now; True when the exporter accepted it. Never raises.

        The whole request ends by ``deadline`` (``time.monotonic()``), by default ``timeout``
        seconds from now.
        """
        if os.getpid() != self._run._pid:  # a forked copy: only the parent reports
            return False
        if deadline is None:
            deadline = time.monotonic() + self._timeout
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self._report(f"a push to {self.endpoint} is still in flight; skipped this one")
            return False
        try:
            try:
                status, reason = self._post(self._body(finished), deadline)
            except (OSError, http.client.HTTPException, ValueError) as err:
                why = f"no complete answer by the deadline ({err})" if time.monotonic() >= deadline else str(err)
                self._report(f"cannot reach the exporter at {self.endpoint} ({why}); will retry, nothing is lost")
                return False
            if status >= 300:
                self._report(f"exporter at {self.endpoint} rejected the snapshot: HTTP {status} {reason}")
                return False
            if self._last_problem:
                log.info("pushing to %s works again", self.endpoint)
                self._last_problem = ""
            self.pushes_ok += 1
            return True
        finally:
            self._lock.release()

    def _body(self, finished: bool) -> bytes:
        """The snapshot as JSON, each phase raised to the highest value already sent."""
        snapshot = self._run.snapshot(finished=finished)
        phases: dict[str, float] = snapshot["phases"]
        for name, seconds in phases.items():
            phases[name] = self._sent[name] = max(seconds, self._sent.get(name, 0.0))
        return json.dumps(snapshot).encode()

    def _post(self, body: bytes, deadline: float) -> tuple[int, str]:
        """POST ``body``; (status, first line of the reply). A timer aborts the socket at ``deadline``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no time left before the deadline")
        connection = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = connection(self._host, self._port, timeout=remaining)
        timer = _started_timer(remaining, conn)
        try:
            conn.request("POST", self._path, body=body, headers=self._headers)
            response = conn.getresponse()
            reply = response.read(_MAX_REPLY).decode(errors="replace").strip()
            return response.status, (reply.splitlines() or [response.reason])[0][:200]
        finally:
            if timer is not None:
                timer.cancel()
            conn.close()

    def _report(self, problem: str) -> None:
        """Log a push problem once, not on every retry."""
        if problem != self._last_problem:
            log.warning("%s", problem)
            self._last_problem = problem


def _started_timer(seconds: float, conn: http.client.HTTPConnection) -> threading.Timer | None:
    """A daemon timer that aborts ``conn`` after ``seconds``; None at interpreter exit, where Python 3.12 starts
    no thread (the final push from atexit): the socket's own timeout then bounds each send and read instead."""
    timer = threading.Timer(seconds, _abort, (conn,))
    timer.daemon = True
    try:
        timer.start()
    except RuntimeError:
        return None
    return timer


def _abort(conn: http.client.HTTPConnection) -> None:
    """At the deadline: shut the socket down, so a blocked send or read returns at once."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
