"""One validated configuration from a YAML file, environment variables and command-line flags.

Precedence: flag > environment > file > default. Every setting has a dotted key
(``web.listen_address``), a flag derived from it (``--web.listen-address``), an environment
variable (``GPU_EXPORTER_WEB_LISTEN_ADDRESS``) and a nested YAML form::

    web:
      listen_address: ":9445"
    poll_interval: 0.5

Example::

    >>> cfg = load_config(file_path=None, env={"GPU_EXPORTER_POLL_INTERVAL": "0.5"}, flags={})
    >>> cfg.poll_interval
    0.5
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_exporter import catalog, collectors, yamlfile

ENV_PREFIX = "GPU_EXPORTER_"
OTHER_ENV = {
    ENV_PREFIX + "URL": "the exporter a training job pushes to (gpu_exporter.training; default: the one on its host)",
    ENV_PREFIX + "TOKEN": "the bearer token a training job's pushes carry (ingest.token_file holds the same token)",
    ENV_PREFIX + "BEARER_TOKEN": "the bearer token of the query, diagnose and report commands' requests",
}
"""Variables of the same prefix that are no setting of ``serve`` (the training library's, the client commands'):
``serve`` accepts them in its environment instead of calling them unknown."""


class ConfigError(ValueError):
    """A bad setting; the message is one line naming where it came from and how to fix it."""


def _non_negative_float(value: Any) -> float:
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not 0 <= number < math.inf:
        raise ValueError(f"expected a positive number, got {value!r}")
    return number or 0.0  # -0 is 0


_DURATION_UNITS = {"y": 31536000.0, "w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0,
                   "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
"""Units of a duration, largest first (Go's and Prometheus's; ``\u00b5s`` is read as ``us``)."""
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|us|ns|y|w|d|h|m|s)")
_PROMETHEUS_UNITS = ("y", "w", "d", "h", "m", "s", "ms")
DURATION_EXAMPLES = "1s, 500ms, 1m30s, 2h"


def parse_duration(text: str, prometheus: bool = False) -> float:
    """Seconds in a Go or Prometheus duration: ``1s``, ``500ms``, ``1m30s``, ``1.5h``, ``2d``, ``1w``.

    Units, largest first and each at most once: y, w, d, h, m, s, ms, us, ns. ``prometheus``: only
    what PromQL accepts (whole numbers, units y to ms), for durations that end up in rules or queries.
    The one duration grammar of the project: settings, client flags and thresholds.yml use it.
    Raises ValueError with a one-line message.

    >>> parse_duration("1m30s"), parse_duration("500ms"), parse_duration("1.5h")
    (90.0, 0.5, 5400.0)
    """
    raw = text.strip().replace("\u00b5s", "us").replace("\u03bcs", "us") if isinstance(text, str) else ""
    parts = _DURATION_PART.findall(raw)  # (number, unit) pairs; whole: nothing else in raw
    order = [list(_DURATION_UNITS).index(unit) for _, unit in parts]  # must grow: largest unit first, each once
    whole = bool(raw) and "".join(number + unit for number, unit in parts) == raw
    if not whole or order != sorted(set(order)) or (prometheus and not all(
            unit in _PROMETHEUS_UNITS and number.isdigit() for number, unit in parts)):
        raise ValueError(f"{text!r} is not a duration like {'30s, 15m, 1h or 1d' if prometheus else DURATION_EXAMPLES}")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def _duration(value: Any) -> float:
    """A positive time in seconds: a plain number of seconds (``0.5``) or a duration (``500ms``, ``1m30s``)."""
    seconds = math.nan
    with contextlib.suppress(ValueError):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str):
            text = value.strip()
            seconds = float(text) if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)", text) else parse_duration(text)
    if not 0 < seconds < math.inf:
        raise ValueError(f"expected a positive duration ({DURATION_EXAMPLES}) or seconds, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest duration text for ``seconds``: ``90.0 -> "1m30s"``, ``0.5 -> "500ms"``, ``1.0 -> "1s"``.

    >>> format_duration(90.0), format_duration(0.5), format_duration(300.0), format_duration(1.25)
    ('1m30s', '500ms', '5m', '1.25s')
    """
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    out, rest = "", seconds
    for unit in ("d", "h", "m"):
        whole, rest = divmod(rest, _DURATION_UNITS[unit])
        out += f"{int(whole)}{unit}" if whole else ""
    rest = round(rest, 9)
    return out + (f"{rest:g}s" if rest or not out else "")


def _positive_int(value: Any) -> int:
    number = 0
    with contextlib.suppress(ValueError):
        number = 0 if isinstance(value, bool) else int(str(value), 10)
    if number <= 0:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return number


