"""The live status page at ``/`` and its JSON at ``/api/v1/status``: no Grafana needed to see why a GPU idles.

A user running the exporter beside a training job otherwise has only the ``/metrics`` text. This
page shows, per GPU, the utilization averaged over the last :data:`WINDOW_SECONDS` against the
``utilization_low_threshold`` line and the ``utilization_target`` (both from thresholds.yml), the
memory and the processes holding it, the training runs on it with their phase shares, and the
verdict with its remedy, judged exactly as ``gpu-exporter diagnose --url`` judges (one adapter,
:func:`judge_node`, calls diagnose's joins and the cause table of :mod:`gpu_exporter.causes`).

It is server-rendered HTML (readable without JavaScript) plus a small script that polls the JSON
every two seconds and redraws; no framework, no external assets. It reads only what the exporter
already holds in memory: the same exposition text a scrape gets (pre-rendered once per poll by the
collectors), parsed at most once per :data:`REFRESH_SECONDS` whatever the number of viewers. It
never calls NVML and takes no lock that ``/metrics`` takes. Example::

    page = StatusPage(lambda: exposition(sources))
    html, json_text = page.html(), page.json()
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

if TYPE_CHECKING:
    from gpu_exporter.thresholds import Thresholds
    from gpu_exporter.verdict.samples import Snapshot
    from gpu_exporter.verdict.views import GpuView, Verdict

STATUS_PATH = "/api/v1/status"
"""The JSON endpoint the page polls (same auth as ``/metrics``)."""
WINDOW_SECONDS = 30.0
"""Utilization and phase shares are means over (up to) this many seconds of readings."""
REFRESH_SECONDS = 1.0
"""The status is recomputed at most this often; viewers in between get the cached answer."""
POLL_MILLISECONDS = 2000
"""How often the page's script polls :data:`STATUS_PATH`."""
PHASES = ("data", "compute", "metrics", "checkpoint", "other")
"""Phase order on the page (custom phases follow)."""
_GIB = 2.0 ** 30


def judge_node(prev: Snapshot | None, cur: Snapshot, t: Thresholds, window_seconds: float
               ) -> list[tuple[GpuView, Verdict]]:
    """The one adapter to the cause engine: each GPU's view and verdict between two readings.

    ``prev`` None (a single reading so far): utilization is the exporter's mean over its last
    poll interval (``gpu_utilization_ratio``) and phase shares are the runs' totals.
    """
    from gpu_exporter.verdict.join import build_views
    from gpu_exporter.verdict.ladder import judge
    from gpu_exporter.verdict.readings import from_snapshots

    readings = from_snapshots(prev if prev is not None else cur, cur)
    if prev is None:
        readings.utilization = {labels.get("uuid", ""): min(max(value, 0.0), 1.0)
                                for labels, value in cur.series("gpu_utilization_ratio")}
    return [(view, judge(view, t)) for view in build_views(readings, t, window_seconds)]


def _phase_order(shares: dict[str, float]) -> list[str]:
    return [p for p in PHASES if p in shares] + sorted(p for p in shares if p not in PHASES)


def build_status(prev: Snapshot | None, cur: Snapshot, t: Thresholds) -> dict[str, Any]:
    """The page's JSON document for readings ``prev`` (or None) and ``cur``."""
    from gpu_exporter.verdict import ranks

    measured = cur.at - prev.at if prev is not None else 0.0
    gpus = []
    judged = judge_node(prev, cur, t, measured)
    for view, verdict in judged:
        total = cur.value("gpu_memory_total_bytes", uuid=view.uuid)
        used = cur.value("gpu_memory_used_bytes", uuid=view.uuid)
        gpus.append({
            "index": view.gpu, "uuid": view.uuid, "name": view.name,
            "utilization": view.utilization,
            "memory_used_bytes": used, "memory_total_bytes": total, "memory_used_ratio": view.memory_used_ratio,
            "processes": [{"pid": p.pid, "name": p.name, "memory_bytes": p.memory_bytes} for p in view.process_list],
            "pods": list(view.pods),
            "runs": [{"run": r.run, "rank": r.rank, "live": r.live, "since_start": r.since_start,
                      "phases": [[p, r.shares[p]] for p in _phase_order(r.shares)]} for r in view.runs],
            "verdict": {"verdict": verdict.verdict, "title": verdict.title, "code": verdict.code,
                        "level": verdict.level, "reason": verdict.reason, "remedy": verdict.remedy,
                        "runbook": verdict.runbook, "below_target": verdict.below_target},
        })
    return {
        "generated_at": cur.wall,
        "measured_seconds": round(measured, 3),
        "window_seconds": WINDOW_SECONDS,
        "thresholds": {"utilization_low_threshold": t.utilization_low_threshold,
                       "utilization_target": t.utilization_target},
        "gpus": gpus,
        "distributed_runs": ranks.to_doc(ranks.distributed_runs(judged)),
    }


