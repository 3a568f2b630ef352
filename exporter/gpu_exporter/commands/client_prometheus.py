"""Prometheus's HTTP API: instant queries (now or at a given time), many at once, range queries and raw samples,
each answer checked and parsed into (labels, value) or (labels, series) pairs.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpu_exporter.commands.client_http import Connection, MetricsError, fetch, normalize_url
from gpu_exporter.verdict.samples import Labels

Series = list[tuple[float, float]]
"""(Unix seconds, value) pairs of one range-query series."""


GET_LIMIT = 4096
"""The longest query string sent in a URL. A longer one (a matcher that lists many runs) is POSTed as a form, as the
Prometheus HTTP API also takes it: proxies in front of Prometheus commonly refuse URLs over 8 KiB."""


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
        """TLS and credentials (:func:`~gpu_exporter.commands.client_cli.connection`): Thanos, Mimir, AMP, GMP."""

    def at_time(self, at: float | None) -> Prometheus:
        return Prometheus(self.base, self.timeout, at, self.connection)

    def _data(self, path: str, params: dict[str, str], expr: str, kind: str) -> list[dict[str, Any]]:
        form = urllib.parse.urlencode(params)
        long = len(form) > GET_LIMIT
        url = f"{self.base}/api/v1/{path}" + ("" if long else f"?{form}")
        body = fetch(url, "Prometheus server", self.timeout, self.connection, form if long else None)
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
        return [(item["metric"], float(item["value"][1])) for item in self._data("query", params, expr, "vector")]

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
        if not self.query(f"count(last_over_time({metric}[{window}]))"):
            raise MetricsError(f"Prometheus at {self.base} has no {metric} series in the last {window}: "
                               "is it scraping a gpu-exporter (see its Targets page)?")
