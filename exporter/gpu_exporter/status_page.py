"""The live status page at ``/`` and its JSON at ``/api/v1/status``: no Grafana needed to see why a GPU idles.

A user running the exporter beside a training job otherwise has only the ``/metrics`` text. This
page shows, per GPU, the utilization averaged over the last :data:`WINDOW_SECONDS` against the
levels' lines (:mod:`gpu_exporter.verdict.levels`, sent in the JSON), its effective utilization beside it
(SM activity from GPM, against ``sm_active_low``; "SM activity unknown" without a source), the memory and the processes
holding it, the training runs on it with their phase shares, and the verdict with its remedy,
judged exactly as ``gpu-exporter diagnose --url`` judges (one adapter, :func:`judge_node`, calls
the verdict package's join and ladder).

Python serves the data (the JSON) and a static shell with the first document embedded; the
page's script (status_page.js) draws every card from the JSON, at load and every two seconds;
no framework, no external assets. The readings come from the collectors in this process (their
metric families, built from the rows of their last poll; no exposition text is parsed back), at
most once per :data:`REFRESH_SECONDS` whatever the number of viewers, and, once the page has been
viewed, after every poll (:meth:`StatusPage.record`, at most once per :data:`RECORD_SECONDS`), so a
view after minutes unvisited still judges the last :data:`WINDOW_SECONDS`, not the minutes. It never calls NVML and
takes no lock that ``/metrics`` takes. The HTTP server owns one :class:`StatusPage`. Example::

    page = StatusPage(lambda: (family for source in sources for family in source.collect()))
    body, content_type = page.respond("/api/v1/status")
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any

from gpu_exporter import catalog
from gpu_exporter.training.protocol import phase_order

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from gpu_exporter.thresholds import Thresholds
    from gpu_exporter.verdict.samples import Snapshot
    from gpu_exporter.verdict.views import GpuView, Verdict

STATUS_PATH = "/api/v1/status"
"""The JSON endpoint the page polls (same auth as ``/metrics``)."""
WINDOW_SECONDS = 30.0
"""Utilization and phase shares are means over (up to) this many seconds of readings."""
REFRESH_SECONDS = 1.0
"""The status is recomputed at most this often; viewers in between get the cached answer."""
RECORD_SECONDS = WINDOW_SECONDS / 10
"""Between views, the poller's readings are kept at most this often (the window's oldest is then
at most this much younger than :data:`WINDOW_SECONDS`)."""
POLL_MILLISECONDS = 2000
"""How often the page's script polls :data:`STATUS_PATH`."""


def judge_node(prev: Snapshot | None, cur: Snapshot, t: Thresholds, window_seconds: float
               ) -> list[tuple[GpuView, Verdict]]:
    """The one adapter to the cause engine: each GPU's view and verdict between two readings.

    ``prev`` None (a single reading so far): utilization is the exporter's mean over its last
    poll interval (``gpu_utilization_ratio``) and phase shares are the runs' totals.
    """
    from gpu_exporter.verdict.readings import from_snapshots
    from gpu_exporter.verdict.timeline import judged

    readings = from_snapshots(prev if prev is not None else cur, cur)
    if prev is None:
        readings.utilization = {labels.get("uuid", ""): min(max(value, 0.0), 1.0)
                                for labels, value in cur.series(catalog.GPU_UTILIZATION_RATIO.name)}
    return judged(readings, t, window_seconds)


def build_status(prev: Snapshot | None, cur: Snapshot, t: Thresholds) -> dict[str, Any]:
    """The page's JSON document for readings ``prev`` (or None) and ``cur``."""
    from gpu_exporter.verdict import ranks
    from gpu_exporter.verdict.levels import describe

    measured = cur.at - prev.at if prev is not None else 0.0
    judged = judge_node(prev, cur, t, measured)
    gpus = [{
        "index": view.gpu, "uuid": view.uuid, "name": view.name,
        "utilization": view.utilization,
        "sm_active": view.sm_active, "sm_source": view.sm_source, "tensor_active": view.tensor_active,
        "dram_active": view.dram_active,
        "memory_used_bytes": cur.value(catalog.GPU_MEMORY_USED_BYTES.name, uuid=view.uuid),
        "memory_total_bytes": cur.value(catalog.GPU_MEMORY_TOTAL_BYTES.name, uuid=view.uuid),
        "memory_used_ratio": view.memory_used_ratio,
        "processes": [{"pid": p.pid, "name": p.name, "memory_bytes": p.memory_bytes} for p in view.process_list],
        "pods": list(view.pods),
        "runs": [{"run": r.run, "rank": r.rank, "live": r.live, "since_start": r.since_start,
                  "phases": [[p, r.shares[p]] for p in phase_order(r.shares)]} for r in view.runs],
        "verdict": {"verdict": verdict.name, "title": verdict.title, "code": verdict.code,
                    "level": verdict.level, "reason": verdict.reason, "remedy": verdict.remedy,
                    "runbook": verdict.runbook, "below_target": verdict.below_target,
                    "effective": verdict.effective, "worth": verdict.worth,
                    "idle": None if verdict.idle is None else verdict.idle.text()},
    } for view, verdict in judged]
    return {
        "generated_at": cur.wall,
        "measured_seconds": round(measured, 3),
        "window_seconds": WINDOW_SECONDS,
        "thresholds": {"utilization_low_threshold": t.utilization_low_threshold,
                       "utilization_target": t.utilization_target, "sm_active_low": t.sm_active_low},
        "levels": describe(t),
        "gpus": gpus,
        "distributed_runs": ranks.to_doc(ranks.distributed_runs(judged)),
    }


