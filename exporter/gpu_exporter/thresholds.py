"""The alert thresholds, read from the same file the Prometheus rules are generated from.

``gpu_exporter/thresholds.yml`` (shipped inside the package; ``prometheus/thresholds.yml`` is a
symbolic link to it, and ``monitoring/ (python -m monitoring)`` renders the rules from it) holds every
number the alert rules use; ``gpu-exporter diagnose`` judges GPUs with the
same numbers, so its verdicts and the alerts cannot disagree. Example::

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

_DURATION_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_UNIT_SECONDS = (86400, 3600, 60, 1, 0.001)


class ThresholdsError(ValueError):
    """The thresholds file is missing, malformed or lacks a key (the message is one sentence)."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus-style duration (``15m``, ``1h30m``, ``1d``, ``45s``, ``500ms``).

    >>> parse_duration("1h30m")
    5400.0
    """
    match = _DURATION_RE.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(f"{text!r} is not a duration like 30s, 15m, 1h or 1d")
    return float(sum(int(part) * unit for part, unit in zip(match.groups(), _UNIT_SECONDS, strict=True) if part))


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
    straggler_wait_share: float
    allocator_window: float
    allocator_retries_threshold: int
    memory_nearly_full_ratio: float
    evidence_busy_core_ratio: float
    evidence_io_wait_share: float
    remedy_memory_target_ratio: float
    cluster_label: str
    runbook_url_pattern: str

    def runbook_url(self, anchor: str) -> str:
        """The runbook link of a section, from ``runbook_url_pattern`` (``{anchor}`` replaced).

        >>> load_thresholds().runbook_url("gpuutilizationlow").endswith("runbooks.md#gpuutilizationlow")
        True
        """
        return self.runbook_url_pattern.replace("{anchor}", anchor)


_DURATIONS = {"allocator_window"}
_COUNTS = {"allocator_retries_threshold"}
_STRINGS = {"cluster_label", "runbook_url_pattern"}


def _convert(source: str, key: str, value: Any) -> float | int | str:
    if key in _STRINGS:
        if not isinstance(value, str) or not value.strip():
            raise ThresholdsError(f"{source}: {key} must be a non-empty string, got {value!r}")
        return value
    if key in _DURATIONS:
        if not isinstance(value, str):
            raise ThresholdsError(f"{source}: {key} must be a duration like 10m, got {value!r}")
        try:
            return parse_duration(value)
        except ValueError as err:
            raise ThresholdsError(f"{source}: {key}: {err}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ThresholdsError(f"{source}: {key} must be a number, got {value!r}")
    if key in _COUNTS:
        if not isinstance(value, int) or value < 0:
            raise ThresholdsError(f"{source}: {key} must be a whole number >= 0, got {value!r}")
        return value
    if not 0.0 <= value <= 1.0:
        raise ThresholdsError(f"{source}: {key} must be a ratio between 0 and 1, got {value!r}")
    return float(value)


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """Read the thresholds from ``path`` (default: the packaged ``gpu_exporter/thresholds.yml``).

    Raises ThresholdsError with one sentence naming the file and key on any problem.

    >>> load_thresholds().input_bound_share
    0.3
    """
    if path is None:
        source = "gpu_exporter/thresholds.yml"
        try:
            text = resources.files("gpu_exporter").joinpath("thresholds.yml").read_text(encoding="utf-8")
        except OSError as err:
            raise ThresholdsError(f"the packaged {source} cannot be read ({err.strerror}); "
                                  "reinstall gpu-utilization-exporter") from None
    else:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise ThresholdsError(f"{source} cannot be read: {err.strerror}") from None
    try:
        doc = yamlfile.parse(text, source)
    except yamlfile.YamlError as err:
        raise ThresholdsError(str(err)) from None
    if not isinstance(doc, dict):
        raise ThresholdsError(f"{source} must be a mapping of threshold name -> value")
    values: dict[str, float | int | str] = {}
    for f in fields(Thresholds):
        if f.name not in doc:
            raise ThresholdsError(f"{source} lacks the key {f.name}")
        values[f.name] = _convert(source, f.name, doc[f.name])
    if values["utilization_target"] < values["utilization_low_threshold"]:  # type: ignore[operator]
        raise ThresholdsError(f"{source}: utilization_target must be at least utilization_low_threshold")
    return Thresholds(**values)  # type: ignore[arg-type]
