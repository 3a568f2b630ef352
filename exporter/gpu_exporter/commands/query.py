"""``gpu-exporter query``: nvidia-smi's ``--query-gpu`` CSV, with utilization that does not alias.

Field names, header, units and value formats follow ``nvidia-smi --query-gpu=... --format=csv``,
so scripts written for nvidia-smi keep working. The difference: ``utilization.gpu`` and
``utilization.memory`` are the mean over the whole interval between two readings (the delta of
``gpu_busy_seconds_total`` over the time NVML covered), not NVML's newest 1/6-1 s sample. It
reads NVML in-process (default; ``--simulate`` for simulated GPUs) or a running exporter
(``--url``). Example::

    $ gpu-exporter query --query-gpu=timestamp,name,utilization.gpu,memory.used --format=csv -l 1
    timestamp, name, utilization.gpu [%], memory.used [MiB]
    2025/01/15 10:23:45.123, NVIDIA H100 80GB HBM3, 85 %, 73216 MiB
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from gpu_exporter.commands.metrics_client import (
    ExporterSource,
    MetricsError,
    NvmlSource,
    Snapshot,
    Source,
    fail,
    read_after,
)

DEFAULT_QUERY = "timestamp,name,utilization.gpu,utilization.memory,memory.used,memory.free"
NOT_AVAILABLE = "[N/A]"
_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuRow:
    """What one output row is made of: one GPU between two readings."""

    index: str
    uuid: str
    prev: Snapshot
    cur: Snapshot
    count: int

    def info(self, label: str) -> str | None:
        """A label of the GPU's ``gpu_info`` series."""
        found = self.cur.series("gpu_info", uuid=self.uuid)
        return found[0][0].get(label) if found else None

    def gauge(self, name: str) -> float | None:
        """The GPU's value of gauge ``name`` in the newer reading."""
        return self.cur.value(name, uuid=self.uuid)

    def mean_ratio(self, counter: str) -> float | None:
        """Mean of a busy-seconds counter's rate between the two readings (0-1), or None."""
        before, after = self.prev.value(counter, uuid=self.uuid), self.cur.value(counter, uuid=self.uuid)
        elapsed = self.cur.at - self.prev.at
        if before is None or after is None or elapsed <= 0 or after < before:
            return None
        return min(max((after - before) / elapsed, 0.0), 1.0)


@dataclass(frozen=True)
class Field:
    """A queryable field: nvidia-smi's name, its unit and how to compute it."""

    name: str
    unit: str
    get: Callable[[GpuRow], Any]
    aliases: tuple[str, ...] = ()
    help: str = ""

    @property
    def header(self) -> str:
        """Column header, as nvidia-smi prints it (``memory.used [MiB]``)."""
        return f"{self.name} [{self.unit}]" if self.unit else self.name


def _timestamp(row: GpuRow) -> str:
    return datetime.fromtimestamp(row.cur.wall).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _scaled(name: str, scale: float, fmt: str) -> Callable[[GpuRow], str | None]:
    def get(row: GpuRow) -> str | None:
        value = row.gauge(name)
        return None if value is None or math.isnan(value) else fmt % (value * scale)
    return get