class StatusPage:
    """Readings kept for the page, and the page and JSON rendered from them.

    ``read_families`` returns the collectors' current metric families (what ``/metrics`` shows).
    """

    def __init__(self, read_families: Callable[[], Iterable[Metric]], thresholds: Thresholds | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 metrics_path: str = "/metrics") -> None:
        self._read_families = read_families
        self._metrics_path = metrics_path
        self._thresholds = thresholds
        self._clock = clock
        self._wall = wall
        self._history: deque[Snapshot] = deque()
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def _read(self) -> Snapshot:
        from gpu_exporter.verdict.samples import Snapshot, snapshot_of

        now, wall = self._clock(), self._wall()
        read = snapshot_of(self._read_families(), now, wall)
        age = read.value(catalog.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.name)
        return Snapshot(read.samples, at=now - (age or 0.0), wall=wall)

    def _keep(self, cur: Snapshot) -> None:
        """Add ``cur`` to the history and drop what lies outside the window (the lock is held)."""
        poll = cur.value(catalog.GPU_EXPORTER_POLL_INTERVAL_SECONDS.name) or 1.0
        if self._history and cur.at - self._history[-1].at < poll / 2:
            self._history.pop()  # the same poll as the newest reading: keep the newer reading of it
        self._history.append(cur)
        while len(self._history) > 2 and cur.at - self._history[1].at >= WINDOW_SECONDS:
            self._history.popleft()
        # a reading from before a gap (no poll and no view for longer than the window) would make
        # the "last window" a mean over the gap: drop it; the view then judges the last poll alone
        while len(self._history) > 1 and cur.at - self._history[0].at > WINDOW_SECONDS + max(poll, RECORD_SECONDS):
            self._history.popleft()

    def record(self) -> None:
        """Keep a reading of the collectors' current families (called after each poll).

        At most once per :data:`RECORD_SECONDS`; views in between add theirs (:meth:`status`).
        """
        with self._lock:
            if self._history and self._clock() - self._history[-1].at < RECORD_SECONDS:
                return
            self._keep(self._read())

    def status(self) -> dict[str, Any]:
        """The current status document (recomputed at most every :data:`REFRESH_SECONDS`)."""
        with self._lock:
            now = self._clock()
            if self._cached is not None and now - self._cached[0] < REFRESH_SECONDS:
                return self._cached[1]
            if self._thresholds is None:
                from gpu_exporter.thresholds import load_thresholds

                self._thresholds = load_thresholds()
            cur = self._read()
            self._keep(cur)
            prev = self._history[0] if len(self._history) > 1 else None
            doc = build_status(prev, cur, self._thresholds)
            self._cached = (now, doc)
            return doc

    def json(self) -> bytes:
        """The status as JSON."""
        return json.dumps(self.status(), separators=(",", ":")).encode()

    def html(self) -> bytes:
        """The static shell with the current status embedded; the script draws the cards from it."""
        embedded = self.json().decode().replace("<", "\\u003c")  # no "</script>" inside the script element
        template = resources.files("gpu_exporter").joinpath("status_page.html").read_text()
        script = resources.files("gpu_exporter").joinpath("status_page.js").read_text()
        page = (template.replace("{{STATUS_PATH}}", STATUS_PATH)
                .replace("{{METRICS_PATH}}", html.escape(self._metrics_path, quote=True))
                .replace("{{POLL_MILLISECONDS}}", str(POLL_MILLISECONDS))
                .replace("{{STATUS}}", embedded)
                .replace("{{SCRIPT}}", script))
        return page.encode()

    def respond(self, path: str) -> tuple[bytes, str]:
        """(body, content type) for ``/`` or :data:`STATUS_PATH`."""
        if path == STATUS_PATH:
            return self.json(), "application/json"
        return self.html(), "text/html; charset=utf-8"

