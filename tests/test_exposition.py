"""The scrape path renders straight from rows: same bytes as prometheus_client, gzip state reused, nothing stale.

The text must stay what prometheus_client's ``generate_latest`` writes for the same families
(docs/metrics.md, promtool and every parser were checked against that), so each renderer here
is compared with it on the same data; and every cache must give way to a change.
"""

from __future__ import annotations

import gzip
import json
import math
import time
import urllib.request
import zlib
from typing import Any

import pytest
from gpu_exporter.collectors.base import Discovery, Families
from gpu_exporter.collectors.xid import XidCollector
from gpu_exporter.exposition import Body, Family, ScrapeForecast, Source, exposition, render
from gpu_exporter.ingest import IngestSettings, TrainingStore
from harness import Harness, scenario_path
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from testbed import run_exporter

AWKWARD_VALUES = [0, 1, -1, 0.1, 1e-9, 123456.789, 999999.5, 1e6, 85899345920, 2**63, 1.5e16, 1e300, -2.5e10,
                  math.inf, -math.inf, math.nan, True, 7]
AWKWARD_LABELS = ["", "plain", 'quo"te', "back\\slash", "new\nline", "ünï©ødé", "{a=\"b\"}", " spaced "]


@pytest.mark.parametrize("kind", ["gauge", "counter"])
def test_family_text_is_what_prometheus_client_writes(kind: str) -> None:
    labels = ("uuid", "gpu", "a_label", "pid")  # not sorted: the text sorts label names
    rows = [([AWKWARD_LABELS[i % len(AWKWARD_LABELS)], str(i), AWKWARD_LABELS[-1 - i % len(AWKWARD_LABELS)], "9"],
             value) for i, value in enumerate(AWKWARD_VALUES)]
    help_text = 'Help with a back\\slash,\na newline and "quotes".'
    theirs = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)("gpu_thing", help_text, labels=labels)
    for values, value in rows:
        theirs.add_metric(values, value)
    family = Family("gpu_thing", kind, help_text, labels)
    assert family.render(rows).encode() == render([theirs])
    assert family.render(rows).encode() == render([theirs])  # again, from the kept prefixes


def test_family_forgets_series_that_are_gone_and_formats_new_ones() -> None:
    family = Family("gpu_x", "gauge", "X.", ("pid",))
    family.render([(["1"], 1), (["2"], 2)])
    assert family.render([(["2"], 5), (["3"], 6)]) == (
        '# HELP gpu_x X.\n# TYPE gpu_x gauge\ngpu_x{pid="2"} 5.0\ngpu_x{pid="3"} 6.0\n')
    assert len(family._prefixes) == 2  # pid 1 is gone
    with pytest.raises(ValueError, match="label values"):
        family.render([(["1", "extra"], 1)])


def test_unlabelled_family() -> None:
    theirs = CounterMetricFamily("gpu_exporter_things", "Things.", value=3)
    assert Family("gpu_exporter_things", "counter", "Things.", ()).render([((), 3)]).encode() == render([theirs])


def test_polling_collectors_render_what_their_families_render() -> None:
    with Harness("default.yaml") as h:
        for _ in range(3):
            for collector in h.collectors:
                assert collector.exposition == render(list(collector.collect())), collector.name
                assert collector.exposition is collector.exposition  # one render per publication
            h.advance(1.0)


def test_rows_with_new_help_or_labels_get_a_new_family() -> None:
    with Harness("default.yaml") as h:
        collector = h.collectors[0]
        first = Families()
        first.gauge("gpu_y", "Old help.", ("gpu",)).add_metric(["0"], 1)
        collector.publish(first.collect())
        assert b"Old help." in collector.exposition
        second = Families()
        second.gauge("gpu_y", "New help.", ("gpu", "uuid")).add_metric(["0", "GPU-a"], 1)
        collector.publish(second.collect())
        assert collector.exposition == b'# HELP gpu_y New help.\n# TYPE gpu_y gauge\ngpu_y{gpu="0",uuid="GPU-a"} 1.0\n'