class StatusPage:
    """Readings kept for the page, and the page and JSON rendered from them.

    ``read_text`` returns the exporter's current exposition (what ``/metrics`` serves).
    """

    def __init__(self, read_text: Callable[[], bytes], thresholds: Thresholds | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 metrics_path: str = "/metrics") -> None:
        self._read_text = read_text
        self._metrics_path = metrics_path
        self._thresholds = thresholds
        self._clock = clock
        self._wall = wall
        self._history: deque[Snapshot] = deque()
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def _read(self) -> Snapshot:
        from prometheus_client.parser import text_string_to_metric_families

        from gpu_exporter.verdict.samples import Snapshot, snapshot_of

        now, wall = self._clock(), self._wall()
        parsed = snapshot_of(text_string_to_metric_families(self._read_text().decode("utf-8", "replace")), now, wall)
        age = parsed.value("gpu_exporter_last_sample_age_seconds")
        return Snapshot(parsed.samples, at=now - (age or 0.0), wall=wall)

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
            poll = cur.value("gpu_exporter_poll_interval_seconds") or 1.0
            if self._history and cur.at - self._history[-1].at < poll / 2:
                self._history.pop()  # the same poll as the newest reading: keep the newer scrape of it
            self._history.append(cur)
            while len(self._history) > 2 and cur.at - self._history[1].at >= WINDOW_SECONDS:
                self._history.popleft()
            prev = self._history[0] if len(self._history) > 1 else None
            doc = build_status(prev, cur, self._thresholds)
            self._cached = (now, doc)
            return doc

    def json(self) -> bytes:
        """The status as JSON."""
        return json.dumps(self.status(), separators=(",", ":")).encode()

    def html(self) -> bytes:
        """The whole page: the status rendered into the template, with the polling script inline."""
        doc = self.status()
        template = resources.files("gpu_exporter").joinpath("status_page.html").read_text()
        script = resources.files("gpu_exporter").joinpath("status_page.js").read_text()
        page = (template.replace("{{SUMMARY}}", render_summary(doc))
                .replace("{{GPUS}}", "".join(render_gpu(g, doc["thresholds"]) for g in doc["gpus"]))
                .replace("{{RUNS}}", "".join(render_distributed_run(d) for d in doc["distributed_runs"]))
                .replace("{{STATUS_PATH}}", STATUS_PATH)
                .replace("{{METRICS_PATH}}", html.escape(self._metrics_path, quote=True))
                .replace("{{POLL_MILLISECONDS}}", str(POLL_MILLISECONDS))
                .replace("{{SCRIPT}}", script))
        return page.encode()


# --- server-side rendering (status_page.js draws the same markup from the JSON) ----------------

def _pct(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio * 100:.0f}%"


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def render_summary(doc: dict[str, Any]) -> str:
    """The line above the GPUs: the averaging window and the two thresholds."""
    t = doc["thresholds"]
    measured = doc["measured_seconds"]
    basis = f"mean over the last {measured:.0f} s" if measured > 0 else "the exporter's last poll interval"
    return (f"Utilization: {basis} (up to {doc['window_seconds']:.0f} s). Below "
            f"{_pct(t['utilization_low_threshold'])} is low; the target is {_pct(t['utilization_target'])}.")


def _level(utilization: float | None, t: dict[str, float]) -> str:
    if utilization is None:
        return "unknown"
    if utilization < t["utilization_low_threshold"]:
        return "low"
    return "below" if utilization < t["utilization_target"] else "ok"


