"""Ports and HTTP for the test bed: the one free-port helper, plain GETs, and waiting for a condition.

Example::

    port = free_port()
    body = wait_until(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), 10, what="the exporter")
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (nothing listens on it once this returns)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_url() -> str:
    """``http://127.0.0.1:PORT`` where nothing listens (a pusher's target that must send nothing)."""
    return f"http://127.0.0.1:{free_port()}"


def http_get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> str:
    """GET ``url`` and return the body as text (raises on HTTP errors)."""
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return str(resp.read().decode())


def http_status(url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
                timeout: float = 5.0) -> tuple[int, str]:
    """Request ``url`` (POST when ``data`` is given) and return (status, body) even for 4xx/5xx."""
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()


def wait_until(predicate: Any, timeout: float, interval: float = 0.2, what: str = "condition") -> Any:
    """Poll ``predicate()`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc!r})")