_BOOLEANS = dict.fromkeys(("1", "true", "yes", "on"), True) | dict.fromkeys(("0", "false", "no", "off"), False)


def _boolean(value: Any) -> bool:
    flag = value if isinstance(value, bool) else _BOOLEANS.get(str(value).strip().lower())
    if flag is None:
        raise ValueError(f"expected true or false, got {value!r}")
    return flag


def _text(value: Any) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise ValueError(f"expected a string, got {value!r}")
    return str(value)


def _optional_path(value: Any) -> str | None:
    return None if value is None or value == "" else _text(value)


def _listen_address(value: Any) -> str:
    text = _text(value)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT or :PORT (port 1-65535), got {text!r}")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"bad IPv6 host in {text!r}; write it as [::1]:{port}")
    return text


def _telemetry_path(value: Any) -> str:
    text = _text(value)
    if not text.startswith("/") or any(c.isspace() for c in text):
        raise ValueError(f"expected a URL path starting with '/', got {text!r}")
    return text


def _choice(*options: str) -> Callable[[Any], str]:
    """The parser of a setting that is one of ``options`` (in any case)."""
    def parse(value: Any) -> str:
        text = _text(value).lower()
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return text
    return parse


def _name_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list):
        return tuple(_text(part) for part in value)
    raise ValueError(f"expected a list of names, got {value!r}")


def _clock_event_reasons(value: Any) -> tuple[str, ...]:
    """The reasons the device collector exports: names of catalog.CLOCK_EVENT_REASONS, or ``all``."""
    names = _name_list(value)
    known = tuple(catalog.CLOCK_EVENT_REASONS)
    if names == ("all",):
        return known
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown clock event reason(s) {', '.join(unknown)}; known: all, {', '.join(known)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Setting:
    """One configuration key: its dotted name, parser, default and help text."""

    key: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str = "VALUE"
    flag_name: str = ""
    aliases: tuple[str, ...] = ()
    """Older keys that still work (YAML key, and the flag derived from it): ``log_level`` -> ``--log-level``."""

    @property
    def flag(self) -> str:
        """The command-line flag: ``flag_name`` when set (exporter-toolkit spelling), else derived from the key."""
        return self.flag_name or "--" + self.key.replace("_", "-")

    @property
    def alias_flags(self) -> tuple[str, ...]:
        """Flags of the older keys: ``("--log-level",)`` for ``log.level``."""
        return tuple("--" + alias.replace("_", "-") for alias in self.aliases)

    @property
    def is_duration(self) -> bool:
        """Whether the value is a time: seconds, or a duration with units (``1s``, ``500ms``, ``1m30s``)."""
        return self.parse is _duration

    @property
    def default_text(self) -> str:
        """The default as help and docs show it, as a file or the environment may give it: ``1s`` for a duration,
        ``true``/``false`` for a switch, ``""`` when there is none."""
        if self.default in (None, ()):
            return ""
        if isinstance(self.default, bool):
            return str(self.default).lower()
        if isinstance(self.default, tuple):
            return ", ".join(self.default)  # a list may have spaces after its commas; help wraps there
        if self.is_duration:
            return format_duration(self.default)
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)  # 0, not 0.0

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.replace(".", "_").upper()

    @property
    def attr(self) -> str:
        return self.key.replace(".", "_")


@dataclass(frozen=True)
class IngestSettings:
    """Limits of the training ingest endpoint (config keys ``ingest.*``).

    >>> IngestSettings(max_runs=8).max_phases_per_run
    16
    """

    enabled: bool = True
    token_file: str | None = None
    max_body_bytes: int = 65536
    max_runs: int = 64
    max_phases_per_run: int = 16
    max_label_length: int = 128
    stale_after_seconds: float = 300.0


_INGEST = IngestSettings()

COLLECTOR_NAMES = collectors.NAMES  # one line per collector in gpu_exporter/collectors/__init__.py