def render_gpu(g: dict[str, Any], t: dict[str, float]) -> str:
    """One GPU's card (the markup status_page.js's ``gpuCard`` also produces)."""
    util = g["utilization"]
    bar = (f'<div class="bar util {_level(util, t)}"><span style="width:{(util or 0) * 100:.1f}%"></span>'
           f'<i class="line low" style="left:{t["utilization_low_threshold"] * 100:.1f}%" '
           f'title="low: {_pct(t["utilization_low_threshold"])}"></i>'
           f'<i class="line target" style="left:{t["utilization_target"] * 100:.1f}%" '
           f'title="target: {_pct(t["utilization_target"])}"></i></div>')
    used, total = g["memory_used_bytes"], g["memory_total_bytes"]
    memory = (f"{used / _GIB:.1f} of {total / _GIB:.0f} GiB ({_pct(g['memory_used_ratio'])})"
              if used is not None and total else "n/a")
    procs = "".join(f"<li>pid {_esc(p['pid'])} <b>{_esc(p['name'])}</b> {p['memory_bytes'] / _GIB:.1f} GiB</li>"
                    for p in g["processes"]) or "<li class=none>no processes</li>"
    runs = "".join(_render_run(r) for r in g["runs"]) or '<p class="none">no training run reports here</p>'
    v = g["verdict"]
    code = f' <span class="code">{_esc(v["code"])}</span>' if v["code"] else ""
    remedy = f'<p class="remedy">{_esc(v["remedy"])}</p>' if v["remedy"] else ""
    runbook = f'<a href="{_esc(v["runbook"])}">runbook</a>' if v["runbook"] else ""
    return (f'<section class="gpu" data-uuid="{_esc(g["uuid"])}">'
            f'<h2>GPU {_esc(g["index"])} <small>{_esc(g["name"])} &middot; {_esc(g["uuid"])}</small></h2>'
            f'<div class="row"><span class="label">utilization</span>{bar}<b class="num">{_pct(util)}</b></div>'
            f'<div class="row"><span class="label">memory</span>{memory}</div>'
            f'<ul class="procs">{procs}</ul>{runs}'
            f'<div class="verdict {_esc(v["verdict"])}{" bad" if v["below_target"] else ""}">'
            f'<p class="title">{_esc(v["title"])}{code}</p><p class="reason">{_esc(v["reason"])}</p>'
            f'{remedy}{runbook}</div></section>')


def _render_run(r: dict[str, Any]) -> str:
    parts = "".join(f'<span class="ph {_esc(p)}" style="width:{s * 100:.1f}%" title="{_esc(p)} {_pct(s)}"></span>'
                    for p, s in r["phases"])
    legend = " ".join(f'<i class="ph {_esc(p)}"></i>{_esc(p)} {_pct(s)}' for p, s in r["phases"])
    state = ("" if r["live"] else " (finished or stopped)") + (" since start" if r["since_start"] else "")
    return (f'<div class="run"><span class="label">run <b>{_esc(r["run"])}</b> rank {_esc(r["rank"])}{state}</span>'
            f'<div class="bar phases">{parts}</div><span class="legend">{legend}</span></div>')


def _step(value: float | None) -> str:
    return "" if value is None else f"{value:.3g} s"


def render_distributed_run(d: dict[str, Any]) -> str:
    """A distributed run's ranks side by side (the markup status_page.js's ``distributedRun`` also produces)."""
    rows = "".join(
        f'<tr{" class=straggler" if r["rank"] == d["straggler"] else ""}><td>{_esc(r["rank"])}</td>'
        f'<td>GPU {_esc(r["gpu"])}{" on " + _esc(r["node"]) if r["node"] else ""}</td><td>'
        + ", ".join(f"{_esc(p)} {_pct(v)}" for p, v in sorted(r["shares"].items(), key=lambda pv: -pv[1])
                    if v >= 0.005)
        + f'</td><td>{_step(r["step_seconds"])}</td><td>{_esc(r["verdict"])}</td></tr>' for r in d["ranks"])
    if d["straggler"] is None:
        said = "no straggler: no rank waits for another beyond the straggler threshold"
    else:
        kept_up = (f"; the run's step takes {_step(d['step_seconds'])}, ~{_step(d['projected_step_seconds'])} if "
                   f"rank {d['straggler']} kept up" if d["projected_step_seconds"] is not None else "")
        said = f"straggler rank {d['straggler']}: {d['straggler_cause']}{kept_up}"
    return (f'<section class="ddp" data-run="{_esc(d["run"])}"><h2>Run {_esc(d["run"])} <small>'
            f'{d["ranks_reporting"]} of {d["world_size"]} ranks</small></h2><table><tr><th>rank</th><th>GPU</th>'
            f"<th>phases</th><th>step</th><th>verdict</th></tr>{rows}</table><p>{_esc(said)}</p></section>")


_PAGES: WeakKeyDictionary[object, StatusPage] = WeakKeyDictionary()
_PAGES_LOCK = threading.Lock()


def respond(owner: object, path: str, read_text: Callable[[], bytes], metrics_path: str = "/metrics"
            ) -> tuple[bytes, str]:
    """(body, content type) for ``/`` or :data:`STATUS_PATH`; one :class:`StatusPage` per ``owner``
    (the HTTP server), created on first use so that the serve path loads none of this until then."""
    with _PAGES_LOCK:
        page = _PAGES.get(owner)
        if page is None:
            page = _PAGES[owner] = StatusPage(read_text, metrics_path=metrics_path)
    if path == STATUS_PATH:
        return page.json(), "application/json"
    return page.html(), "text/html; charset=utf-8"


def paths() -> Sequence[str]:
    """The routes this module answers."""
    return ("/", STATUS_PATH)
