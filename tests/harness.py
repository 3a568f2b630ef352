"""In-process exporter on simulated GPUs with a hand-driven clock, for collector tests.

Example::

    with Harness("bursty.yaml") as h:
        h.advance(1.0)            # one poll, one simulated second later
        print(h.value("gpu_busy_seconds_total", gpu="0"))
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from gpu_exporter import simulate
from gpu_exporter.app import polling_collectors
from gpu_exporter.exposition import exposition
from gpu_exporter.nvml import Nvml
from gpu_exporter.poller import Poller
from gpu_exporter.selfmetrics import SelfMetrics
from prometheus_client.parser import text_string_to_metric_families

SCENARIOS = Path(simulate.__file__).parent / "scenarios"
TEST_SCENARIOS = Path(__file__).parent / "scenarios"


def scenario_path(name: str) -> Path:
    """A packaged scenario by file name, or one under tests/scenarios/."""
    for folder in (SCENARIOS, TEST_SCENARIOS):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(name)


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


class Harness:
    """Simulated node + NVML wrapper + poller + every polling collector, on one fake clock."""

    def __init__(self, scenario: str | Path, poll_interval: float = 1.0) -> None:
        self.clock = FakeClock()
        path = scenario if isinstance(scenario, Path) else scenario_path(scenario)
        self.node = simulate.install(path, clock=self.clock)
        self.nvml = Nvml()
        self.collectors = polling_collectors(simulated=True)
        self.poller = Poller(self.nvml, self.collectors, poll_interval=poll_interval, clock=self.clock)
        self.health = SelfMetrics(self.poller)
        self.poll_interval = poll_interval

    def __enter__(self) -> Harness:
        self.nvml.init()
        self.poller.poll_once()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.nvml.shutdown()
        simulate.uninstall()

    def advance(self, seconds: float) -> None:
        """Move the clock forward in poll-interval steps, polling at each."""
        steps = max(1, round(seconds / self.poll_interval))
        for _ in range(steps):
            self.clock.t += seconds / steps
            self.poller.poll_once()

    def scrape(self) -> str:
        """What /metrics would serve now."""
        return exposition([*self.collectors, self.health]).decode()

    def samples(self, name: str, **labels: str) -> list[Any]:
        """Samples named ``name`` whose labels include ``labels``."""
        out = []
        for family in text_string_to_metric_families(self.scrape()):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    out.append(s)
        return out

    def value(self, name: str, **labels: str) -> float:
        """The single sample value named ``name`` matching ``labels`` (fails when not exactly one)."""
        found = self.samples(name, **labels)
        assert len(found) == 1, f"expected one {name}{labels}, found {len(found)}: {found}"
        return float(found[0].value)