class _Dynamic:
    """A source rendered at every scrape (like the exporter's own health metrics)."""

    def __init__(self) -> None:
        self.value = 0.0

    def collect(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily("gpu_exporter_dynamic", "Changes every scrape.", value=self.value)]


def test_gzip_body_is_the_text_and_follows_every_change() -> None:
    with Harness("default.yaml") as h:
        dynamic = _Dynamic()
        sources: list[Source] = [*h.collectors, dynamic]
        body = Body(sources)
        for step in range(4):
            dynamic.value = step
            if step % 2:
                body.prepare()  # as the poller does ahead of an expected scrape
            compressed = body.gzip()
            assert gzip.decompress(compressed) == exposition(sources) == body.text()
            assert zlib.decompress(compressed, 31) == body.text()  # one member: any gzip reader reads it whole
            head = body._head
            dynamic.value = step + 0.5  # only the per-scrape part changed: the compressed head is reused
            assert gzip.decompress(body.gzip()) == body.text() and body._head is head
            h.advance(1.0)  # a poll: new rows, so new text and a new head
            assert gzip.decompress(body.gzip()) == body.text() and body._head is not head
        assert body.encode("gzip")[1] == "gzip" and body.encode(None) == (body.text(), None)


def test_a_whole_body_rendered_ahead_is_served_until_the_next_poll_its_deadline_or_invalidate() -> None:
    """prepare(ahead=...) keeps the whole body, per-scrape parts included, plain and gzip, and lets it go in time."""
    with Harness("default.yaml") as h:
        dynamic, now = _Dynamic(), [100.0]
        body = Body([*h.collectors, dynamic], clock=lambda: now[0])
        body.prepare(ahead=1.5)
        prepared_text, prepared_gzip = body.text(), body.gzip()
        assert gzip.decompress(prepared_gzip) == prepared_text == exposition(body.sources)
        assert zlib.decompress(prepared_gzip, 31) == prepared_text  # one gzip member
        dynamic.value = 1.0  # a per-scrape value moved: scrapes until the next poll still get the prepared body
        now[0] += 1.0
        assert body.gzip() is prepared_gzip and body.text() is prepared_text
        body.invalidate()  # e.g. the server counted a refusal
        assert gzip.decompress(body.gzip()) == body.text() == exposition(body.sources) != prepared_text
        body.prepare(ahead=1.5)
        assert body.gzip() is not prepared_gzip and b"gpu_exporter_dynamic 1.0" in gzip.decompress(body.gzip())
        dynamic.value = 2.0
        now[0] += 1.6  # past its deadline (a poller that stopped polling): rendered again
        assert b"gpu_exporter_dynamic 2.0" in body.text()
        assert b"gpu_exporter_dynamic 2.0" in gzip.decompress(body.gzip())
        body.prepare(ahead=1.5)
        h.advance(1.0)  # a poll: new rows, so the prepared body is gone
        assert gzip.decompress(body.gzip()) == body.text() == exposition(body.sources)
        assert body._whole is None


class _Live(_Dynamic):
    """A trailing ``live`` source (like the sample age): rendered at every scrape, even into a prepared body."""

    live = True

    def collect(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily("gpu_exporter_live", "Rendered at every scrape.", value=self.value)]


def test_a_prepared_body_still_renders_its_live_tail_at_every_scrape() -> None:
    """The sample age clients time polls with must be the scrape's, not the prepared poll's (``query --url``)."""
    with Harness("default.yaml") as h:
        dynamic, live = _Dynamic(), _Live()
        body = Body([*h.collectors, dynamic, live])
        body.prepare(ahead=1.5)
        for value in (1.0, 2.0):
            dynamic.value = live.value = value  # only the live source's new value shows until the next poll
            text = body.text()
            assert text.endswith(f"gpu_exporter_live {value}\n".encode()) and b"gpu_exporter_dynamic 0.0" in text
            assert gzip.decompress(body.gzip()) == zlib.decompress(body.gzip(), 31) == text  # one gzip member


