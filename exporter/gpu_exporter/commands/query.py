"""``gpu-exporter query``: nvidia-smi's ``--query-gpu`` and ``--query-compute-apps`` CSV, with utilization that
does not alias.

Field names, headers, units and value formats follow ``nvidia-smi --query-gpu=... --format=csv`` for the fields
listed by ``--help-query-gpu`` (docs/cli.md compares them with nvidia-smi's; other nvidia-smi fields are refused
with nvidia-smi's message). The difference: ``utilization.gpu`` and ``utilization.memory`` are the mean over the
whole interval between two readings (the delta of ``gpu_busy_seconds_total`` over the time NVML covered), not
NVML's newest 1/6-1 s sample. The first row comes at once, with the mean over the exporter's last poll interval
(in-process: over the samples NVML still holds). With ``--url`` a reading counts only when it comes from a new poll
of the exporter (its poll time at least half a poll interval newer); a repeated poll prints ``[N/A]``, never a 0 %
or 100 % made of scrape jitter. It reads NVML in-process (default; ``--simulate`` for simulated GPUs) or a running
exporter (``--url``). Example::

    $ gpu-exporter query --query-gpu=timestamp,name,utilization.gpu,memory.used --format=csv -l 1
    timestamp, name, utilization.gpu [%], memory.used [MiB]
    2025/01/15 10:23:45.123, NVIDIA H100 80GB HBM3, 85 %, 73216 MiB
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from gpu_exporter import catalog
from gpu_exporter.commands.client_cli import (
    EXIT_NO_DRIVER,
    add_client_arguments,
    client_flags_given,
    connection,
    fail,
    parse_seconds,
)
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_sources import ExporterSource, NoDriver, NvmlSource, Source, new_poll_gap, read_after
from gpu_exporter.verdict.samples import Snapshot

DEFAULT_QUERY = "timestamp,name,utilization.gpu,utilization.memory,memory.used,memory.free"
DEFAULT_LOOP_SECONDS = 5.0
"""``-l`` without a value: nvidia-smi's default."""
NOT_AVAILABLE = "[N/A]"
GPU_LOST = "[GPU is lost]"
"""What nvidia-smi prints for a value of a GPU that NVML reports lost (NVML_ERROR_GPU_IS_LOST)."""
_MIB = 1024 * 1024
_RATIO_GAUGE = {catalog.GPU_BUSY_SECONDS_TOTAL.name: catalog.GPU_UTILIZATION_RATIO.name,
                catalog.GPU_MEMORY_BUSY_SECONDS_TOTAL.name: catalog.GPU_MEMORY_UTILIZATION_RATIO.name}


def _info(cur: Snapshot, uuid: str, label: str) -> str | None:
    found = cur.series(catalog.GPU_INFO.name, uuid=uuid)
    return found[0][0].get(label) if found else None


@dataclass(frozen=True)
class GpuRow:
    """One GPU between two readings: ``prev`` is None for the first row (then utilization is the exporter's mean
    over its last poll interval); ``fresh`` is False when ``cur`` repeats the poll of ``prev`` (then nothing that
    needs an interval is printed)."""

    index: str
    uuid: str
    prev: Snapshot | None
    cur: Snapshot
    count: int
    fresh: bool = True

    def gauge(self, name: str) -> float | None:
            return self.cur.value(name, uuid=self.uuid)

    def rate(self, counter: str) -> float | None:
        """The counter's mean rate per second between the two readings, or None."""
        if self.prev is None or not self.fresh:
            return None
        before, after = self.prev.value(counter, uuid=self.uuid), self.cur.value(counter, uuid=self.uuid)
        elapsed = self.cur.at - self.prev.at
        if before is None or after is None or elapsed <= 0 or after < before:
            return None
        return (after - before) / elapsed

    def mean_ratio(self, counter: str) -> float | None:
        """Mean of a busy-seconds counter's rate between the two readings (0-1), or None."""
        first_row = self.prev is None and self.fresh
        ratio = self.gauge(_RATIO_GAUGE[counter]) if first_row else self.rate(counter)
        return None if ratio is None or math.isnan(ratio) else min(max(ratio, 0.0), 1.0)


@dataclass(frozen=True)
class Field:
    """A queryable field: nvidia-smi's name, its unit and how to compute it."""

    name: str
    unit: str
    get: Callable[[Any], Any]
    help: str = ""
    aliases: tuple[str, ...] = ()
    identity: bool = False
    """Known for a lost GPU too (from the reading before it was lost)."""

    @property
    def header(self) -> str:
        """Column header, as nvidia-smi prints it (``memory.used [MiB]``)."""
        return f"{self.name} [{self.unit}]" if self.unit else self.name


