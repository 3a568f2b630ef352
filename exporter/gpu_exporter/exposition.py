"""Prometheus text exposition of the exporter's metric sources, and the /metrics body built from it.

The problem: Prometheus scrapes every 15 s or so, and each scrape arrives after a fresh poll,
so the scrape that matters is the first one after a poll. That scrape must not build a
prometheus_client family object per metric, format every label set again, and gzip the whole
body. So:

- :class:`Family` renders one metric family straight from plain (label values, value) rows.
  It formats each series' ``name{labels} `` prefix once and reuses it while the series
  exists (a series gone from the rows is forgotten at the next render), so a render is one
  value format and one string concatenation per series. The text is byte for byte what
  prometheus_client's ``generate_latest`` writes for the same family (sorted label names,
  escaped label values and help, Go float format).
- A source (the :class:`Source` protocol) may carry ``exposition``: its text, rendered once per
  change and returned as the *same* bytes object until the next change. :func:`exposition`
  uses that text instead of rendering.
- :class:`Body` builds the /metrics body. It gzips the leading run of such pre-rendered parts
  once per change and keeps the compressor's state after them, so a scrape compresses only
  the few small parts computed per scrape (the exporter's own health). :meth:`Body.prepare`
  does that work ahead of a scrape (the poller calls it after a poll when
  :class:`ScrapeForecast` expects a scrape before the next poll), so a scrape right after a
  poll costs about what a repeated one does. ``prepare(ahead=...)`` goes further: it also
  renders the per-scrape parts and keeps the whole body, plain and gzip, which scrapes then
  serve as they are while no pre-rendered part changes (the next poll), for at most ``ahead``
  seconds, and until :meth:`Body.invalidate` (the server calls it when its own counters move):
  the scrape Prometheus makes renders and compresses only the trailing ``live`` sources (the
  sample age: one line). Its other per-scrape values (the exporter's health, ``process_*``) are
  then those of the poll, at most ``ahead`` seconds old.

This module imports nothing of the exporter, so collectors, the server and the tests can all use it.

Example::

    body = Body(sources)
    payload, encoding = body.encode(request.headers.get("Accept-Encoding"))
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from prometheus_client.exposition import generate_latest, gzip_accepted
from prometheus_client.metrics_core import Metric

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"
_LEGACY_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
GZIP_LEVEL = 6
"""zlib's default: a 100 kB scrape compresses about 10x in about a millisecond."""
_GZIP_WBITS = 31  # deflate with a gzip header and trailer


class Source(Protocol):
    """Anything with ``collect()`` (the prometheus_client Collector protocol), and maybe ``exposition``: its text
    rendered once per change, the same bytes object until the next (polling collectors have it)."""

    def collect(self) -> Iterable[Metric]: ...


# -- rendering from rows -------------------------------------------------------------------------

def escape_help(text: str) -> str:
    r"""Escape a HELP text as the text format wants (backslash and newline).

    >>> escape_help("a\\b\nc")
    'a\\\\b\\nc'
    """
    return text.replace("\\", r"\\").replace("\n", r"\n")


def escape_label_value(value: str) -> str:
    r"""Escape a label value (backslash, newline, double quote).

    >>> escape_label_value('say "hi"\n')
    'say \\"hi\\"\\n'
    """
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def format_value(value: float) -> str:
    """A sample value as Go (and prometheus_client) writes it.

    >>> [format_value(v) for v in (1, 0.25, 85899345920, 1e16, math.inf, -math.inf, math.nan)]
    ['1.0', '0.25', '8.589934592e+10', '1e+16', '+Inf', '-Inf', 'NaN']
    """
    v = float(value)
    s = repr(v)
    if v >= 1e6:  # Go uses an exponent from 1e21 down; prometheus_client from 7 integer digits
        dot = s.find(".")
        if dot > 6:
            mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
        return "+Inf" if v == math.inf else s
    if s[-1] in "fn":  # -inf, nan
        return "-Inf" if v == -math.inf else "NaN"
    return s