def test_the_exporter_serves_the_sample_age_last_and_live() -> None:
    from gpu_exporter.app import Exporter
    from gpu_exporter.config import load_config
    from gpu_exporter.selfmetrics import SampleAge

    exporter = Exporter(load_config(None, env={}, flags={"simulate.enabled": True}))
    try:
        assert isinstance(exporter.sources[-1], SampleAge) and exporter.sources[-1].live
        assert not [s for s in exporter.sources[:-1] if getattr(s, "live", False)]
    finally:
        from gpu_exporter import simulate
        simulate.uninstall()


def _push(store: TrainingStore, steps: int, run: str = "r") -> None:
    doc = {"version": 1, "run": run, "rank": "0", "uuid": "GPU-a", "started_at": 100.0,
           "phases": {"compute": float(steps)}, "current_phase": "compute", "steps": steps, "samples": 0,
           "batch_size": 0}
    assert store.handle_push(json.dumps(doc).encode(), "application/json", None)[0] == 202


def test_training_text_is_rendered_once_per_change() -> None:
    now = [1000.0]
    store = TrainingStore(IngestSettings(stale_after_seconds=60), clock=lambda: now[0])
    empty = store.exposition
    assert store.exposition is empty and empty == render(store.collect())
    _push(store, 1)
    one = store.exposition
    assert one is not empty and b'gpu_training_steps_total{rank="0",run="r",uuid="GPU-a"} 1.0' in one
    assert store.exposition is one  # no change, no render
    _push(store, 2)
    two = store.exposition
    assert b"} 2.0\n" in two and two == render(store.collect())
    store.handle_push(b"{", "application/json", None)  # a refusal changes the ingest counters
    refused = store.exposition
    assert refused is not two and b'gpu_exporter_ingest_requests_total{outcome="malformed_json"} 1.0' in refused
    now[0] += 61  # the run expires
    assert b"gpu_training_steps_total{" not in store.exposition


def test_xid_text_is_rendered_once_per_event() -> None:
    xid = XidCollector(nvml=None, discovery=lambda: Discovery(0, ()))  # type: ignore[arg-type]  # never started
    assert xid.exposition == b"" == render(xid.collect())
    with xid._lock:
        xid._counts[("0", "GPU-a", "13")] += 1
        xid._text = None  # as the event thread does
    text = xid.exposition
    assert text is xid.exposition and text == render(xid.collect())


def test_forecast_follows_each_scraper_and_forgets_one_that_left() -> None:
    now = [0.0]
    forecast = ScrapeForecast(clock=lambda: now[0])
    assert not forecast.due_within(1.0)
    for t in (0.0, 10.0):  # scraper A every 10 s
        now[0] = t
        forecast.arrived("a")
    for t in (3.0, 18.0):  # scraper B every 15 s
        now[0] = t
        forecast.arrived("b")
    now[0] = 19.5
    assert forecast.due_within(1.0)  # A due at 20
    now[0] = 25.0
    assert not forecast.due_within(1.0)
    now[0] = 32.5
    assert forecast.due_within(1.0)  # B due at 33
    now[0] = 100.0
    assert not forecast.due_within(1.0)  # both stopped
    for i in range(ScrapeForecast.MAX_SCRAPERS + 4):
        forecast.arrived(f"host-{i}")
    assert len(forecast._scrapers) == ScrapeForecast.MAX_SCRAPERS