def _timestamp(row: GpuRow | AppRow) -> str:
    return datetime.fromtimestamp(row.cur.wall).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _scaled(name: str, scale: float = 1.0, fmt: str = "%.2f") -> Callable[[GpuRow], str | None]:
    def get(row: GpuRow) -> str | None:
        value = row.gauge(name)
        return None if value is None or math.isnan(value) else fmt % (value * scale)
    return get


def _in_mib(value: float | None) -> str | None:
    """Whole MiB, as nvidia-smi prints memory; None ([N/A]) for no reading or one that is not a number."""
    return None if value is None or not math.isfinite(value) else str(int(value // _MIB))


def _mib(name: str) -> Callable[[GpuRow], str | None]:
    return lambda row: _in_mib(row.gauge(name))


def _percent(counter: str) -> Callable[[GpuRow], str | None]:
    return lambda row: None if (ratio := row.mean_ratio(counter)) is None else str(round(ratio * 100))


def _average_power(row: GpuRow) -> str | None:
    watts = row.rate(catalog.GPU_ENERGY_JOULES_TOTAL.name)
    return None if watts is None else f"{watts:.2f}"


FIELDS: tuple[Field, ...] = (
    Field("timestamp", "", _timestamp, "time of the reading, YYYY/MM/DD HH:MM:SS.msec", identity=True),
    Field("driver_version", "", lambda r: _info(r.cur, r.uuid, "driver_version"), "NVIDIA driver version"),
    Field("count", "", lambda r: str(r.count), "number of GPUs read", identity=True),
    Field("name", "", lambda r: _info(r.cur, r.uuid, "name"), "product name", ("gpu_name",), identity=True),
    Field("uuid", "", lambda r: r.uuid, "GPU UUID", ("gpu_uuid",), identity=True),
    Field("pci.bus_id", "", lambda r: _info(r.cur, r.uuid, "pci_bus_id"), "PCI bus id", ("gpu_bus_id",), identity=True),
    Field("index", "", lambda r: r.index, "NVML index of the GPU", identity=True),
    Field("utilization.gpu", "%", _percent(catalog.GPU_BUSY_SECONDS_TOTAL.name),
          "share of the interval in which a kernel ran (mean, not a sample)"),
    Field("utilization.memory", "%", _percent(catalog.GPU_MEMORY_BUSY_SECONDS_TOTAL.name),
          "share of the interval in which device memory was read or written (mean)"),
    Field("memory.total", "MiB", _mib(catalog.GPU_MEMORY_TOTAL_BYTES.name), "installed memory"),
    Field("memory.reserved", "MiB", _mib(catalog.GPU_MEMORY_RESERVED_BYTES.name), "memory reserved by the driver"),
    Field("memory.used", "MiB", _mib(catalog.GPU_MEMORY_USED_BYTES.name), "memory in use"),
    Field("memory.free", "MiB", _mib(catalog.GPU_MEMORY_FREE_BYTES.name), "memory free"),
    Field("temperature.gpu", "", _scaled(catalog.GPU_TEMPERATURE_CELSIUS.name, fmt="%.0f"), "die temperature, °C"),
    Field("power.draw", "W", _scaled(catalog.GPU_POWER_WATTS.name), "power draw (NVML's power usage)"),
    Field("power.draw.average", "W", _average_power,
          "mean power over the interval, from the energy counter ([N/A] on the first row)"),
    Field("power.draw.instant", "W", _scaled(catalog.GPU_POWER_WATTS.name),
          "NVML's power usage reading, as power.draw"),
    Field("power.limit", "W", _scaled(catalog.GPU_POWER_LIMIT_WATTS.name),
          "the enforced power limit (the exporter reads no separate software limit)"),
    Field("enforced.power.limit", "W", _scaled(catalog.GPU_POWER_LIMIT_WATTS.name),
          "the power limit the driver enforces"),
    Field("clocks.current.sm", "MHz", _scaled(catalog.GPU_SM_CLOCK_HERTZ.name, 1e-6, "%.0f"), "SM clock",
          ("clocks.sm",)),
    Field("clocks.current.memory", "MHz", _scaled(catalog.GPU_MEMORY_CLOCK_HERTZ.name, 1e-6, "%.0f"), "memory clock",
          ("clocks.mem",)),
    Field("fan.speed", "%", _scaled(catalog.GPU_FAN_SPEED_RATIO.name, 100.0, "%.0f"), "fan speed"),
)


@dataclass(frozen=True)
class AppRow:
    """One process on one GPU, for ``--query-compute-apps``."""

    labels: dict[str, str]
    memory_bytes: float
    cur: Snapshot


APP_FIELDS: tuple[Field, ...] = (
    Field("timestamp", "", _timestamp, "time of the reading"),
    Field("gpu_name", "", lambda r: _info(r.cur, r.labels.get("uuid", ""), "name"),
          "product name of the process's GPU"),
    Field("gpu_bus_id", "", lambda r: _info(r.cur, r.labels.get("uuid", ""), "pci_bus_id"),
          "PCI bus id of the process's GPU"),
    Field("gpu_serial", "", lambda r: None, "serial number of the GPU (not exported: [N/A])"),
    Field("gpu_uuid", "", lambda r: r.labels.get("uuid"), "UUID of the process's GPU"),
    Field("pid", "", lambda r: r.labels.get("pid"), "process id (host PID)"),
    Field("process_name", "", lambda r: r.labels.get("process_name"), "process name"),
    Field("used_gpu_memory", "MiB", lambda r: _in_mib(r.memory_bytes), "GPU memory used by the process",
          ("used_memory",)),
)


class UsageError(ValueError):
    """Bad command-line input; the message is one sentence."""


def parse_fields(text: str, fields: Sequence[Field] = FIELDS, flag: str = "--query-gpu") -> list[Field]:
    """The fields of a ``--query-gpu`` (or ``--query-compute-apps``) list, in order.

    >>> [f.header for f in parse_fields("name,memory.used")]
    ['name', 'memory.used [MiB]']
    >>> [f.header for f in parse_fields("pid,used_memory", APP_FIELDS, "--query-compute-apps")]
    ['pid', 'used_gpu_memory [MiB]']
    """
    by_name = {name: f for f in fields for name in (f.name, *f.aliases)}
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{flag} needs at least one field, e.g. {flag}={fields[0].name},{fields[-1].name}")
    for name in names:
        if name not in by_name:
            raise UsageError(f'Field "{name}" is not a valid field to query; '
                             f"see gpu-exporter query --help-{flag.removeprefix('--')}")
    return [by_name[n] for n in names]


def parse_format(text: str) -> tuple[bool, bool]:
    """(header, units) from ``--format`` (``csv`` with optional ``noheader`` and ``nounits``).

    >>> parse_format("csv,noheader,nounits")
    (False, False)
    """
    options = {o.strip() for o in text.split(",")}
    if "csv" not in options or options - {"csv", "noheader", "nounits"}:
        raise UsageError(f'"--format={text}" is not valid: use csv, optionally with noheader and nounits')
    return "noheader" not in options, "nounits" not in options


_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def bus_key(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI bus id, long or short; None if it is not one.

    >>> bus_key("00000000:3B:00.0") == bus_key("3b:00.0") == bus_key("0000:3B:0.0")
    True
    """
    match = _BUS_ID.match(text.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function)


def select_gpus(snapshot: Snapshot, ids: str | None) -> list[tuple[str, str]]:
    """(index, uuid) of the GPUs to print, in index order; ``ids`` is ``--id`` (indexes, UUIDs, PCI bus ids)."""
    gpus = sorted(((labels.get("gpu", ""), labels.get("uuid", ""), labels.get("pci_bus_id", ""))
                   for labels, _ in snapshot.series(catalog.GPU_INFO.name)),
                  key=lambda g: (int(g[0]) if g[0].isdigit() else 1 << 30, g[0]))
    if ids is None:
        return [(index, uuid) for index, uuid, _ in gpus]
    chosen = []
    for wanted in (w.strip() for w in ids.split(",") if w.strip()):
        wanted_bus = bus_key(wanted)
        match = [(index, uuid) for index, uuid, bus in gpus if wanted in (index, uuid) or
                 (wanted_bus is not None and wanted_bus == bus_key(bus))]
        if not match:
            known = ", ".join(index for index, _, _ in gpus) or "none"
            raise UsageError(f"no GPU matches --id {wanted} (GPU indexes here: {known})")
        chosen += [m for m in match if m not in chosen]
    return chosen


def _cells(fields: Sequence[Field], row: Any, units: bool, lost: bool = False) -> str:
    cells = []
    for f in fields:
        value = f.get(row) if f.identity or not lost else GPU_LOST
        if value is not None and value != GPU_LOST and units and f.unit:
            value = f"{value} {f.unit}"
        cells.append(NOT_AVAILABLE if value is None else str(value))
    return ", ".join(cells)


def format_rows(fields: Sequence[Field], prev: Snapshot | None, cur: Snapshot, gpus: Sequence[tuple[str, str]],
                units: bool, fresh: bool = True, first: Snapshot | None = None) -> list[str]:
    """One CSV line per GPU. A GPU gone from ``cur`` since ``first`` (the reading the GPUs were
    chosen from) prints its identity fields from ``first`` and ``[GPU is lost]`` elsewhere."""
    present = {labels.get("uuid") for labels, _ in cur.series(catalog.GPU_INFO.name)}
    count = len(present)
    known = first if first is not None else (prev or cur)
    gone = Snapshot(known.samples, at=cur.at, wall=cur.wall)
    return [_cells(fields, GpuRow(index, uuid, prev, cur, count, fresh), units) if uuid in present
            else _cells(fields, GpuRow(index, uuid, None, gone, count, False), units, lost=True)
            for index, uuid in gpus]


def format_apps(fields: Sequence[Field], cur: Snapshot, gpus: Sequence[tuple[str, str]], units: bool) -> list[str]:
    """One CSV line per process on the chosen GPUs (whole-GPU processes, by GPU index then pid)."""
    order = {uuid: i for i, (_, uuid) in enumerate(gpus)}
    apps = [AppRow(labels, value, cur) for labels, value in cur.series(catalog.GPU_PROCESS_MEMORY_USED_BYTES.name)
            if labels.get("uuid") in order]
    apps.sort(key=lambda a: (order[a.labels.get("uuid", "")], int(a.labels.get("pid", "0") or 0)))
    return [_cells(fields, app, units) for app in apps]


def _write(out: TextIO, lines: Sequence[str]) -> None:
    out.write("".join(line + "\n" for line in lines))
    out.flush()


def run_query(source: Source, fields: Sequence[Field], ids: str | None, header: bool, units: bool,
              interval: float, count: int | None, out: TextIO, apps: bool = False) -> None:
    """Print ``count`` sets of rows (forever when None): the first at once, then one every ``interval``
    seconds, each the mean since the last accepted reading (a repeated poll prints ``[N/A]``: module docstring)."""
    first = source.read()
    gpus = select_gpus(first, ids)
    if header:
        _write(out, [", ".join(f.header for f in fields)])
    base, cur, fresh = None, first, True
    started, printed = time.monotonic(), 0
    while True:
        _write(out, format_apps(fields, cur, gpus, units) if apps else
               format_rows(fields, base, cur, gpus, units, fresh, first))
        printed += 1
        if fresh:
            base = cur
        if count is not None and printed >= count:
            return
        time.sleep(max(0.0, started + printed * interval - time.monotonic()))
        # an exporter's reading counts only from a new poll; in-process reads always poll anew
        gap = max(interval / 2, new_poll_gap(source)) if new_poll_gap(source) else 0.0
        cur = read_after(source, base.at if base is not None else cur.at, patience=min(interval, 5.0), min_gap=gap)
        fresh = base is None or cur.at - base.at >= max(gap, 1e-6)


def _loop_seconds(text: str) -> float:
    """``-l``'s value: seconds as nvidia-smi takes them, or a duration (``500ms``, ``1m``); 0 and less: _interval."""
    try:
        return float(text)
    except ValueError:
        try:
            return parse_seconds(text, "-l")
        except MetricsError as err:
            raise argparse.ArgumentTypeError(str(err)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpu-exporter query``: nvidia-smi's names, no short form that means something else there."""
    parser.allow_abbrev = False
    parser.epilog = (f"exit status: 0 rows printed (or stopped by Ctrl-C), {EXIT_NO_DRIVER} no NVIDIA driver (reading "
                     "NVML in-process), 2 an error (bad flag or field, unreadable exporter or scenario)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--query-gpu", metavar="FIELDS",
                      help=f"comma-separated GPU fields (default {DEFAULT_QUERY}); see --help-query-gpu")
    what.add_argument("--query-compute-apps", metavar="FIELDS",
                      help="comma-separated process fields, one row per process (pid,process_name,used_memory,...)"
                      "; see --help-query-compute-apps")
    parser.add_argument("--format", default="csv", metavar="csv[,noheader][,nounits]",
                        help="output format, as nvidia-smi's (default csv)")
    parser.add_argument("--help-query-gpu", action="store_true", help="list the GPU fields and exit")
    parser.add_argument("--help-query-compute-apps", action="store_true", help="list the process fields and exit")
    loop = parser.add_mutually_exclusive_group()
    loop.add_argument("-l", "--loop", type=_loop_seconds, nargs="?", const=DEFAULT_LOOP_SECONDS, metavar="SECONDS",
                      help="print rows every SECONDS, or a duration such as 500ms or 1m (default 5 without a value; "
                      "each row the mean over that time) until Ctrl-C")
    loop.add_argument("-lms", "--loop-ms", type=float, metavar="MILLISECONDS", help="as -l, in milliseconds")
    parser.add_argument("--count", type=int, metavar="N", help="stop after N sets of rows (default: 1 without a "
                        "loop, unlimited with one); no short form: nvidia-smi's -c is --compute-mode")
    parser.add_argument("-i", "--id", metavar="ID[,ID...]",
                        help="GPUs to show: indexes, UUIDs or PCI bus ids (00000000:3B:00.0 or 3b:00.0)")
    parser.add_argument("--url", metavar="URL", help="read a running exporter (http(s)://HOST:PORT) instead of NVML")
    parser.add_argument("--simulate", nargs="?", const="", metavar="SCENARIO",
                        help="read simulated GPUs (packaged default, a packaged scenario name or a YAML file)")
    add_client_arguments(parser, "--url")


def _help(title: str, fields: Sequence[Field]) -> str:
    lines = [f"  {', '.join((f.name, *f.aliases)):44} {f.help}{f' [{f.unit}]' if f.unit else ''}" for f in fields]
    return "\n".join([title, *lines, f"Values that the GPU or driver does not report are printed as {NOT_AVAILABLE}; "
                      f"values of a GPU lost since the first reading as {GPU_LOST}."]) + "\n"


def _interval(args: argparse.Namespace) -> float | None:
    for flag, value, unit, per_s in (("-lms", args.loop_ms, "milliseconds", 1000), ("-l", args.loop, "seconds", 1)):
        if value is not None:
            if not (value > 0 and math.isfinite(value)):
                raise UsageError(f"{flag} must be a number of {unit} > 0, not {value:g}")
            return float(value) / per_s
    return None


def run(args: argparse.Namespace) -> int:
    if args.help_query_gpu or args.help_query_compute_apps:
        sys.stdout.write(_help("Fields for --query-gpu (nvidia-smi names; values as nvidia-smi prints them):", FIELDS)
                         if args.help_query_gpu else
                         _help("Fields for --query-compute-apps (nvidia-smi names):", APP_FIELDS))
        return 0
    apps = args.query_compute_apps is not None
    try:
        fields = (parse_fields(args.query_compute_apps, APP_FIELDS, "--query-compute-apps") if apps
                  else parse_fields(args.query_gpu or DEFAULT_QUERY))
        header, units = parse_format(args.format)
        interval = _interval(args)
        if args.count is not None and args.count < 1:
            raise UsageError(f"--count must be at least 1, not {args.count}")
        if args.url is not None and args.simulate is not None:
            raise UsageError("--url and --simulate exclude each other: read an exporter or simulated GPUs")
        if args.url is None and client_flags_given(args):
            raise UsageError(f"{' and '.join(client_flags_given(args))} apply to --url only")
    except UsageError as err:
        return fail(str(err))
    count = args.count if args.count is not None else (None if interval is not None else 1)
    source: ExporterSource | NvmlSource | None = None
    try:
        source = (ExporterSource(args.url, connection=connection(args, args.url, "--url")) if args.url is not None
                  else NvmlSource(args.simulate))
        run_query(source, fields, args.id, header, units, interval or 1.0, count, sys.stdout, apps=apps)
    except NoDriver as err:
        return fail(str(err), EXIT_NO_DRIVER)
    except (MetricsError, UsageError) as err:
        return fail(str(err))
    except KeyboardInterrupt:
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()
        return 0
    finally:
        if isinstance(source, NvmlSource):
            source.close()
    return 0


def register(subcommands: dict[str, Any]) -> None:
    subcommands["query"] = ("print GPU fields as CSV like nvidia-smi --query-gpu, with interval-mean utilization",
                            add_arguments, run)