SETTINGS: tuple[Setting, ...] = (
    Setting("web.listen_address", _listen_address, ":9445",
            "address to serve HTTP on (no host: every interface)", "HOST:PORT"),
    Setting("web.telemetry_path", _telemetry_path, "/metrics", "path of the metrics endpoint", "PATH"),
    Setting("web.config_file", _optional_path, None,
            "exporter-toolkit web config file (TLS, basic auth)", "FILE", "--web.config.file"),
    Setting("web.max_requests", _positive_int, 40, "most requests served at once; more get 503", "N"),
    Setting("web.max_connections", _positive_int, 128,
            "most open connections, one thread each; at the limit the longest-idle one is closed", "N"),
    Setting("web.listen_backlog", _positive_int, 1024,
            "connections the kernel queues until they are accepted (it caps this at net.core.somaxconn)", "N"),
    Setting("web.read_timeout", _duration, 10.0,
            "time a client has to send a whole request, and to take each part of the response", "DURATION"),
    Setting("web.idle_timeout", _duration, 120.0,
            "time a kept-alive connection may wait for its next request", "DURATION"),
    Setting("poll_interval", _duration, 1.0,
            "time between NVML polls; keep it well below the scrape interval", "DURATION"),
    Setting("discovery_interval", _duration, 30.0,
            "time between re-enumerations of GPUs and MIG instances", "DURATION"),
    Setting("stale_after", _duration, 10.0,
            "/readyz fails when the newest sample is older than this", "DURATION"),
    Setting("log.level", _choice("debug", "info", "warning", "error"), "info", "debug, info, warning or error",
            "LEVEL", aliases=("log_level",)),
    Setting("log.format", _choice("logfmt", "json"), "logfmt",
            "logfmt (key=value, as exporter-toolkit) or json, one object per line", "FORMAT"),
    Setting("collectors.disabled", _name_list, (),
            "comma-separated collectors to switch off: " + ", ".join(COLLECTOR_NAMES), "NAMES"),
    Setting("device.clock_event_reasons", _clock_event_reasons, catalog.SLOWDOWN_REASONS,
            f"comma-separated reasons of {catalog.GPU_CLOCK_EVENT_ACTIVE.name}, or all: "
            + ", ".join(catalog.CLOCK_EVENT_REASONS),
            "REASONS"),
    Setting("simulate.enabled", _boolean, False, "run on simulated GPUs", "BOOL"),
    Setting("simulate.scenario", _optional_path, None, "scenario YAML for simulated GPUs", "FILE"),
    Setting("ingest.enabled", _boolean, _INGEST.enabled, "accept training snapshots on POST /api/v1/training", "BOOL"),
    Setting("ingest.token_file", _optional_path, _INGEST.token_file,
            "file holding the bearer token that pushes must carry", "FILE"),
    Setting("ingest.max_body_bytes", _positive_int, _INGEST.max_body_bytes, "largest accepted snapshot", "BYTES"),
    Setting("ingest.max_runs", _positive_int, _INGEST.max_runs,
            "most training runs (run, rank, uuid) kept per node", "N"),
    Setting("ingest.max_phases_per_run", _positive_int, _INGEST.max_phases_per_run, "most phases per run", "N"),
    Setting("ingest.max_label_length", _positive_int, _INGEST.max_label_length,
            "longest run/phase/uuid label value", "N"),
    Setting("ingest.stale_after_seconds", _duration, _INGEST.stale_after_seconds,
            "drop a run that has not pushed for this long", "DURATION"),
    Setting("kubernetes.enabled", _boolean, False,
            "label GPUs with pod/namespace/container from the kubelet pod-resources API", "BOOL"),
    Setting("kubernetes.pod_resources_socket", _text, "/var/lib/kubelet/pod-resources/kubelet.sock",
            "kubelet pod-resources Unix socket", "PATH"),
    Setting("kubernetes.refresh_seconds", _duration, 10.0,
            "time between pod-resources refreshes", "DURATION"),
    Setting("evidence.cpu_share", _non_negative_float, 0.02, "CPU share for /proc reads (0: every poll)", "SHARE"),
    Setting("sampling.rate", _non_negative_float, 0.0, "samples per second of each GPU process's Python stack "
            "with py-spy, for the phases of jobs nobody instrumented (0: off; needs ptrace rights)", "HZ"),
)

SETTINGS_BY_KEY = {s.key: s for s in SETTINGS}
ALIASES = {alias: s.key for s in SETTINGS for alias in s.aliases}
"""Older YAML keys that still work, and the key each now is."""


