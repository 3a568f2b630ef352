"""Read GPU metrics for the ``query`` and ``diagnose`` sub-commands.

Three sources, one shape: an exporter's ``/metrics`` page (:class:`ExporterSource`), NVML in
this process through the exporter's own collectors (:class:`NvmlSource`, also on simulated
GPUs), each returning a :class:`Snapshot`; and Prometheus's HTTP API (:class:`Prometheus`) for
instant queries (now or at a given time) and range queries. Every failure is a :class:`MetricsError`
whose message is one sentence that says what went wrong and what to check. Example::

    source = ExporterSource("http://127.0.0.1:9445")
    first = source.read(); time.sleep(1); second = source.read()
    busy = second.value("gpu_busy_seconds_total", gpu="0") - first.value("gpu_busy_seconds_total", gpu="0")
    utilization = busy / (second.at - first.at)
"""

from __future__ import annotations

import argparse
import base64
import datetime
import functools
import gc
import json
import os
import re
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter import catalog
from gpu_exporter.training import protocol
from gpu_exporter.verdict.samples import Labels as Labels
from gpu_exporter.verdict.samples import Snapshot as Snapshot
from gpu_exporter.verdict.samples import snapshot_of as snapshot_of


class MetricsError(Exception):
    """A source could not be read; ``str(err)`` is one sentence for the user."""


EXIT_NO_DRIVER = 1
"""The exit status of every command that finds no NVIDIA driver (serve, query, diagnose)."""


class NoDriver(MetricsError):
    """The NVIDIA driver (libnvidia-ml) is not there: the command exits with EXIT_NO_DRIVER."""


