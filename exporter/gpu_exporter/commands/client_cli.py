"""What the client commands' (query, diagnose, report) command lines share.

The connection flags and the one place that turns them into a :class:`~gpu_exporter.commands.client_http.Connection`
(:func:`connection`), the time flags (:func:`parse_seconds`, :func:`parse_time`, and :func:`iso` back), the exit
statuses and the one-line error (:func:`fail`), and the garbage-collector pause of the one-shot commands
(:func:`without_gc`).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from gpu_exporter.commands.client_http import Connection, MetricsError, basic_auth, tls_context

EXIT_NO_DRIVER = 1
"""The exit status of every command that finds no NVIDIA driver (serve, query, diagnose)."""


def without_gc(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command`` with Python's cyclic garbage collector paused while it runs, for the one-shot commands that read
    a fleet (diagnose, report): such a read keeps every series it decodes to the end, so the collector frees nothing,
    yet its passes walk it all (docs/fleet.md). Not for ``serve``, nor ``query``, whose ``--count`` may loop."""
    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return command(args)
        finally:
            if enabled:
                gc.enable()
    return run


def fail(message: str, code: int = 2) -> int:
    print(f"gpu-exporter: error: {message}", file=sys.stderr)
    return code


BEARER_TOKEN_ENV = "GPU_EXPORTER_BEARER_TOKEN"
"""The bearer token of the client commands when no credential flag is given (the token itself, not a file)."""

TLS_FLAGS = ("ca_file", "insecure", "cert_file", "key_file")


def add_client_arguments(parser: argparse.ArgumentParser, url_flags: str) -> None:
    """The connection flags, the same on every client command (query, diagnose, report): TLS (``--ca-file``,
    ``--insecure``, a client certificate) and credentials (basic auth, or a bearer token)."""
    group = parser.add_argument_group(
        "connection", f"TLS and credentials for {url_flags} (the same flags on query, diagnose and report)")
    group.add_argument("--ca-file", metavar="FILE", help="https: trust the CA certificates in FILE")
    group.add_argument("--insecure", action="store_true", help="https: do not verify the server's certificate")
    group.add_argument("--cert-file", metavar="FILE",
                       help="https: present this client certificate (PEM; holding the key too unless --key-file)")
    group.add_argument("--key-file", metavar="FILE", help="https: the client certificate's private key (PEM)")
    group.add_argument("--username", metavar="USER", help="basic auth: the user (with --password-file)")
    group.add_argument("--password-file", metavar="FILE", help="basic auth: the password, the file's content")
    group.add_argument("--bearer-token-file", metavar="FILE",
                       help="send 'Authorization: Bearer TOKEN' with the token in FILE (Thanos, Mimir, AMP or GMP "
                            f"behind a proxy) [env {BEARER_TOKEN_ENV}: the token itself]")


CLIENT_FLAGS = (*TLS_FLAGS, "username", "password_file", "bearer_token_file")


def client_flags_given(args: argparse.Namespace) -> list[str]:
    """The connection flags on the command line (``["--ca-file", "--username"]``), for "needs --url" errors."""
    return [f"--{name.replace('_', '-')}" for name in CLIENT_FLAGS if getattr(args, name, None)]


def _secret(path: str, what: str) -> str:
    try:
        text = open(path, encoding="utf-8").read().strip()  # noqa: SIM115 - read at once
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise MetricsError(f"cannot read the {what} file {path!r}: {reason}") from None
    if not text:
        raise MetricsError(f"the {what} file {path!r} is empty")
    return text


def connection(args: argparse.Namespace, url: str, url_flag: str, env: Mapping[str, str] | None = None) -> Connection:
    """The one place that turns the connection flags (:func:`add_client_arguments`) into a TLS context and headers
    for ``url``, given as ``url_flag``; MetricsError for a bad combination or an unreadable file. Credentials:
    ``--username`` with ``--password-file``, or ``USER:PASSWORD@`` in the URL (basic auth), or ``--bearer-token-file``;
    else ``$GPU_EXPORTER_BEARER_TOKEN`` when set. Two kinds at once are an error."""
    env = os.environ if env is None else env

    def get(name: str) -> Any:
        return getattr(args, name, None)

    tls = [f"--{name.replace('_', '-')}" for name in TLS_FLAGS if get(name)]
    if tls and not url.strip().lower().startswith("https://"):
        raise MetricsError(f"{' and '.join(tls)} apply to an https:// {url_flag} only")
    if get("key_file") and not get("cert_file"):
        raise MetricsError("--key-file needs --cert-file (the client certificate it belongs to)")
    if bool(get("username")) != bool(get("password_file")):
        raise MetricsError("basic auth needs both --username and --password-file")
    in_url = "@" in urllib.parse.urlsplit(url if "://" in url else "http://" + url).netloc
    given = [what for what, there in (("--username", get("username")), (f"USER:PASSWORD@ in {url_flag}", in_url),
                                      ("--bearer-token-file", get("bearer_token_file"))) if there]
    if len(given) > 1:
        raise MetricsError(f"{' and '.join(given)} exclude each other: give one kind of credentials")
    headers = {}
    if get("username"):
        headers["Authorization"] = basic_auth(get("username"), _secret(str(get("password_file")), "password"))
    elif get("bearer_token_file"):
        headers["Authorization"] = "Bearer " + _secret(str(get("bearer_token_file")), "bearer token")
    elif not in_url and env.get(BEARER_TOKEN_ENV, "").strip():
        headers["Authorization"] = "Bearer " + env[BEARER_TOKEN_ENV].strip()
    return Connection(tls_context(get("ca_file"), bool(get("insecure")), get("cert_file"), get("key_file")), headers)


def parse_seconds(text: str, what: str) -> float:
    """Seconds in a client flag's time: plain seconds (``2.5``) or a Go/Prometheus duration (``500ms``, ``1m30s``),
    the grammar of every time setting (:func:`gpu_exporter.config.parse_duration`); MetricsError naming ``what``.

    >>> parse_seconds("1m30s", "--window"), parse_seconds("2.5", "--window")
    (90.0, 2.5)
    """
    from gpu_exporter.config import DURATION_EXAMPLES, parse_duration

    text = text.strip()
    try:
        value = float(text) if re.fullmatch(r"\d+\.?\d*|\.\d+", text) else parse_duration(text)
    except ValueError:
        raise MetricsError(f"{what}: {text!r} is not a duration like {DURATION_EXAMPLES}, or seconds") from None
    if value <= 0:
        raise MetricsError(f"{what} must be longer than 0 s, not {text!r}")
    return value


def parse_time(text: str, what: str, now: float | None = None) -> float:
    """Unix seconds of ``text``: ``now``, ``-DURATION`` (before now), Unix seconds, or ISO 8601 (UTC if no zone).

    >>> parse_time("2026-12-03T05:00:00Z", "--at")
    1796274000.0
    >>> parse_time("-1h", "--at", now=7200.0)
    3600.0
    """
    from gpu_exporter.config import parse_duration

    now = time.time() if now is None else now
    text = text.strip()
    try:
        if text == "now":
            return now
        if text.startswith("-"):
            return now - parse_duration(text[1:])
        if text.replace(".", "", 1).isdigit():
            return float(text)
        stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise MetricsError(f"{what}: {text!r} is not a time: use now, -2h (before now), Unix seconds or "
                           "2026-12-03T05:00:00Z") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp()


def iso(seconds: float) -> str:
    """``1796274000.0 -> "2026-12-03T05:00:00Z"`` (UTC, whole seconds)."""
    return datetime.datetime.fromtimestamp(round(seconds), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