@dataclass(frozen=True)
class Config:
    """The validated settings; attribute names are the dotted keys with dots as underscores.

    Defaults live in :data:`SETTINGS` only; :data:`DEFAULTS` is the Config they make.
    """

    web_listen_address: str
    web_telemetry_path: str
    web_config_file: str | None
    web_max_requests: int
    web_max_connections: int
    web_listen_backlog: int
    web_read_timeout: float
    web_idle_timeout: float
    poll_interval: float
    discovery_interval: float
    stale_after: float
    log_level: str
    log_format: str
    collectors_disabled: tuple[str, ...]
    device_clock_event_reasons: tuple[str, ...]
    simulate_enabled: bool
    simulate_scenario: str | None
    ingest_enabled: bool
    ingest_token_file: str | None
    ingest_max_body_bytes: int
    ingest_max_runs: int
    ingest_max_phases_per_run: int
    ingest_max_label_length: int
    ingest_stale_after_seconds: float
    kubernetes_enabled: bool
    kubernetes_pod_resources_socket: str
    kubernetes_refresh_seconds: float
    evidence_cpu_share: float
    sampling_rate: float
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def section(self, prefix: str) -> dict[str, Any]:
        """Settings under ``prefix.`` as a dict keyed by the rest of the key.

        >>> DEFAULTS.section("kubernetes")["refresh_seconds"]
        10.0
        """
        return {s.key[len(prefix) + 1:]: getattr(self, s.attr) for s in SETTINGS if s.key.startswith(prefix + ".")}

    @property
    def listen_host_port(self) -> tuple[str, int]:
        """``web.listen_address`` split into (host, port); an empty host means all interfaces."""
        host, _, port = self.web_listen_address.rpartition(":")
        return host.strip("[]"), int(port)


DEFAULTS = Config(**{s.attr: s.default for s in SETTINGS})
"""The configuration when nothing is set."""


def _read_yaml(path: Path) -> dict[str, tuple[Any, str]]:
    """Flatten a YAML config file to {dotted key: (raw value, 'file:line')}."""
    try:
        root = yamlfile.load(path, what="config file")
    except yamlfile.YamlError as err:
        raise ConfigError(str(err)) from None
    if root is None:
        return {}
    if not isinstance(root, yamlfile.YamlMap):
        raise ConfigError(f"{path}:1: the config file must be a mapping of keys")
    out: dict[str, tuple[Any, str]] = {}
    sections = {s.key.split(".")[0] for s in SETTINGS if "." in s.key}
    stack: list[tuple[str, yamlfile.YamlMap]] = [("", root)]
    while stack:
        prefix, mapping = stack.pop()
        for name, value in mapping.items():
            key = prefix + str(name)
            key = ALIASES.get(key, key)
            if isinstance(value, yamlfile.YamlMap) and key in sections:
                stack.append((key + ".", value))
            elif key not in SETTINGS_BY_KEY:
                raise ConfigError(f"{mapping.where(name)}: unknown key {key!r}; "
                                  f"{_did_you_mean(key, SETTINGS_BY_KEY)}"
                                  f"known keys: {', '.join(sorted(SETTINGS_BY_KEY))}")
            else:
                out[key] = (value, mapping.where(name))
    return out


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the closest known name (difflib), or ``""`` when none is close.

    >>> _did_you_mean("poll_intervall", ["poll_interval", "log_level"])
    "did you mean 'poll_interval'? "
    """
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def load_config(file_path: str | None, env: Mapping[str, str] | None = None,
                flags: Mapping[str, Any] | None = None) -> Config:
    """Merge defaults, the YAML file, ``GPU_EXPORTER_*`` env vars and flags into one Config.

    ``flags`` maps dotted keys to raw values given on the command line. Raises ConfigError.

    >>> load_config(None, env={}, flags={"web.listen_address": "127.0.0.1:9999"}).listen_host_port
    ('127.0.0.1', 9999)
    """
    env = os.environ if env is None else env
    raw: dict[str, tuple[Any, str]] = {}
    if file_path:
        raw.update(_read_yaml(Path(file_path)))
    for s in SETTINGS:
        if s.env in env:
            raw[s.key] = (env[s.env], f"environment variable {s.env}")
    known_env = {s.env for s in SETTINGS} | set(OTHER_ENV)
    for name in env:
        if name.startswith(ENV_PREFIX) and name not in known_env:
            raise ConfigError(f"unknown environment variable {name}; {_did_you_mean(name, known_env)}"
                              f"known: {', '.join(sorted(known_env))}")
    for key, value in (flags or {}).items():
        if value is not None:
            raw[key] = (value, f"flag {SETTINGS_BY_KEY[key].flag}")
    values: dict[str, Any] = {}
    for key, (value, where) in raw.items():
        setting = SETTINGS_BY_KEY[key]
        try:
            values[setting.attr] = setting.parse(value)
        except ValueError as err:
            raise ConfigError(f"{where}: {key}: {err}") from None
    sources = {key: where for key, (_, where) in raw.items()}
    unknown = set(values.get("collectors_disabled", ())) - set(COLLECTOR_NAMES)
    if unknown:
        raise ConfigError(f"{sources['collectors.disabled']}: collectors.disabled: unknown collector(s) "
                          f"{', '.join(sorted(unknown))}; known: {', '.join(COLLECTOR_NAMES)}")
    return dataclasses.replace(DEFAULTS, sources=sources, **values)