def without_gc(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``command`` with Python's cyclic garbage collector paused while it runs, for the one-shot commands that read
    a fleet (diagnose, report). Such a read makes ~100,000 dicts and lists, every series of every answer, and
    keeps them to the end: the collector frees nothing of them, yet each pass walks them, and its full passes
    walk all read so far. It took 28 ms of a fleet-wide diagnose's 300 at 992 GPUs and 150 of ``report --fleet``'s
    960 (docs/fleet.md). Not for ``serve``, which runs for months, nor ``query``, whose ``--count`` may loop."""
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
    """Print ``gpu-exporter: error: <message>`` to stderr and return ``code`` (the exit status)."""
    print(f"gpu-exporter: error: {message}", file=sys.stderr)
    return code


def normalize_url(text: str, default_path: str, what: str) -> str:
    """``host:port`` or ``http(s)://host:port[/path]`` as a full URL; ``default_path`` when none is given.

    The training library's rule (:func:`gpu_exporter.training.protocol.normalize_url`), so ``--url`` and
    ``GPU_EXPORTER_URL`` take the same URLs; a bad one is a MetricsError.

    >>> normalize_url("node7:9445", "/metrics", "exporter")
    'http://node7:9445/metrics'
    """
    try:
        return protocol.normalize_url(text, default_path, what)
    except ValueError as err:
        raise MetricsError(str(err)) from None


def tls_context(ca_file: str | None, insecure: bool, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext | None:
    """The TLS context for https URLs: the system CAs, ``ca_file``'s, or no verification (``insecure``);
    with ``cert_file`` (and ``key_file``) a client certificate too. None when nothing is set.

    >>> tls_context(None, False) is None
    True
    """
    if ca_file is None and not insecure and cert_file is None:
        return None
    if ca_file is not None and insecure:
        raise MetricsError("--ca-file and --insecure exclude each other: verify with a CA, or do not verify")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise MetricsError(f"cannot read the CA file {ca_file!r}: {_reason(err)}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as err:
            raise MetricsError(f"cannot load the client certificate {cert_file!r}"
                               f"{f' with the key {key_file!r}' if key_file else ''}: {_reason(err)}") from None
    return context


def _reason(err: OSError | ssl.SSLError) -> str:
    if isinstance(err, ssl.SSLError):
        return str(err.reason or err)
    return str(err.strerror or err)


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


@dataclass(frozen=True)
class Connection:
    """How a client command talks to one server: the TLS context (None: the defaults) and the auth headers."""

    context: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _secret(path: str, what: str) -> str:
    try:
        text = open(path, encoding="utf-8").read().strip()  # noqa: SIM115 - read at once
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise MetricsError(f"cannot read the {what} file {path!r}: {reason}") from None
    if not text:
        raise MetricsError(f"the {what} file {path!r} is empty")
    return text


def connection(args: argparse.Namespace, url: str, url_flag: str,
               env: Mapping[str, str] | None = None) -> Connection:
    """The one place that turns the connection flags (:func:`add_client_arguments`) into a TLS context and
    headers for ``url``, given as ``url_flag``; MetricsError for a bad combination or an unreadable file.

    Credentials: ``--username`` with ``--password-file``, or ``USER:PASSWORD@`` in the URL (basic auth), or
    ``--bearer-token-file``; else ``$GPU_EXPORTER_BEARER_TOKEN`` when set. Two kinds at once are an error.
    """
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
        password = _secret(str(get("password_file")), "password")
        credentials = f"{get('username')}:{password}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode()
    elif get("bearer_token_file"):
        headers["Authorization"] = "Bearer " + _secret(str(get("bearer_token_file")), "bearer token")
    elif not in_url and env.get(BEARER_TOKEN_ENV, "").strip():
        headers["Authorization"] = "Bearer " + env[BEARER_TOKEN_ENV].strip()
    return Connection(tls_context(get("ca_file"), bool(get("insecure")), get("cert_file"), get("key_file")),
                      headers)


def _fetch(url: str, what: str, timeout: float, conn: Connection | None = None, form: str | None = None) -> bytes:
    """GET ``url``, or POST ``form`` (URL-encoded) to it."""
    conn = conn or Connection()
    parts = urllib.parse.urlsplit(url)
    headers = {"Accept": "text/plain, application/json", **conn.headers}
    if form is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if parts.username is not None:
        credentials = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, ""))
    shown = urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    try:
        request = urllib.request.Request(url, None if form is None else form.encode(), headers)
        with urllib.request.urlopen(request, timeout=timeout, context=conn.context) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as err:
        sent = "the credentials were refused" if "Authorization" in headers else "it needs credentials"
        hint = {401: f"{sent}: give --username with --password-file, or --bearer-token-file",
                403: "the credentials are not allowed to read this",
                404: f"check the path (the {what} serves {'/metrics' if what == 'exporter' else '/api/v1/'})"}
        raise MetricsError(f"the {what} at {shown} answered HTTP {err.code} {err.reason}"
                           f"{': ' + hint[err.code] if err.code in hint else ''}") from None
    except (urllib.error.URLError, TimeoutError) as err:
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, ConnectionRefusedError):
            raise MetricsError(f"cannot connect to the {what} at {shown}: connection refused "
                               f"(is {'gpu-exporter' if what == 'exporter' else 'it'} running there?)") from None
        if isinstance(reason, socket.gaierror):
            raise MetricsError(f"cannot resolve the host {parts.hostname!r} of the {what} URL {shown}") from None
        if isinstance(reason, TimeoutError):
            raise MetricsError(f"the {what} at {shown} did not answer within {timeout:g} s") from None
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise MetricsError(f"the {what} at {shown} has a certificate this machine does not trust "
                               f"({reason.verify_message}): pass --ca-file with its CA, or --insecure") from None
        if isinstance(reason, ssl.SSLError):
            raise MetricsError(f"the TLS handshake with the {what} at {shown} failed ({reason.reason or reason}): "
                               "does it want a client certificate (--cert-file, --key-file)?") from None
        raise MetricsError(f"cannot reach the {what} at {shown}: {reason}") from None
    except ssl.SSLError as err:
        raise MetricsError(f"the TLS connection to the {what} at {shown} failed ({err.reason or err}): "
                           "does it want a client certificate (--cert-file, --key-file)?") from None
    except OSError as err:
        raise MetricsError(f"cannot reach the {what} at {shown}: {err.strerror or err}") from None


class Source(Protocol):
    """Anything that returns a Snapshot per read (an exporter or in-process NVML)."""

    def read(self) -> Snapshot: ...


def new_poll_gap(source: Source) -> float:
    """How much newer a reading's NVML poll must be to count as a new poll: half the poll interval.

    Two scrapes of the same poll differ in ``at`` by the scrape-time jitter (up to a scrape's
    duration); two polls differ by at least the poll interval. An in-process source polls on
    every read, so any newer reading is new.
    """
    return float(getattr(source, "poll_interval", 0.0)) / 2


def read_after(source: Source, after: float, patience: float, min_gap: float | None = None) -> Snapshot:
    """The first reading whose NVML poll is at least ``min_gap`` newer than ``after`` (default
    :func:`new_poll_gap`; an exporter polls on its own schedule).

    Gives up after ``patience`` seconds and returns the latest reading; the caller checks
    ``snapshot.at`` to tell a repeated poll from a new one.
    """
    gap = max(new_poll_gap(source) if min_gap is None else min_gap, 1e-6)
    deadline = time.monotonic() + patience
    while True:
        snapshot = source.read()
        if snapshot.at >= after + gap or time.monotonic() >= deadline:
            return snapshot
        time.sleep(min(0.1, max(gap / 4, 0.01)))


class ExporterSource:
    """Scrapes a running gpu-exporter's metrics page.

    >>> ExporterSource("127.0.0.1:9445").url
    'http://127.0.0.1:9445/metrics'
    """

    def __init__(self, url: str, timeout: float = 5.0, connection: Connection | None = None) -> None:
        from gpu_exporter.config import DEFAULTS

        self.url = normalize_url(url, "/metrics", "exporter")
        self.timeout = timeout
        self.connection = connection or Connection()
        self.poll_interval = float(DEFAULTS.poll_interval)
        """The exporter's poll interval: ``gpu_exporter_poll_interval_seconds`` once a scrape shows
        it, else the exporter's default."""

    def read(self) -> Snapshot:
        """Scrape once; raises MetricsError when the page is unreachable or not a gpu-exporter's."""
        started = time.monotonic()
        body = _fetch(self.url, "exporter", self.timeout, self.connection)
        at, wall = (started + time.monotonic()) / 2, time.time()
        try:
            snapshot = snapshot_of(text_string_to_metric_families(body.decode("utf-8", "replace")), at, wall)
        except (ValueError, TypeError, IndexError):
            raise MetricsError(f"{self.url} does not serve Prometheus metrics: is it a gpu-exporter?") from None
        build_info = catalog.GPU_EXPORTER_BUILD_INFO.name
        if build_info not in snapshot.samples:
            raise MetricsError(f"{self.url} serves no gpu-exporter metrics ({build_info} is missing): "
                               "point --url at a gpu-exporter")
        age = snapshot.value(catalog.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.name)
        interval = snapshot.value(catalog.GPU_EXPORTER_POLL_INTERVAL_SECONDS.name)
        if interval is not None and interval > 0:
            self.poll_interval = interval
        return Snapshot(snapshot.samples, at=at - (age or 0.0), wall=wall)


class DcgmSource:
    """Scrapes NVIDIA's dcgm-exporter (``diagnose --dcgm-url``): the SM, tensor and DRAM activity of GPUs without
    GPM (A100 and older), by UUID.

    >>> DcgmSource("127.0.0.1:9400").url
    'http://127.0.0.1:9400/metrics'
    """

    def __init__(self, url: str, timeout: float = 5.0, connection: Connection | None = None) -> None:
        self.url = normalize_url(url, "/metrics", "dcgm-exporter")
        self.timeout = timeout
        self.connection = connection or Connection()

    def read(self) -> Snapshot:
        """Scrape once; raises MetricsError when the page is unreachable or has no DCGM profiling field."""
        body = _fetch(self.url, "dcgm-exporter", self.timeout, self.connection)
        try:
            snapshot = snapshot_of(text_string_to_metric_families(body.decode("utf-8", "replace")), time.monotonic(),
                                   time.time())
        except (ValueError, TypeError, IndexError):
            raise MetricsError(f"{self.url} does not serve Prometheus metrics: is it a dcgm-exporter?") from None
        sm = catalog.DCGM_SM_ACTIVE.name
        if sm not in snapshot.samples:
            raise MetricsError(f"{self.url} serves no {sm}: point --dcgm-url at a dcgm-exporter with the profiling "
                               "fields enabled (docs/dcgm-exporter.md)")
        return snapshot


@dataclass
class NvmlSource:
    """Reads NVML in this process with the exporter's utilization, device and process collectors.

    ``simulate``: None for the real driver, "" for the packaged simulated node, or a scenario
    name or file. Call :meth:`close` when done.
    """

    simulate: str | None = None
    _state: dict[str, Any] = field(default_factory=dict)

    def _open(self) -> None:
        from gpu_exporter.collectors.device import DeviceCollector
        from gpu_exporter.collectors.processes import ProcessCollector
        from gpu_exporter.collectors.utilization import UtilizationCollector
        from gpu_exporter.nvml import DriverNotFound, Nvml

        if self.simulate is not None:
            from gpu_exporter import simulate

            try:
                simulate.install(self.simulate or None)
            except (ValueError, OSError) as err:
                raise MetricsError(str(err)) from None
        nvml = Nvml()
        try:
            nvml.init()
        except DriverNotFound as err:
            raise NoDriver(str(err)) from None
        self._state.update(nvml=nvml, gpus=nvml.discover(),
                           collectors=(UtilizationCollector(), DeviceCollector(), ProcessCollector()))

    def read(self) -> Snapshot:
        """Poll every GPU once; the first call initialises NVML (MetricsError without a driver)."""
        from gpu_exporter.collectors.base import PollContext
        from gpu_exporter.nvml import DriverLost

        if not self._state:
            self._open()
        now = time.monotonic()
        ctx = PollContext(nvml=self._state["nvml"], gpus=self._state["gpus"], now=now)
        families: list[Metric] = []
        try:
            for collector in self._state["collectors"]:
                collector.poll(ctx)
                families.extend(collector.collect())
        except DriverLost as err:
            raise MetricsError(f"NVML stopped answering ({err}); is the NVIDIA driver still loaded?") from None
        return snapshot_of(families, at=now, wall=time.time())

    def close(self) -> None:
        """Shut NVML down (and remove the simulated node, if one was installed)."""
        if self._state:
            self._state["nvml"].shutdown()
            self._state.clear()
        if self.simulate is not None:
            from gpu_exporter import simulate

            simulate.uninstall()


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


def promql_duration(seconds: float) -> str:
    """A PromQL range for ``seconds``: ``300.0 -> "300s"``, ``0.5 -> "500ms"``."""
    return f"{round(seconds)}s" if seconds >= 10 or seconds == round(seconds) else f"{round(seconds * 1000)}ms"


Series = list[tuple[float, float]]
"""(Unix seconds, value) pairs of one range-query series."""


GET_LIMIT = 4096
"""The longest query string sent in a URL. A longer one (a matcher that lists many runs) is POSTed as a form, as the
Prometheus HTTP API also takes it: proxies in front of Prometheus commonly refuse URLs over 8 KiB."""

_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def any_of(label: str, values: Sequence[str]) -> str:
    """A PromQL matcher: ``label`` is one of ``values`` (RE2's metacharacters escaped, the string quoted for PromQL).

    >>> print(any_of("run", ["b", "a.1", 'q"x']))
    run=~"a\\\\.1|b|q\\"x"
    """
    regex = "|".join(_REGEX_META.sub(r"\\\1", value) for value in sorted(set(values)))
    return f"{label}=~{json.dumps(regex, ensure_ascii=False)}"


MATCHER_LIMIT = 8192
"""The longest matcher :func:`any_of_chunks` writes: VictoriaMetrics refuses a query over ``-search.maxQueryLen``
(16 KiB by default, HTTP 422) even when POSTed; at 10,000 GPUs the runs a fleet-wide diagnose names make a longer
one."""


def any_of_chunks(label: str, values: Sequence[str], limit: int = MATCHER_LIMIT) -> list[str]:
    """:func:`any_of` split into as few matchers as keep each within ``limit`` characters (one value per matcher at
    least): querying each and adding up the answers reads the same series as one matcher of all the values.

    >>> any_of_chunks("run", ["a", "b", "c"], limit=11)
    ['run=~"a|b"', 'run=~"c"']
    >>> any_of_chunks("run", [])
    []
    """
    chunks: list[list[str]] = []
    size = 0
    for value in sorted(set(values)):
        # the value's share of the matcher: escaped for RE2, then for the PromQL string, and its "|"
        cost = len(json.dumps(_REGEX_META.sub(r"\\\1", value), ensure_ascii=False)) - 1
        if chunks and size + cost <= limit:
            chunks[-1].append(value)
            size += cost
        else:
            chunks.append([value])
            size = len(label) + 4 + cost - 1  # label=~"..." around the first value, which has no "|"
    return [any_of(label, chunk) for chunk in chunks]


QUERY_WORKERS = 8
"""Queries :meth:`Prometheus.query_many` has in flight at once (Prometheus' own default limit is 20)."""


class Prometheus:
    """Instant queries (now, or at ``at``) and range queries against Prometheus's HTTP API.

    >>> Prometheus("http://prometheus:9090").base
    'http://prometheus:9090'
    """

    def __init__(self, url: str, timeout: float = 10.0, at: float | None = None,
                 connection: Connection | None = None) -> None:
        self.base = normalize_url(url, "", "Prometheus server").rstrip("/")
        self.timeout = timeout
        self.at = at
        """Evaluate instant queries at this Unix time (None: now)."""
        self.connection = connection or Connection()
        """TLS and credentials (:func:`connection`): Thanos, Mimir, AMP or GMP behind auth."""

    def at_time(self, at: float | None) -> Prometheus:
        """The same server and connection, with instant queries evaluated at ``at``."""
        return Prometheus(self.base, self.timeout, at, self.connection)

    def _data(self, path: str, params: dict[str, str], expr: str, kind: str) -> list[dict[str, Any]]:
        form = urllib.parse.urlencode(params)
        long = len(form) > GET_LIMIT
        url = f"{self.base}/api/v1/{path}" + ("" if long else f"?{form}")
        body = _fetch(url, "Prometheus server", self.timeout, self.connection, form if long else None)
        try:
            doc = json.loads(body)
            status, data = doc["status"], doc.get("data", {})
        except (ValueError, KeyError, TypeError):
            raise MetricsError(f"{self.base} is not a Prometheus HTTP API (its answer is not Prometheus JSON)"
                               ) from None
        if status != "success":
            raise MetricsError(f"Prometheus at {self.base} rejected the query {expr!r}: {doc.get('error', status)}")
        if data.get("resultType") != kind:
            raise MetricsError(f"Prometheus at {self.base} answered {expr!r} with a {data.get('resultType')}, "
                               f"not a {kind}")
        result: list[dict[str, Any]] = data.get("result", [])
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[tuple[Labels, Series]]:
        """``expr`` evaluated every ``step`` seconds from ``start`` to ``end``: (labels, [(time, value)])."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return [(item["metric"], [(float(t), float(v)) for t, v in item["values"]])
                for item in self._data("query_range", params, expr, "matrix")]

    def query(self, expr: str) -> list[tuple[Labels, float]]:
        """The instant vector ``expr`` evaluates to now (or at ``at``), as (labels, value) pairs."""
        params = {"query": expr} if self.at is None else {"query": expr, "time": f"{self.at:.3f}"}
        return [(item["metric"], float(item["value"][1]))
                for item in self._data("query", params, expr, "vector")]

    def query_many(self, exprs: Sequence[str]) -> dict[str, list[tuple[Labels, float]]]:
        """:meth:`query` of every expression, ``QUERY_WORKERS`` at a time: a fleet's answer waits for its slowest
        query, not for their sum (Prometheus evaluates queries in parallel, up to ``--query.max-concurrency``).
        Raises the first expression's error, in ``exprs``' order."""
        unique = list(dict.fromkeys(exprs))
        with ThreadPoolExecutor(max(1, min(QUERY_WORKERS, len(unique)))) as pool:
            return dict(zip(unique, pool.map(self.query, unique), strict=True))

    def samples(self, selector: str) -> list[tuple[Labels, Series]]:
        """The raw samples of a range selector (``metric{...}[10m]``) up to now (or ``at``), each at its own scrape
        time: (labels, [(time, value)]). Exact where a range query's steps may fall between two scrapes."""
        params = {"query": selector} if self.at is None else {"query": selector, "time": f"{self.at:.3f}"}
        return [(item["metric"], [(float(t), float(v)) for t, v in item["values"]])
                for item in self._data("query", params, selector, "matrix")]

    def require(self, metric: str, window: str) -> None:
        """Raise MetricsError unless Prometheus holds ``metric`` within the last ``window``."""
        if not self.query(f"count(last_over_time({metric}[{window}]))"):
            raise MetricsError(f"Prometheus at {self.base} has no {metric} series in the last {window}: "
                               "is it scraping a gpu-exporter (see its Targets page)?")

