"""The exporter under sustained load: many scrapers and many training pushers at once.

One gpu-exporter process (simulated NVML through the bench's metered ``sitecustomize.py``, see
bench/scrape.py) serves ``scrapers`` clients that each scrape ``/metrics`` ``scrape_rate`` times
a second, while ``pushers`` training runs each push a snapshot every ``push_interval`` seconds,
for ``seconds``. Clients run in worker processes (so the bench's own GIL does not throttle them),
on fresh connections, with Prometheus's headers. Any answer other than 200 (scrape) or 202
(push), and any connection error or timeout, is an error. Example::

    result = measure_load(spec, LoadPlan(seconds=300))
    print(result.errors, result.scrape_p99_ms, result.rss_start_mb, result.rss_end_mb)
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from threading import Thread

import psutil

from bench.scrape import MB, PROMETHEUS_HEADERS, ExporterSpec, percentile, started

WORKERS = 4
"""Client processes; scrapers and pushers are spread over them as threads."""


@dataclass(frozen=True)
class LoadPlan:
    """How much load, for how long (the defaults are the issue's: 16 x 10/s scrapes, 32 pushers every 0.5 s)."""

    seconds: float
    scrapers: int = 16
    scrape_rate: float = 10.0
    pushers: int = 32
    push_interval: float = 0.5


@dataclass(frozen=True)
class LoadResult:
    """What the load did to the exporter."""

    plan: LoadPlan
    scrapes: int
    pushes: int
    errors: int
    first_errors: tuple[str, ...]
    scrape_p50_ms: float
    scrape_p99_ms: float
    scrape_max_ms: float
    push_p99_ms: float
    rss_start_mb: float
    rss_end_mb: float
    cpu_s_per_min: float


def _request(port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, float]:
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - started
    finally:
        conn.close()


def _client(port: int, kind: str, index: int, plan: LoadPlan, start_at: float,
            out: list[tuple[str, float, str]]) -> None:
    """One scraper or pusher: requests on schedule until the plan's end; appends (kind, seconds, error)."""
    period = 1 / plan.scrape_rate if kind == "scrape" else plan.push_interval
    offset = period * index / (plan.scrapers if kind == "scrape" else plan.pushers)  # spread the clients out
    started_at = time.time()
    n = 0
    while True:
        due = start_at + offset + n * period
        if due >= start_at + plan.seconds or time.monotonic() >= start_at + plan.seconds:
            return  # a client that falls behind its schedule (a saturated machine) stops on time too
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        n += 1
        try:
            if kind == "scrape":
                status, took = _request(port, "GET", "/metrics", None, PROMETHEUS_HEADERS)
                ok = status == 200
            else:
                elapsed = time.monotonic() - start_at
                body = json.dumps({
                    "version": 1, "run": f"load-{os.getpid()}-{index}", "rank": "0", "uuid": "",
                    "started_at": started_at, "phases": {"data": 0.2 * elapsed, "compute": 0.7 * elapsed,
                                                         "metrics": 0.05 * elapsed, "other": 0.05 * elapsed},
                    "current_phase": "compute", "steps": n, "samples": 32 * n, "batch_size": 32}).encode()
                status, took = _request(port, "POST", "/api/v1/training", body,
                                        {"Content-Type": "application/json"})
                ok = status == 202
            out.append((kind, took, "" if ok else f"{kind}: HTTP {status}"))
        except (OSError, http.client.HTTPException) as err:
            out.append((kind, float("nan"), f"{kind}: {type(err).__name__}: {err}"))


def _worker(port: int, jobs: list[tuple[str, int]], plan: LoadPlan, start_at: float) -> list[tuple[str, float, str]]:
    out: list[tuple[str, float, str]] = []
    threads = [Thread(target=_client, args=(port, kind, i, plan, start_at, out)) for kind, i in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def measure_load(spec: ExporterSpec, plan: LoadPlan) -> LoadResult:
    """Start ``spec``, apply ``plan``'s load, and report errors, latency, memory and CPU."""
    jobs = [("scrape", i) for i in range(plan.scrapers)] + [("push", i) for i in range(plan.pushers)]
    with started(spec) as running:
        ps = psutil.Process(running.proc.pid)
        rss_start = ps.memory_info().rss / MB
        cpu0 = sum(ps.cpu_times()[:2])
        start_at = time.monotonic() + 1.0
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(WORKERS, mp_context=context) as pool:
            futures = [pool.submit(_worker, running.port, jobs[w::WORKERS], plan, start_at) for w in range(WORKERS)]
            samples = [s for f in futures for s in f.result()]
        cpu1 = sum(ps.cpu_times()[:2])
        rss_end = ps.memory_info().rss / MB
        running.check_alive("under load")
    errors = [e for _, _, e in samples if e]
    scrapes = sorted(t * 1000 for k, t, e in samples if k == "scrape" and not e)
    pushes = sorted(t * 1000 for k, t, e in samples if k == "push" and not e)
    return LoadResult(
        plan=plan, scrapes=sum(1 for k, _, _ in samples if k == "scrape"),
        pushes=sum(1 for k, _, _ in samples if k == "push"), errors=len(errors),
        first_errors=tuple(dict.fromkeys(errors))[:3],
        scrape_p50_ms=percentile(scrapes, 50) if scrapes else float("nan"),
        scrape_p99_ms=percentile(scrapes, 99) if scrapes else float("nan"),
        scrape_max_ms=max(scrapes, default=float("nan")),
        push_p99_ms=percentile(pushes, 99) if pushes else float("nan"),
        rss_start_mb=rss_start, rss_end_mb=rss_end, cpu_s_per_min=(cpu1 - cpu0) / plan.seconds * 60)
