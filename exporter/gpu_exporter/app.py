"""Assemble and run the exporter from a Config: NVML (or simulated GPUs), the poller and its
collectors, every other source of the registry (XID events, training ingest, the stack sampler,
Kubernetes attribution, the exporter's own metrics: gpu_exporter.collectors), and the HTTP server.

Example::

    exporter = Exporter(load_config(None, env={}, flags={"simulate.enabled": True}))
    exporter.start()            # background threads; exporter.url tells where
    exporter.stop()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpu_exporter import collectors
from gpu_exporter.catalog import SLOWDOWN_REASONS
from gpu_exporter.collectors.base import Assembly, PollingCollector
from gpu_exporter.collectors.device import DeviceCollector
from gpu_exporter.collectors.evidence import CPU_SHARE, EvidenceCollector
from gpu_exporter.config import Config
from gpu_exporter.exposition import Source
from gpu_exporter.ingest import TrainingStore
from gpu_exporter.nvml import Nvml
from gpu_exporter.poller import Poller
from gpu_exporter.selfmetrics import ProcessMetrics, SelfMetrics
from gpu_exporter.server import Limits, MetricsServer

log = logging.getLogger(__name__)

POLLING_COLLECTORS: tuple[type[PollingCollector], ...] = tuple(collectors.polling_classes())
"""The poller's collectors, from the registry (gpu_exporter.collectors)."""


def polling_collectors(disabled: set[str] | frozenset[str] = frozenset(), simulated: bool = False,
                       evidence_cpu_share: float = CPU_SHARE,
                       clock_event_reasons: tuple[str, ...] = SLOWDOWN_REASONS) -> list[PollingCollector]:
    """One instance of every enabled polling collector; on simulated GPUs the evidence collector does not
    suggest hostPID for PIDs it cannot see (a scenario's PIDs need not exist on this node). The evidence
    collector's /proc reads keep to ``evidence_cpu_share`` of one CPU (0: every process at every poll); the
    device collector exports the ``clock_event_reasons`` of gpu_clock_event_active."""
    polling = [cls() for cls in POLLING_COLLECTORS if cls.name not in disabled]
    for collector in polling:
        if isinstance(collector, EvidenceCollector):
            collector.hint_hidden = not simulated
            collector.cpu_share = evidence_cpu_share
        if isinstance(collector, DeviceCollector):
            collector.clock_event_reasons = clock_event_reasons
    return polling


class Exporter:
    """The running exporter; :meth:`start` raises DriverNotFound, AddressInUse or a config error."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.simulated: Any = None
        if config.simulate_enabled:
            from gpu_exporter import simulate

            self.simulated = simulate.install(config.simulate_scenario)
        self.nvml = Nvml()
        disabled = set(config.collectors_disabled)
        polling = polling_collectors(disabled, simulated=self.simulated is not None,
                                     evidence_cpu_share=config.evidence_cpu_share,
                                     clock_event_reasons=config.device_clock_event_reasons)
        self.poller = Poller(self.nvml, polling, poll_interval=config.poll_interval,
                             discovery_interval=config.discovery_interval)
        self.parts = collectors.build_sources(Assembly(config, self.nvml, self.poller, polling, self.simulated),
                                              disabled)
        self.training: TrainingStore | None = self.parts.get("training")
        self.health: SelfMetrics = self.parts["self"]
        self.process: ProcessMetrics = self.parts["process"]  # its guard: the server's accepts (open-file limit)
        self.sources: list[Source] = [*polling, *(s for name, s in self.parts.items()
                                                  if collectors.REGISTRY[name].metrics)]
        self.threads = [s for name, s in self.parts.items() if collectors.REGISTRY[name].thread]  # XID, py-spy, kubelet
        self.server: MetricsServer | None = None

    def ready(self) -> tuple[bool, str]:
        """(ready, reason): ready while the newest complete NVML poll is fresh."""
        age = self.poller.sample_age()
        if age is None:
            return False, "no NVML sample yet (is the NVIDIA driver loaded?)"
        if age > self.config.stale_after:
            return False, f"newest NVML sample is {age:.1f}s old (limit {self.config.stale_after:g}s)"
        return True, f"ok: newest sample {age:.1f}s old"

    def start(self, before_serving: Callable[[], None] | None = None) -> None:
        """Initialise NVML (failing fast without a driver), bind the server, start the threads.

        ``before_serving`` runs once everything is up, just before the server answers its first
        request (the CLI installs its signal handlers there, so no request is answered before them).
        """
        self.nvml.init()
        ssl_context, check_auth, headers = None, None, {}
        if self.config.web_config_file:
            from gpu_exporter.web_config import load_web_config

            web = load_web_config(self.config.web_config_file)
            ssl_context = web.ssl_context()
            check_auth = web.check_auth if web.basic_auth_users else None
            headers = web.headers
            if check_auth is not None and self.training is not None and not self.config.ingest_token_file:
                log.warning("basic auth protects %s, but training ingest (POST /api/v1/training) accepts "
                            "pushes from anyone: set ingest.token_file, or ingest.enabled: false",
                            self.config.web_telemetry_path)
        self.server = MetricsServer(
            self.config.listen_host_port, self.sources, ready=self.ready,
            telemetry_path=self.config.web_telemetry_path, ingest=self.training,
            ssl_context=ssl_context, check_auth=check_auth, on_auth_failure=self.health.count_auth_failure,
            headers=headers, limits=Limits.from_config(self.config), accept_guard=self.process.guard)
        self.poller.poll_once()
        self.poller.after_poll = self._after_poll
        self.poller.start()
        for part in self.threads:
            part.start()
        if before_serving is not None:
            before_serving()
        threading.Thread(target=self.server.serve_forever, name="gpu-exporter-http", daemon=True).start()
        port = self.server.server_address[1]
        scheme = "https" if ssl_context is not None else "http"
        log.info("serving %s://%s:%s%s for %d GPU(s)%s", scheme, self.config.listen_host_port[0] or "*",
                 port, self.config.web_telemetry_path, len(self.poller.discovery.gpus),
                 " (simulated)" if self.simulated is not None else "")

    def _after_poll(self) -> None:
        """After a poll: the status page, once viewed, keeps a reading; when a scrape is expected before the next
        poll, its body is rendered now (exposition.Body.prepare; the exporter's own health and process_* as of this
        poll, kept at most a poll interval and a half); a poll no scrape is expected to read is not rendered."""
        server = self.server
        if server is not None and server.scrapes.due_within(self.config.poll_interval):
            server.body.prepare(ahead=self.config.poll_interval * 1.5)
        if server is not None:
            server.record_page()

    def stop(self) -> None:
        """Stop serving and polling; release NVML."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        for part in reversed(self.threads):
            part.stop()
        self.poller.stop()
