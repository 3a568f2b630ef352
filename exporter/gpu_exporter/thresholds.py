"""The alert thresholds, read from the same file the Prometheus rules are generated from.

``gpu_exporter/thresholds.yml`` (shipped inside the package; ``prometheus/thresholds.yml`` is a
symbolic link to it, and ``monitoring/ (python -m monitoring)`` renders the rules from it) holds every
number the alert rules use; ``gpu-exporter diagnose`` judges GPUs with the
same numbers, so its verdicts and the alerts cannot disagree. This module is the file's only reader:
:func:`read_thresholds_file` checks every key (:data:`KINDS`: ratio, duration, ...) for the
monitoring generators, :func:`load_thresholds` gives diagnose its typed subset, and
:func:`runbook_url` is the one place a runbook link is built. Errors are one line naming file, line
and key. Example::

    >>> t = load_thresholds()
    >>> t.utilization_low_threshold, t.allocator_window
    (0.3, 600.0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_exporter import yamlfile


class ThresholdsError(ValueError):
    """The thresholds file is missing, malformed or lacks a key (the message is one sentence)."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration (``15m``, ``1h30m``, ``1d``, ``45s``, ``500ms``): the project's one
    duration grammar (:func:`gpu_exporter.config.parse_duration`) held to what PromQL accepts, since these
    durations go into the generated rules.

    >>> parse_duration("1h30m")
    5400.0
    """
    from gpu_exporter.config import parse_duration as parse

    return parse(text, prometheus=True)


@dataclass(frozen=True)
class Thresholds:
    """The thresholds diagnose uses: ratios 0-1, durations in seconds, counts as integers."""

    utilization_low_threshold: float
    utilization_target: float
    work_memory_used_ratio: float
    idle_utilization_threshold: float
    input_bound_share: float
    metrics_bound_share: float
    checkpoint_share: float
    batch_compute_share: float
    batch_busy_ratio: float
    batch_memory_used_ratio: float
    sm_active_low: float
    tensor_idle_ratio: float
    dram_bound_ratio: float
    straggler_wait_share: float
    communication_bound_share: float
    allocator_window: float
    allocator_retries_threshold: int
    memory_nearly_full_ratio: float
    evidence_busy_core_ratio: float
    evidence_io_wait_share: float
    remedy_memory_target_ratio: float
    cluster_label: str
    runbook_url_pattern: str

    def runbook_url(self, anchor: str) -> str:
        """The runbook link of a section (see :func:`runbook_url`).

        >>> load_thresholds().runbook_url("gpuutilizationlow").endswith("runbooks.md#gpuutilizationlow")
        True
        """
        return runbook_url(self.runbook_url_pattern, anchor)


def runbook_url(pattern: str, anchor: str) -> str:
    """The one way a runbook link is built: ``pattern`` (config ``runbook_url_pattern``) with ``{anchor}``
    replaced by the section's anchor (an alert's name in lower case).

    >>> runbook_url("https://example.com/runbooks.md#{anchor}", "gpuxiderrors")
    'https://example.com/runbooks.md#gpuxiderrors'
    """
    return pattern.replace("{anchor}", anchor)


RATIO, DURATION, COUNT, NUMBER, LABEL, REGEX, URL = "ratio", "duration", "count", "number", "label", "regex", "url"
KINDS: dict[str, str] = {
    **dict.fromkeys(("utilization_low_threshold", "utilization_target", "work_memory_used_ratio",
                     "idle_utilization_threshold", "input_bound_share", "metrics_bound_share", "checkpoint_share",
                     "batch_compute_share", "batch_busy_ratio", "batch_memory_used_ratio", "sm_active_low",
                     "tensor_idle_ratio", "dram_bound_ratio", "straggler_wait_share",
                     "communication_bound_share", "memory_nearly_full_ratio", "evidence_busy_core_ratio",
                     "evidence_io_wait_share", "remedy_memory_target_ratio", "dashboard_time_below_warn",
                     "dashboard_time_below_critical", "dashboard_memory_warn_ratio"), RATIO),
    **dict.fromkeys(("utilization_low_for", "alert_hold", "idle_for", "cause_for", "allocator_window",
                     "memory_nearly_full_for", "exporter_down_for", "collector_failing_for", "sample_stale_for",
                     "xid_window", "thermal_for", "gpu_missing_lookback", "gpu_missing_for",
                     "series_growth_lookback", "series_growth_for", "rule_interval"), DURATION),
    "allocator_retries_threshold": COUNT,
    **dict.fromkeys(("sample_stale_seconds", "series_growth_factor", "dashboard_temperature_warn_celsius",
                     "dashboard_temperature_critical_celsius", "dashboard_push_age_warn_seconds",
                     "dashboard_gpu_hour_price"), NUMBER),
    "cluster_label": LABEL,
    "exporter_job_regex": REGEX,
    "runbook_url_pattern": URL,
}
"""Every key of thresholds.yml and what its value must be: a ratio 0-1, a Prometheus duration, a whole number
>= 0, a number >= 0, a Prometheus label name, a regular expression, or a URL pattern with ``{anchor}``."""
ORDERED = (("utilization_low_threshold", "utilization_target"),
           ("dashboard_time_below_warn", "dashboard_time_below_critical"),
           ("dashboard_memory_warn_ratio", "memory_nearly_full_ratio"),
           ("dashboard_temperature_warn_celsius", "dashboard_temperature_critical_celsius"))
"""Pairs ``(lower, upper)`` whose values must not cross."""
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _check(where: str, key: str, value: Any) -> float | int | str:
    """``value`` of ``key`` converted to its kind (durations stay text); ThresholdsError names ``where``."""
    kind = KINDS[key]
    if kind in (DURATION, LABEL, REGEX, URL):
        if not isinstance(value, str) or not value.strip():
            raise ThresholdsError(f"{where}: {key} must be a non-empty string, got {value!r}")
        if kind == DURATION:
            try:
                parse_duration(value)
            except ValueError as err:
                raise ThresholdsError(f"{where}: {key}: {err}") from None
        elif kind == LABEL and not _LABEL_RE.fullmatch(value):
            raise ThresholdsError(f"{where}: {key} must be a Prometheus label name like cluster, got {value!r}")
        elif kind == REGEX:
            try:
                re.compile(value)
            except re.error as err:
                raise ThresholdsError(f"{where}: {key} is not a regular expression ({err})") from None
        elif kind == URL and "{anchor}" not in value:
            raise ThresholdsError(f"{where}: {key} must contain {{anchor}} (where the section goes), got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ThresholdsError(f"{where}: {key} must be a number, got {value!r}")
    if kind == COUNT and (not isinstance(value, int) or value < 0):
        raise ThresholdsError(f"{where}: {key} must be a whole number >= 0, got {value!r}")
    if kind == RATIO and not 0.0 <= value <= 1.0:
        raise ThresholdsError(f"{where}: {key} must be a ratio between 0 and 1, got {value!r}")
    if kind == NUMBER and not value >= 0:
        raise ThresholdsError(f"{where}: {key} must be a number >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class ThresholdsFile:
    """The whole thresholds file, every key checked (:data:`KINDS`): what the monitoring generators read.

    ``text(key)`` is the value as PromQL and the alert texts need it (``0.3``, ``15m``);
    ``num(key)`` a number, ``seconds(key)`` a duration in seconds. Example::

        >>> f = read_thresholds_file()
        >>> f.text("utilization_low_for"), f.seconds("utilization_low_for"), f.num("utilization_low_threshold")
        ('15m', 900.0, 0.3)
    """

    source: str
    values: dict[str, float | int | str]

    @classmethod
    def from_mapping(cls, doc: Any, source: str) -> ThresholdsFile:
        """Check a parsed file (a :class:`yamlfile.YamlMap` knows each key's line): every key known, every
        value of its kind, none missing, no ordered pair crossed; ThresholdsError (one line) otherwise."""
        if not isinstance(doc, dict):
            raise ThresholdsError(f"{source} must be a mapping of threshold name -> value")
        where = doc.where if isinstance(doc, yamlfile.YamlMap) else (lambda key: source)
        values: dict[str, float | int | str] = {}
        for key, value in doc.items():
            if key not in KINDS:
                raise ThresholdsError(f"{where(key)}: unknown threshold {key!r} (a typo? the keys are those of "
                                      "the packaged gpu_exporter/thresholds.yml)")
            values[key] = _check(where(key), key, value)
        missing = [key for key in KINDS if key not in values]
        if missing:
            raise ThresholdsError(f"{source} lacks the key {missing[0]}")
        for low, high in ORDERED:
            if values[low] > values[high]:  # type: ignore[operator]
                raise ThresholdsError(f"{where(high)}: {high} must be at least {low}")
        return cls(source, values)

    def with_values(self, **changes: float | int | str) -> ThresholdsFile:
        """A copy with some values changed, checked like a file (for tests and previews)."""
        return ThresholdsFile.from_mapping({**self.values, **changes}, self.source)

    def text(self, key: str) -> str:
        """The value as written into PromQL and alert texts (``0.3``, ``15m``, ``cluster``)."""
        return str(self.values[key])

    def num(self, key: str) -> float:
        """A ratio or number as a float."""
        return float(self.values[key])

    def percent(self, key: str) -> str:
        """A ratio as prose and the dashboards write it: ``0.3`` -> ``30%``."""
        return f"{self.num(key) * 100:g}%"

    def seconds(self, key: str) -> float:
        """A duration in seconds."""
        return parse_duration(self.text(key))

    def runbook_url(self, anchor: str) -> str:
        """The runbook link of a section (see :func:`runbook_url`)."""
        return runbook_url(self.text("runbook_url_pattern"), anchor)

    def thresholds(self) -> Thresholds:
        """The typed subset diagnose uses."""
        return Thresholds(**{f.name: (self.seconds(f.name) if KINDS[f.name] == DURATION else self.values[f.name])
                             for f in fields(Thresholds)})  # type: ignore[arg-type]


def _parse(path: str | Path | None) -> tuple[str, Any]:
    """``(source, parsed YAML)`` of the thresholds file (default: the packaged one)."""
    source = "gpu_exporter/thresholds.yml" if path is None else str(path)
    file = resources.files("gpu_exporter").joinpath("thresholds.yml") if path is None else Path(path)
    try:
        return source, yamlfile.parse(file.read_text(encoding="utf-8"), source)
    except OSError as err:
        raise ThresholdsError(f"{path} cannot be read: {err.strerror}" if path is not None else
                              f"the packaged {source} cannot be read ({err.strerror}); reinstall "
                              "gpu-utilization-exporter") from None
    except yamlfile.YamlError as err:
        raise ThresholdsError(str(err)) from None


def read_thresholds_file(path: str | Path | None = None) -> ThresholdsFile:
    """The whole thresholds file (default: the packaged ``gpu_exporter/thresholds.yml``), every key checked.

    Raises ThresholdsError with one line naming the file, line and key on any problem.
    """
    return ThresholdsFile.from_mapping(*reversed(_parse(path)))


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """Read the thresholds diagnose uses from ``path`` (default: the packaged ``gpu_exporter/thresholds.yml``).

    Only the keys of :class:`Thresholds` are required (a smaller file given to ``--thresholds`` works);
    each key present is checked like :func:`read_thresholds_file` does. Raises ThresholdsError with one
    sentence naming the file, line and key on any problem.

    >>> load_thresholds().input_bound_share
    0.3
    """
    source, doc = _parse(path)
    if not isinstance(doc, dict):
        raise ThresholdsError(f"{source} must be a mapping of threshold name -> value")
    for f in fields(Thresholds):
        if f.name not in doc:
            raise ThresholdsError(f"{source} lacks the key {f.name}")
    if all(key in doc for key in KINDS):
        return ThresholdsFile.from_mapping(doc, source).thresholds()
    where = doc.where if isinstance(doc, yamlfile.YamlMap) else (lambda key: source)
    values = {f.name: _check(where(f.name), f.name, doc[f.name]) for f in fields(Thresholds)}
    if values["utilization_target"] < values["utilization_low_threshold"]:  # type: ignore[operator]
        raise ThresholdsError(f"{where('utilization_target')}: utilization_target must be at least "
                              "utilization_low_threshold")
    return ThresholdsFile(source, values).thresholds()  # durations in seconds, as from a whole file
