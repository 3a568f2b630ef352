"""The one in-memory model the monitoring generators share: generated alerts and recording rules as
objects, and the dashboards as built models.

The problem: the Prometheus rules, the Grafana-managed alerts and the dashboards say the same things
(which query, compared with which threshold, for how long, with which labels and runbook), and the
Grafana generator used to learn them by regenerating the rules, re-parsing their YAML, cutting the
comparison out of the PromQL by string replacement, and finding dashboards and panels by parsing JSON.
Here every generated alert is an :class:`Alert` with its parts (the compared value, the comparison and
its threshold key, the expression around it, ``for``, labels, annotations), every generated recording
rule a :class:`Record` (the hand-written rules of prometheus/templates stay text); ``monitoring.rules``
writes them as Prometheus YAML, ``monitoring.grafana_alerts`` takes the query without the comparison
and the threshold straight from them, and both read the dashboards as built models (:class:`Model`).
A leaf: the concerns (causes, utilization, evidence, remedies) build these objects, and
``monitoring.build`` gathers them into the model.

Texts hold ``${key}`` placeholders of thresholds.yml (``monitoring.rules.render`` fills them), so one
model serves every config. Example::

    >>> from monitoring import build
    >>> m = build()
    >>> low = m.alert("GpuUtilizationLow")
    >>> low.op, low.threshold, low.for_key
    ('<', 'utilization_low_threshold', 'utilization_low_for')
    >>> low.value in low.expr(compared=False) and " < ${utilization_low_threshold}" in low.expr()
    True
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.thresholds import ThresholdsFile
from gpu_exporter.verdict.alerts import runbook_anchor

VALUE = "{value}"
"""Where an alert's ``shape`` holds its value (compared or not)."""


def indent(text: str, spaces: int) -> str:
    """``text`` with every non-blank line indented by ``spaces``."""
    return textwrap.indent(text, " " * spaces)


def wrap(text: str, width: int = 108) -> str:
    """``text`` broken into lines of at most ``width`` characters at spaces (an alert's description)."""
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False) + "\n"


def where(pod_break: str = " ") -> str:
    """The who/where header of a GPU alert's text (Go template over the alert's labels): the GPU, its node,
    and the pod and training run holding it where the series has them. ``pod_break`` goes between the pod
    clause's comma and ``pod``: a newline in a description wrapped by hand (monitoring.utilization).

    >>> where()
    'GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.node }}{{ with $labels.pod }}, pod \
{{ $labels.namespace }}/{{ . }}{{ end }}{{ with $labels.run }}, training run {{ . }}{{ end }}'
    """
    return ("GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on node {{ $labels.node }}{{ with $labels.pod }},"
            + pod_break + "pod {{ $labels.namespace }}/{{ . }}{{ end }}{{ with $labels.run }}, training run {{ . }}"
            "{{ end }}")


@dataclass(frozen=True)
class Alert:
    """One alerting rule with its parts.

    ``value`` is the PromQL whose value the alert judges; ``op`` and ``threshold`` (a thresholds.yml key)
    compare it (``op == ""``: no comparison, every series of the value fires); ``shape`` is the whole
    expression with :data:`VALUE` where the (compared) value goes. ``description`` is the Prometheus
    template text as written (line-broken); ``comment`` lines go before the rule in the YAML. Its
    ``runbook_url`` is ``${runbook_url}``, which monitoring.rules makes the link of :attr:`anchor`, as for
    every alert of the templates.
    """

    group: str
    name: str
    value: str
    for_key: str
    labels: tuple[tuple[str, str], ...]
    summary: str
    description: str
    op: str = ""
    threshold: str = ""
    shape: str = VALUE
    comment: str = ""

    @property
    def anchor(self) -> str:
        """The runbook section of this alert (gpu_exporter.verdict.alerts.runbook_anchor of its name)."""
        return runbook_anchor(self.name)

    def expr(self, compared: bool = True) -> str:
        """The PromQL (``${key}`` placeholders kept), with the comparison or without it."""
        value = f"{self.value} {self.op} ${{{self.threshold}}}" if compared and self.op else self.value
        return self.shape.replace(VALUE, value)

    def text(self) -> str:
        """The rule as Prometheus YAML (an item of a group's ``rules:``, unindented)."""
        comment = "".join(f"# {line}\n" for line in self.comment.splitlines())
        labels = "".join(f"    {key}: {value}\n" for key, value in self.labels)
        return (f"{comment}- alert: {self.name}\n  expr: |\n{indent(self.expr(), 4)}  for: ${{{self.for_key}}}\n"
                f"  labels:\n{labels}  annotations:\n    summary: {self.summary}\n    description: >-\n"
                f"{indent(self.description, 6)}    runbook_url: ${{runbook_url}}\n")


@dataclass(frozen=True)
class Record:
    """One recording rule: its name, expression (``${key}`` placeholders), labels and the comment before it."""

    group: str
    name: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()
    comment: str = ""

    def text(self) -> str:
        """The rule as Prometheus YAML (an item of a group's ``rules:``, unindented)."""
        comment = "".join(f"# {line}\n" for line in self.comment.splitlines())
        expr = self.expr if self.expr.endswith("\n") else self.expr + "\n"
        labels = "".join(f"    {key}: {value}\n" for key, value in self.labels)
        labels = f"  labels:\n{labels}" if labels else ""
        return f"{comment}- record: {self.name}\n  expr: |\n{indent(expr, 4)}{labels}"


def group_rules(texts: Sequence[str]) -> str:
    """Rules (their YAML texts) as the body of a group's ``rules:``, a blank line between them."""
    return "".join(indent(text, 6) + "\n" for text in texts).rstrip("\n") + "\n"


@dataclass(frozen=True)
class Model:
    """Everything the generators write, built once from one config: the generated alerts and recording
    rules (in file order) and the dashboards as Grafana JSON models (file name -> model)."""

    config: ThresholdsFile
    alerts: tuple[Alert, ...]
    records: tuple[Record, ...] = ()
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)

    def alert(self, name: str) -> Alert:
        """The one alert named ``name`` (KeyError when there is none or several)."""
        found = self.named(name)
        if len(found) != 1:
            raise KeyError(f"{len(found)} generated alerts are named {name}, not one")
        return found[0]

    def named(self, name: str) -> list[Alert]:
        """Every alert named ``name`` (a cause alert has one rule per cause)."""
        return [a for a in self.alerts if a.name == name]

    def group(self, name: str) -> list[Alert | Record]:
        """The rules of the Prometheus rule group ``name``."""
        rules: list[Alert | Record] = [*self.records, *self.alerts]
        return [r for r in rules if r.group == name]

    def groups(self) -> list[str]:
        """The names of the Prometheus rule groups, in model order."""
        rules: list[Alert | Record] = [*self.records, *self.alerts]
        return list(dict.fromkeys(r.group for r in rules))

    def dashboard(self, uid: str) -> dict[str, Any]:
        """The dashboard model with ``uid`` (KeyError when there is none)."""
        for board in self.dashboards.values():
            if board["uid"] == uid:
                return board
        raise KeyError(f"no generated dashboard with uid {uid}")

