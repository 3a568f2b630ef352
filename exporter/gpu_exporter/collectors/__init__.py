"""One prometheus_client collector per concern (see each module), and the registry of them all;
``stacks`` is the opt-in py-spy stack sampler, the source of sampled training phases (not registered).

The registry is the one list of collector names: config's ``collectors.disabled`` accepts
exactly these, the exporter builds its collectors from it, and a new collector is one
``register`` line here. A line names the module and class only; nothing is imported until
the exporter builds the collector, so reading the names (config does) costs nothing.

Modules here import only ``collectors.base``, ``nvml`` and ``exposition``, never the poller
or the app: the exporter's own health metrics live beside the poller (``selfmetrics``).

>>> NAMES[:2]
('utilization', 'device')
>>> REGISTRY["xid"].polling
False
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class Registration:
    """One collector: its name (the ``collector`` label), ``module:Class``, and how it runs.

    ``polling``: the poller calls it every poll (a ``PollingCollector``); False for one that
    runs its own thread (XID events wait on NVML).
    """

    name: str
    target: str
    polling: bool = True

    def load(self) -> Any:
        """The collector class (imports its module now)."""
        module, _, attr = self.target.partition(":")
        return getattr(import_module(f"{__name__}.{module}"), attr)


REGISTRY: dict[str, Registration] = {}
"""Every collector by name, in the order the poller runs them."""


def register(name: str, target: str, *, polling: bool = True) -> None:
    """Add a collector to the registry (one line per collector, below)."""
    if name in REGISTRY:
        raise ValueError(f"collector {name!r} is registered twice")
    REGISTRY[name] = Registration(name, target, polling)


register("utilization", "utilization:UtilizationCollector")
register("device", "device:DeviceCollector")
register("pcie", "pcie:PcieCollector")
register("processes", "processes:ProcessCollector")
register("evidence", "evidence:EvidenceCollector")
register("mig", "mig:MigCollector")
register("gpm", "gpm:GpmCollector")
register("xid", "xid:XidCollector", polling=False)

NAMES: tuple[str, ...] = tuple(REGISTRY)
"""Names accepted by ``collectors.disabled``."""


def polling_classes(disabled: set[str] | frozenset[str] = frozenset()) -> list[Any]:
    """The polling collector classes not in ``disabled``, in registry order."""
    return [r.load() for r in REGISTRY.values() if r.polling and r.name not in disabled]