class Family:
    """One metric family's text, rendered from rows, with each series' prefix formatted once.

    ``kind`` is ``"gauge"`` or ``"counter"`` (give a counter's name without ``_total``, as
    prometheus_client does). Not thread-safe: its owner renders under its own lock.

    >>> f = Family("gpu_temperature_celsius", "gauge", "Temperature.", ("uuid", "gpu"))
    >>> print(f.render([(["GPU-a", "0"], 41)]), end="")
    # HELP gpu_temperature_celsius Temperature.
    # TYPE gpu_temperature_celsius gauge
    gpu_temperature_celsius{gpu="0",uuid="GPU-a"} 41.0
    """

    __slots__ = ("_order", "_prefixes", "_quoted_names", "documentation", "header", "kind", "labels", "name",
                 "sample_name")

    def __init__(self, name: str, kind: str, documentation: str, labels: Sequence[str]) -> None:
        if kind not in ("gauge", "counter"):
            raise ValueError(f"Family {name}: kind must be gauge or counter, not {kind!r}")
        self.name, self.kind, self.documentation, self.labels = name, kind, documentation, tuple(labels)
        self.sample_name = f"{name}_total" if kind == "counter" else name
        self.header = (f"# HELP {self.sample_name} {escape_help(documentation)}\n"
                       f"# TYPE {self.sample_name} {kind}")
        # prometheus_client writes label names sorted: remember where each comes from.
        self._order = sorted(range(len(self.labels)), key=lambda i: self.labels[i])
        self._quoted_names = [f'{self.labels[i]}="' for i in self._order]
        self._prefixes: dict[tuple[str, ...], str] = {}

    def matches(self, kind: str, documentation: str, labels: Sequence[str]) -> bool:
        """True when this family renders rows of that kind, help and label names."""
        return kind == self.kind and documentation == self.documentation and tuple(labels) == self.labels

    def _prefix(self, values: tuple[str, ...]) -> str:
        if not values:
            return self.sample_name + " "
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: {len(values)} label values for labels {self.labels}")
        pairs = ",".join(name + escape_label_value(values[i]) + '"'
                         for name, i in zip(self._quoted_names, self._order, strict=True))
        return f"{self.sample_name}{{{pairs}}} "

    def lines(self, rows: Iterable[tuple[Sequence[str], float]], out: list[str]) -> None:
        """Append the header and one line per row (no newlines) to ``out``; forget series not in ``rows``."""
        prefixes, fresh = self._prefixes, {}
        out.append(self.header)
        for labels, value in rows:
            key = tuple(labels)
            prefix = fresh[key] = prefixes.get(key) or self._prefix(key)
            out.append(prefix + format_value(value))
        self._prefixes = fresh

    def render(self, rows: Iterable[tuple[Sequence[str], float]]) -> str:
        """The family's text, newline-terminated."""
        out: list[str] = []
        self.lines(rows, out)
        return "\n".join(out) + "\n"


def join_lines(lines: list[str]) -> bytes:
    """The UTF-8 text of lines collected by :meth:`Family.lines` (b"" for none)."""
    return ("\n".join(lines) + "\n").encode() if lines else b""


# -- rendering prometheus_client families ---------------------------------------------------------

