"""One prometheus_client collector per concern (see each module), and the registry of every source the
exporter runs: these, the py-spy stack sampler (``stacks``), and outside (a dotted ``module:Class``) the
training store, Kubernetes pod attribution and the exporter's own metrics.

The registry is the one list of sources: the exporter builds them all from it, in its order (/metrics lists
their families in that order, with the HTTP server's own before the trailing live ``age``), and a new source is
one ``register`` line here; ``collectors.disabled`` accepts the names of the collectors among them (``switch``).
A line names the module and class only; a source's module is imported when it is loaded (gpu_exporter.app loads
the polling ones when it is imported, the others when it builds them), so reading the names (config does) costs
nothing.

Modules here import only ``collectors.base``, ``catalog``, ``nvml`` and ``exposition``, never the poller
or the app: the exporter's own health metrics live beside the poller (``selfmetrics``).

Project imports: gpu_exporter.catalog, gpu_exporter.exposition, gpu_exporter.nvml, gpu_exporter.training.protocol.

>>> NAMES[:2]
('utilization', 'device')
>>> REGISTRY["xid"].polling
False
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpu_exporter.collectors.base import Assembly


@dataclass(frozen=True)
class Registration:
    """One source: its name (its class's ``name``, the ``collector`` label), ``module:Class``, and how it runs.

    ``polling``: the poller calls it (a ``PollingCollector``); else the exporter builds it with
    ``Class.build(assembly)`` (None: it cannot run) when config attribute ``when`` is true (or empty), starts
    it after the first poll if it runs a ``thread``, and serves its ``metrics``. ``switch``: named by
    ``collectors.disabled``. A built source's ``healthy`` is its ``gpu_exporter_collector_success``.
    """

    name: str
    target: str
    polling: bool = True
    switch: bool = True
    when: str = ""
    metrics: bool = True
    thread: bool = False

    def load(self) -> Any:
        """The source's class (imports its module now)."""
        module, _, attr = self.target.partition(":")
        return getattr(import_module(module if "." in module else f"{__name__}.{module}"), attr)


REGISTRY: dict[str, Registration] = {}
"""Every source by name, in the order the poller runs them and the exporter builds them."""


def register(name: str, target: str, **how: Any) -> None:
    """Add a source to the registry (one line per source, below; ``how``: :class:`Registration`'s fields)."""
    if name in REGISTRY:
        raise ValueError(f"collector {name!r} is registered twice")
    REGISTRY[name] = Registration(name, target, **how)


register("utilization", "utilization:UtilizationCollector")
register("device", "device:DeviceCollector")
register("pcie", "pcie:PcieCollector")
register("processes", "processes:ProcessCollector")
register("evidence", "evidence:EvidenceCollector")
register("mig", "mig:MigCollector")
register("gpm", "gpm:GpmCollector")
register("xid", "xid:XidCollector", polling=False, thread=True)
register("training", "gpu_exporter.ingest:TrainingStore", polling=False, switch=False, when="ingest_enabled")
register("stacks", "stacks:PhaseSampler", polling=False, switch=False, when="sampling_rate", metrics=False,
         thread=True)
register("kubernetes", "gpu_exporter.kubernetes:PodAttribution", polling=False, switch=False,
         when="kubernetes_enabled", thread=True)
register("self", "gpu_exporter.selfmetrics:SelfMetrics", polling=False, switch=False)
register("process", "gpu_exporter.selfmetrics:ProcessMetrics", polling=False, switch=False)
register("age", "gpu_exporter.selfmetrics:SampleAge", polling=False, switch=False)  # last: live (exposition.Body)

NAMES: tuple[str, ...] = tuple(name for name, r in REGISTRY.items() if r.switch)
"""Names accepted by ``collectors.disabled``."""


def polling_classes() -> list[Any]:
    """The polling collector classes, in registry order (the app leaves out the disabled ones)."""
    return [r.load() for r in REGISTRY.values() if r.polling]


def build_sources(assembly: Assembly, disabled: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every source that does not poll and is on, built in registry order into ``assembly.built`` (returned)."""
    for r in REGISTRY.values():
        if r.polling or r.name in disabled or (r.when and not getattr(assembly.config, r.when)):
            continue
        source = r.load().build(assembly)
        if source is not None:
            assembly.built[r.name] = source
    return assembly.built
