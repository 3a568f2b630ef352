"""Prometheus text exposition of the exporter's metric sources, gzip-compressed when the scraper asks.

The HTTP server knows its metric sources only through the :class:`Source` protocol; polling
collectors keep a pre-rendered ``exposition`` so a scrape costs no
rendering when nothing changed. This module imports nothing of the exporter, so collectors,
the server and the tests can all use it.

Example::

    body = exposition(sources)
    body, encoding = encode(body, request.headers.get("Accept-Encoding"))
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Sequence
from typing import Protocol

from prometheus_client.exposition import generate_latest, gzip_accepted
from prometheus_client.metrics_core import Metric

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"
GZIP_LEVEL = 6
"""zlib's default: a 100 kB scrape compresses about 10x in about a millisecond."""


class Source(Protocol):
    """Anything with ``collect()`` (the prometheus_client Collector protocol).

    A source may also carry ``exposition``, the bytes of its latest metrics rendered once per
    change (polling collectors do); :func:`exposition` uses that text instead of rendering.
    """

    def collect(self) -> Iterable[Metric]: ...


class _FamilyList:
    """Adapter so prometheus_client's ``generate_latest`` can render a plain list of families."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(families: Iterable[Metric]) -> bytes:
    """Prometheus text exposition (format 0.0.4) of ``families``.

    >>> from prometheus_client.core import GaugeMetricFamily
    >>> render([GaugeMetricFamily("up", "Up.", value=1)]).decode().splitlines()[-1]
    'up 1.0'
    """
    return generate_latest(_FamilyList(families))


def exposition(sources: Sequence[Source]) -> bytes:
    """Text exposition of every source, using the pre-rendered text where a source has it."""
    parts = []
    for source in sources:
        cached = getattr(source, "exposition", None)
        parts.append(cached if isinstance(cached, bytes) else render(source.collect()))
    return b"".join(parts)


def encode(body: bytes, accept_encoding: str | None) -> tuple[bytes, str | None]:
    """(body, Content-Encoding): gzip when ``accept_encoding`` accepts it, else the body as is.

    >>> encode(b"up 1\\n", "gzip, deflate")[1]
    'gzip'
    >>> encode(b"up 1\\n", None)
    (b'up 1\\n', None)
    """
    if accept_encoding and gzip_accepted(accept_encoding):
        return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0), "gzip"
    return body, None