class _FamilyList:
    """Adapter so prometheus_client's ``generate_latest`` can render a plain list of families."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


_PLAIN_TYPES = {"gauge": "gauge", "counter": "counter", "unknown": "untyped", "untyped": "untyped"}
_LABEL_NAMES: set[str] = set()  # label names seen valid (a name's validity never changes)


def _plain(metric: Metric) -> str | None:
    """Text of a gauge, counter or untyped family whose samples carry no timestamp or
    OpenMetrics-only suffix, as ``generate_latest`` writes it; None for any other family."""
    mtype = _PLAIN_TYPES.get(metric.type)
    if mtype is None:
        return None
    name = metric.name + "_total" if mtype == "counter" else metric.name
    lines = [f"# HELP {name} {escape_help(metric.documentation)}\n# TYPE {name} {mtype}\n"]
    for sample in metric.samples:
        if sample.timestamp is not None or sample.exemplar is not None or sample.name != name:
            return None  # _created and friends, timestamps: left to prometheus_client
        if not _LABEL_NAMES.issuperset(sample.labels):
            if not all(_LEGACY_NAME.fullmatch(k) for k in sample.labels):
                return None  # prometheus_client escapes such names
            _LABEL_NAMES.update(sample.labels)
        pairs = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(sample.labels.items()))
        lines.append(f"{name}{{{pairs}}} {format_value(sample.value)}\n" if pairs else
                     f"{name} {format_value(sample.value)}\n")
    return "".join(lines)


def render(families: Iterable[Metric]) -> bytes:
    """Prometheus text exposition (format 0.0.4) of prometheus_client ``families``.

    The same bytes as prometheus_client's ``generate_latest``, which renders what this does not:
    gauges, counters and untyped families with plain samples are formatted here, a few times
    faster (the exporter's own health metrics are rendered at every scrape).

    >>> from prometheus_client.core import GaugeMetricFamily
    >>> render([GaugeMetricFamily("up", "Up.", value=1)]).decode().splitlines()[-1]
    'up 1.0'
    """
    parts = []
    for metric in families:
        text = _plain(metric) if _LEGACY_NAME.fullmatch(metric.name) else None
        parts.append(text if text is not None else generate_latest(_FamilyList([metric])).decode())
    return "".join(parts).encode()


def _part(source: Source) -> tuple[bytes, bool]:
    """(text of ``source``, whether it is the source's pre-rendered text)."""
    cached = getattr(source, "exposition", None)
    if isinstance(cached, bytes):
        return cached, True
    return render(source.collect()), False


def exposition(sources: Sequence[Source]) -> bytes:
    """Text exposition of every source, using the pre-rendered text where a source has it."""
    return b"".join(_part(source)[0] for source in sources)


# -- the /metrics body ---------------------------------------------------------------------------

def _same(a: tuple[bytes, ...], b: tuple[bytes, ...]) -> bool:
    """True when ``a`` and ``b`` hold the very same bytes objects (a source's text is new when it changed)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class _Whole(NamedTuple):
    """A body rendered ahead, all but its live tail: valid while the pre-rendered parts are ``key`` and
    until ``until``; ``state`` is the compressor after ``gzip`` (sync-flushed), ready for the tail."""

    key: tuple[bytes, ...]
    until: float
    text: bytes
    gzip: bytes
    state: zlib._Compress | None
    """None when there is no live tail: ``gzip`` is then the whole member, served as it is."""


class Body:
    """The /metrics body of ``sources``, plain or gzip, with the gzip work of unchanged parts kept.

    A gzip member is one deflate stream, so the kept state is the compressor after the leading
    run of pre-rendered parts (sync-flushed, so its output so far is complete); a scrape copies
    it and compresses only the rest. The key is the identity of those parts: a source returns
    the same bytes object until its text changes. Thread-safe.
    """

    def __init__(self, sources: Sequence[Source], clock: Callable[[], float] = time.monotonic) -> None:
        self.sources = sources
        self._clock = clock
        self._lock = threading.Lock()
        self._key: tuple[bytes, ...] = ()
        self._head = b""
        self._state: zlib._Compress | None = None
        self._whole: _Whole | None = None
        """The whole body rendered ahead (:meth:`prepare` with ``ahead``), while it is valid."""

    def _parts(self, sources: Sequence[Source]) -> tuple[list[bytes], int]:
        """Every source's text, and how many leading ones are pre-rendered."""
        rendered = [_part(source) for source in sources]
        leading = next((i for i, (_, cached) in enumerate(rendered) if not cached), len(rendered))
        return [text for text, _ in rendered], leading

    def _compressed_head(self, key: tuple[bytes, ...]) -> tuple[bytes, zlib._Compress]:
        """gzip output and compressor state after the parts ``key``, computed once per change."""
        with self._lock:
            if self._state is not None and _same(key, self._key):
                return self._head, self._state.copy()
        state = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
        head = state.compress(b"".join(key)) + state.flush(zlib.Z_SYNC_FLUSH)
        with self._lock:
            self._key, self._head, self._state = key, head, state
            return head, state.copy()

    def _leading(self) -> tuple[bytes, ...]:
        """The leading run of pre-rendered parts (no source after it is asked for its text)."""
        texts: Iterable[Any] = (getattr(source, "exposition", None) for source in self.sources)
        return tuple(itertools.takewhile(lambda text: isinstance(text, bytes), texts))

    def _live(self) -> int:
        """How many trailing sources are ``live``: rendered at every scrape, even into a body rendered ahead."""
        return sum(1 for _ in itertools.takewhile(lambda s: getattr(s, "live", False), reversed(self.sources)))

    def prepare(self, ahead: float = 0.0) -> None:
        """Render and compress the pre-rendered sources now, ahead of a scrape; with ``ahead`` > 0 the per-scrape
        parts too (all but the ``live`` tail), served for up to ``ahead`` seconds (the module docstring says when)."""
        if ahead <= 0:
            self._compressed_head(self._leading())
            return
        made, live = self._clock(), self._live()
        parts, leading = self._parts(self.sources[:len(self.sources) - live])
        key = tuple(parts[:leading])
        head, state = self._compressed_head(key)
        rest = state.compress(b"".join(parts[leading:])) + state.flush(zlib.Z_SYNC_FLUSH if live else zlib.Z_FINISH)
        whole = _Whole(key, made + ahead, b"".join(parts), head + rest, state if live else None)
        with self._lock:
            self._whole = whole

    def invalidate(self) -> None:
        """Forget the whole body rendered ahead: the next scrape renders its per-scrape parts again."""
        with self._lock:
            self._whole = None

    def _prepared(self) -> _Whole | None:
        """The whole body rendered ahead, if it is still the body of now."""
        whole = self._whole
        if whole is not None and (self._clock() > whole.until or not _same(self._leading(), whole.key)):
            with self._lock:
                if self._whole is whole:
                    self._whole = None
            return None
        return whole

    def text(self) -> bytes:
        """The plain body."""
        whole = self._prepared()
        if whole is None:
            return exposition(self.sources)
        if whole.state is None:
            return whole.text
        return whole.text + exposition(self.sources[len(self.sources) - self._live():])

    def gzip(self) -> bytes:
        """The body as one gzip member."""
        whole = self._prepared()
        if whole is not None:
            if whole.state is None:
                return whole.gzip
            state = whole.state.copy()
            tail = exposition(self.sources[len(self.sources) - self._live():])
            return whole.gzip + state.compress(tail) + state.flush()
        parts, leading = self._parts(self.sources)
        head, state = self._compressed_head(tuple(parts[:leading]))
        return head + state.compress(b"".join(parts[leading:])) + state.flush()

    def encode(self, accept_encoding: str | None) -> tuple[bytes, str | None]:
        """(body, Content-Encoding): gzip when ``accept_encoding`` accepts it, else the plain text."""
        if accept_encoding and gzip_accepted(accept_encoding):
            return self.gzip(), "gzip"
        return self.text(), None


class ScrapeForecast:
    """When the next scrape is due, from each scraper's last two arrivals.

    Prometheus scrapes a target at a fixed interval; after a poll, :meth:`due_within` tells
    whether some scraper is expected before the next poll, so the body can be prepared now.
    Scrapers are told apart by address (an HA pair scrapes from two hosts); at most
    ``MAX_SCRAPERS`` are remembered, the oldest forgotten first. A scraper that stays away
    longer than its interval plus ``seconds`` stops being expected.

    >>> now = [0.0]
    >>> f = ScrapeForecast(clock=lambda: now[0])
    >>> for t in (0.0, 15.0): now[0] = t; f.arrived("10.0.0.1")
    >>> now[0] = 28.5; f.due_within(1.0)
    False
    >>> now[0] = 29.2; f.due_within(1.0)
    True
    >>> now[0] = 31.5; f.due_within(1.0)
    False
    """

    MAX_SCRAPERS = 8

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._scrapers: dict[str, tuple[float, float]] = {}  # address -> (last arrival, interval)

    def arrived(self, address: str) -> None:
        """Record a scrape from ``address`` now."""
        now = self._clock()
        with self._lock:
            last = self._scrapers.pop(address, None)
            self._scrapers[address] = (now, now - last[0] if last is not None else math.inf)
            if len(self._scrapers) > self.MAX_SCRAPERS:
                del self._scrapers[next(iter(self._scrapers))]

    def due_within(self, seconds: float) -> bool:
        """True when a scraper's next scrape is due from ``seconds`` ago to ``seconds`` from now."""
        now = self._clock()
        with self._lock:
            return any(abs(last + interval - now) <= seconds for last, interval in self._scrapers.values())
