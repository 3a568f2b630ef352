"""The ``gpu-remedy.recording`` group: the concrete remedies' PromQL of gpu_exporter.verdict.remedies, as records.

Each formula (M1's workers, M3's batch factor and size) and its PromQL sit side by side in
gpu_exporter.verdict.remedies (``RULES``), as does the sentence a cause alert gets from them
(``Remedy.alert_text``, which monitoring.causes puts before the advice of the cause that carries it,
``Cause.alert_remedy``); this only generates.
"""

from __future__ import annotations

from gpu_exporter.verdict.remedies import RULES

from monitoring.model import Record

GROUP = "gpu-remedy.recording"


def records() -> list[Record]:
    """The ``gpu-remedy.recording`` group."""
    return [Record(GROUP, rule.name, rule.promql, comment=rule.doc) for rule in RULES]