def _mib(name: str) -> Callable[[GpuRow], str | None]:
    def get(row: GpuRow) -> str | None:
        value = row.gauge(name)
        return None if value is None else str(int(value // _MIB))
    return get


def _percent(counter: str) -> Callable[[GpuRow], str | None]:
    def get(row: GpuRow) -> str | None:
        ratio = row.mean_ratio(counter)
        return None if ratio is None else str(round(ratio * 100))
    return get


FIELDS: tuple[Field, ...] = (
    Field("timestamp", "", _timestamp, help="time of the reading, YYYY/MM/DD HH:MM:SS.msec"),
    Field("count", "", lambda r: str(r.count), help="number of GPUs read"),
    Field("index", "", lambda r: r.index, help="NVML index of the GPU"),
    Field("name", "", lambda r: r.info("name"), ("gpu_name",), "product name"),
    Field("uuid", "", lambda r: r.uuid, ("gpu_uuid",), "GPU UUID"),
    Field("pci.bus_id", "", lambda r: r.info("pci_bus_id"), ("gpu_bus_id",), "PCI bus id"),
    Field("driver_version", "", lambda r: r.info("driver_version"), help="NVIDIA driver version"),
    Field("utilization.gpu", "%", _percent("gpu_busy_seconds_total"),
          help="share of the interval in which a kernel ran (mean, not a sample)"),
    Field("utilization.memory", "%", _percent("gpu_memory_busy_seconds_total"),
          help="share of the interval in which device memory was read or written (mean)"),
    Field("memory.total", "MiB", _mib("gpu_memory_total_bytes"), help="installed memory"),
    Field("memory.reserved", "MiB", _mib("gpu_memory_reserved_bytes"), help="memory reserved by the driver"),
    Field("memory.used", "MiB", _mib("gpu_memory_used_bytes"), help="memory in use"),
    Field("memory.free", "MiB", _mib("gpu_memory_free_bytes"), help="memory free"),
    Field("power.draw", "W", _scaled("gpu_power_watts", 1.0, "%.2f"), help="power draw"),
    Field("power.limit", "W", _scaled("gpu_power_limit_watts", 1.0, "%.2f"), ("enforced.power.limit",),
          "enforced power limit"),
    Field("temperature.gpu", "", _scaled("gpu_temperature_celsius", 1.0, "%.0f"), help="die temperature, °C"),
    Field("clocks.current.sm", "MHz", _scaled("gpu_sm_clock_hertz", 1e-6, "%.0f"), ("clocks.sm",), "SM clock"),
    Field("clocks.current.memory", "MHz", _scaled("gpu_memory_clock_hertz", 1e-6, "%.0f"), ("clocks.mem",),
          "memory clock"),
    Field("fan.speed", "%", _scaled("gpu_fan_speed_ratio", 100.0, "%.0f"), help="fan speed"),
)
_BY_NAME = {name: f for f in FIELDS for name in (f.name, *f.aliases)}


class UsageError(ValueError):
    """Bad command-line input; the message is one sentence."""


def parse_fields(text: str) -> list[Field]:
    """The fields of a ``--query-gpu`` list, in order.

    >>> [f.header for f in parse_fields("name,memory.used")]
    ['name', 'memory.used [MiB]']
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--query-gpu needs at least one field, e.g. --query-gpu=name,utilization.gpu")
    for name in names:
        if name not in _BY_NAME:
            raise UsageError(f'Field "{name}" is not a valid field to query; '
                             "see gpu-exporter query --help-query-gpu")
    return [_BY_NAME[n] for n in names]


def parse_format(text: str) -> tuple[bool, bool]:
    """(header, units) from ``--format`` (``csv`` with optional ``noheader`` and ``nounits``).

    >>> parse_format("csv,noheader,nounits")
    (False, False)
    """
    options = {o.strip() for o in text.split(",")}
    if "csv" not in options or options - {"csv", "noheader", "nounits"}:
        raise UsageError(f'"--format={text}" is not valid: use csv, optionally with noheader and nounits')
    return "noheader" not in options, "nounits" not in options


def select_gpus(snapshot: Snapshot, ids: str | None) -> list[tuple[str, str]]:
    """(index, uuid) of the GPUs to print, in index order; ``ids`` is ``--id`` (indexes, UUIDs, bus ids)."""
    gpus = sorted(((labels.get("gpu", ""), labels.get("uuid", ""), labels.get("pci_bus_id", ""))
                   for labels, _ in snapshot.series("gpu_info")),
                  key=lambda g: (int(g[0]) if g[0].isdigit() else 1 << 30, g[0]))
    if ids is None:
        return [(index, uuid) for index, uuid, _ in gpus]
    chosen = []
    for wanted in (w.strip() for w in ids.split(",") if w.strip()):
        match = [(index, uuid) for index, uuid, bus in gpus if wanted in (index, uuid) or
                 wanted.lower() == bus.lower()]
        if not match:
            known = ", ".join(index for index, _, _ in gpus) or "none"
            raise UsageError(f"no GPU matches --id {wanted} (GPU indexes here: {known})")
        chosen += [m for m in match if m not in chosen]
    return chosen


def format_rows(fields: Sequence[Field], prev: Snapshot, cur: Snapshot, gpus: Sequence[tuple[str, str]],
                units: bool) -> list[str]:
    """One CSV line per GPU; GPUs gone from the newer reading are skipped."""
    present = {labels.get("uuid") for labels, _ in cur.series("gpu_info")}
    rows = [GpuRow(index, uuid, prev, cur, count=len(present)) for index, uuid in gpus if uuid in present]
    lines = []
    for row in rows:
        cells = []
        for f in fields:
            value = f.get(row)
            if value is None:
                cells.append(NOT_AVAILABLE)
            else:
                cells.append(f"{value} {f.unit}" if units and f.unit else str(value))
        lines.append(", ".join(cells))
    return lines


def run_query(source: Source, fields: Sequence[Field], ids: str | None, header: bool, units: bool,
              interval: float, count: int | None, out: TextIO) -> None:
    """Print ``count`` sets of rows (forever when None), each the mean over ``interval`` seconds."""
    prev = source.read()
    gpus = select_gpus(prev, ids)
    if header:
        out.write(", ".join(f.header for f in fields) + "\n")
        out.flush()
    printed = 0
    while count is None or printed < count:
        time.sleep(max(0.0, interval - (time.monotonic() - prev.at)))
        cur = read_after(source, prev.at, patience=max(5.0, interval))
        out.write("".join(line + "\n" for line in format_rows(fields, prev, cur, gpus, units)))
        out.flush()
        prev, printed = cur, printed + 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpu-exporter query`` (nvidia-smi's names where nvidia-smi has one)."""
    parser.add_argument("--query-gpu", "-q", default=DEFAULT_QUERY, metavar="FIELDS",
                        help=f"comma-separated fields (default {DEFAULT_QUERY}); see --help-query-gpu")
    parser.add_argument("--format", default="csv", metavar="csv[,noheader][,nounits]",
                        help="output format, as nvidia-smi's (default csv)")
    parser.add_argument("--help-query-gpu", action="store_true", help="list the fields and exit")
    parser.add_argument("-l", "--loop", type=float, metavar="SECONDS",
                        help="print a row per GPU every SECONDS (each the mean over those seconds) until Ctrl-C")
    parser.add_argument("-c", "--count", type=int, metavar="N", help="stop after N rows per GPU (default: 1 "
                        "without -l, unlimited with -l)")
    parser.add_argument("-i", "--id", metavar="ID[,ID...]", help="GPUs to show: indexes, UUIDs or PCI bus ids")
    parser.add_argument("--url", metavar="URL", help="read a running exporter (http://HOST:PORT) instead of NVML")
    parser.add_argument("--simulate", nargs="?", const="", metavar="SCENARIO",
                        help="read simulated GPUs (packaged default, a packaged scenario name or a YAML file)")


def _help_query_gpu() -> str:
    lines = ["Fields for --query-gpu (nvidia-smi names; values as nvidia-smi prints them):"]
    for f in FIELDS:
        names = ", ".join((f.name, *f.aliases))
        lines.append(f"  {names:44} {f.help}{f' [{f.unit}]' if f.unit else ''}")
    lines.append(f"Values that the GPU or driver does not report are printed as {NOT_AVAILABLE}.")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run ``gpu-exporter query``; 0 on success (or Ctrl-C), 2 on bad input or an unreadable source."""
    if args.help_query_gpu:
        sys.stdout.write(_help_query_gpu())
        return 0
    try:
        fields = parse_fields(args.query_gpu)
        header, units = parse_format(args.format)
        if args.loop is not None and not (args.loop > 0 and math.isfinite(args.loop)):
            raise UsageError(f"-l must be a number of seconds > 0, not {args.loop:g}")
        if args.count is not None and args.count < 1:
            raise UsageError(f"-c must be at least 1, not {args.count}")
        if args.url is not None and args.simulate is not None:
            raise UsageError("--url and --simulate exclude each other: read an exporter or simulated GPUs")
    except UsageError as err:
        return fail(str(err))
    count = args.count if args.count is not None else (None if args.loop is not None else 1)
    source: ExporterSource | NvmlSource
    try:
        source = ExporterSource(args.url) if args.url is not None else NvmlSource(args.simulate)
    except MetricsError as err:
        return fail(str(err))
    try:
        run_query(source, fields, args.id, header, units, args.loop or 1.0, count, sys.stdout)
    except (MetricsError, UsageError) as err:
        return fail(str(err))
    except (KeyboardInterrupt, BrokenPipeError):
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()
        return 0
    finally:
        if isinstance(source, NvmlSource):
            source.close()
    return 0


def register(subcommands: dict[str, Any]) -> None:
    """Add ``query`` to the CLI's sub-command registry (``gpu_exporter.cli.SUBCOMMANDS``)."""
    subcommands["query"] = ("print GPU fields as CSV like nvidia-smi --query-gpu, with interval-mean utilization",
                            add_arguments, run)