@pytest.mark.slow
def test_a_scrape_after_a_prepared_poll_serves_that_poll() -> None:
    """A real exporter scraped at a steady interval renders ahead; each scrape still shows a fresh poll."""
    with run_exporter(["--simulate", str(scenario_path("status-page.yaml")), "--poll-interval", "0.2"]) as url:
        ages, busy = [], []
        for _ in range(12):
            request = urllib.request.Request(url + "/metrics", headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(request, timeout=5) as response:
                assert response.headers["Content-Encoding"] == "gzip"
                text = gzip.decompress(response.read()).decode()
            for line in text.splitlines():
                if line.startswith("gpu_exporter_last_sample_age_seconds "):
                    ages.append(float(line.split()[1]))
                elif line.startswith('gpu_busy_seconds_total{gpu="0"'):
                    busy.append(float(line.split()[1]))
            time.sleep(0.25)
    assert len(ages) == len(busy) == 12
    assert busy == sorted(busy) and busy[-1] > busy[0]  # every scrape after a poll saw that poll's counter
    assert max(ages) < 5, ages  # polls kept coming; none was served stale


def test_render_of_prometheus_client_families_is_generate_latest() -> None:
    """The exporter's own families, and those prometheus_client renders itself (histogram, info, odd names)."""
    from gpu_exporter.selfmetrics import SelfMetrics
    from prometheus_client import ProcessCollector
    from prometheus_client.core import HistogramMetricFamily, InfoMetricFamily, UnknownMetricFamily
    from prometheus_client.exposition import generate_latest

    class _All:
        def __init__(self, families: list[Any]) -> None:
            self.families = families

        def collect(self) -> list[Any]:
            return self.families

    store = TrainingStore(IngestSettings())
    _push(store, 3)
    store.handle_push(b"{", "application/json", None)
    with Harness("default.yaml") as h:
        own = [*SelfMetrics(h.poller).collect(), *ProcessCollector(registry=None).collect(), *store.collect()]
    gauge = GaugeMetricFamily("gpu_awkward", 'Help "with" \\ and\nnewline.', labels=["b", "a"])
    for i, value in enumerate(AWKWARD_VALUES):
        gauge.add_metric([AWKWARD_LABELS[i % len(AWKWARD_LABELS)], str(i)], value)
    counter = CounterMetricFamily("gpu_created", "With created.", labels=["x"], created=12.0)
    counter.add_metric(["1"], 2, created=10.0)
    stamped = GaugeMetricFamily("gpu_stamped", "Timestamped.", labels=["x"])
    stamped.add_metric(["1"], 2, timestamp=1700000000.5)
    odd_label = GaugeMetricFamily("gpu_odd", "Odd label name.", labels=["with.dot"])
    odd_label.add_metric(["v"], 1)
    histogram = HistogramMetricFamily("gpu_hist", "H.", buckets=[("1.0", 1), ("+Inf", 2)], sum_value=3)
    others = [gauge, counter, stamped, odd_label, histogram, InfoMetricFamily("gpu_i", "I.", value={"k": "v"}),
              UnknownMetricFamily("gpu_u", "U.", value=4), GaugeMetricFamily("gpu_empty", "No samples.", labels=["x"])]
    for families in (own, others, [*own, *others]):
        assert render(families) == generate_latest(_All(families))


def test_a_poll_is_rendered_ahead_only_when_a_scrape_is_due() -> None:
    """Polls that no scrape is expected to read cost no rendering; one before an expected scrape is prepared."""
    from gpu_exporter.app import Exporter
    from gpu_exporter.config import load_config

    from testbed import free_port

    flags = {"simulate.enabled": True, "simulate.scenario": str(scenario_path("status-page.yaml")),
             "web.listen_address": f"127.0.0.1:{free_port()}", "poll_interval": 3600.0}
    exporter = Exporter(load_config(None, env={}, flags=flags))
    exporter.start()  # polls now, then the poller thread sleeps for the hour: this test drives the polls
    try:
        assert exporter.server is not None
        now = [1000.0]
        exporter.server.scrapes = forecast = ScrapeForecast(clock=lambda: now[0])
        polling = exporter.poller.collectors

        exporter.poller.poll_once()  # nobody scrapes
        assert all(c._text is None for c in polling)

        # Time scaled to the hour-long poll interval: a scraper every 10000 s, next due at 30000.
        for t in (10000.0, 20000.0):
            now[0] = t
            forecast.arrived("10.0.0.9")
        now[0] = 25000.0
        exporter.poller.poll_once()  # the scrape is due after the next poll: nothing rendered
        assert all(c._text is None for c in polling)
        now[0] = 27000.0
        exporter.poller.poll_once()  # due before the next poll: this poll is prepared
        texts = [t for t in (c._text for c in polling) if t is not None]
        assert len(texts) == len(polling) and b"gpu_busy_seconds_total{" in b"".join(texts)
        body = exporter.server.body
        assert body._key[:len(texts)] == tuple(texts)
        head = body._head
        assert gzip.decompress(body.gzip()).startswith(b"".join(texts))  # the scrape reads the prepared poll
        assert body._head is head  # and compresses only what is computed per scrape
    finally:
        exporter.stop()
