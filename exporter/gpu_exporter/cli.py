"""Command line: ``gpu-exporter [serve] [flags]`` (the default sub-command).

Every setting of :mod:`gpu_exporter.config` is a flag (``--poll-interval``,
``--web.listen-address``, ...); ``--simulate [SCENARIO]`` runs on simulated GPUs.

Example::

    gpu-exporter --simulate --web.listen-address :9445
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar

from gpu_exporter import __version__
from gpu_exporter.config import DURATION_EXAMPLES, SETTINGS, ConfigError, load_config

SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def _packaged_scenarios() -> list[str]:
    """simulate.scenario.packaged_scenarios without importing the simulation (serve must not load it)."""
    return sorted(p.stem for p in (Path(__file__).parent / "simulate" / "scenarios").glob("*.yaml"))


SERVE_EXIT_STATUS = ("exit status: 0 stopped by SIGTERM or SIGINT, 1 no NVIDIA driver (without --simulate) or the "
                     "listen address in use, 2 a bad flag, setting, config file, web config file or scenario")
"""What ``serve``'s exit statuses mean (its --help epilog; docs/configuration.md quotes it)."""


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = SERVE_EXIT_STATUS
    parser.add_argument("--config", metavar="FILE", help="YAML config file (flags > env > file > defaults)")
    for setting in SETTINGS:
        if setting.key in ("simulate.enabled", "simulate.scenario"):
            continue
        default = f"; default {setting.default_text}" if setting.default_text else ""
        unit = f" ({DURATION_EXAMPLES}, or seconds)" if setting.is_duration else ""
        parser.add_argument(setting.flag, *setting.alias_flags, dest=setting.attr, metavar=setting.metavar,
                            help=f"{setting.help}{unit} [env {setting.env}{default}]")
    parser.add_argument("--simulate", nargs="?", const="", metavar="SCENARIO",
                        help="run on simulated GPUs: the packaged default, a packaged scenario name ("
                             f"{', '.join(_packaged_scenarios())}) or a scenario YAML file "
                             "[env GPU_EXPORTER_SIMULATE_ENABLED, GPU_EXPORTER_SIMULATE_SCENARIO]")


class LogFormatter(logging.Formatter):
    """One line per record, as exporter-toolkit's: ``logfmt`` (``ts=... level=info logger=... msg="..."``) or
    ``json`` (the same keys in one JSON object). A traceback goes into ``exc``.

    >>> record = logging.LogRecord("gpu_exporter.server", logging.WARNING, "", 0, "port %d in use", (9445,), None)
    >>> record.created, record.msecs = 0.0, 0.0
    >>> LogFormatter("logfmt").format(record)
    'ts=1970-01-01T00:00:00.000Z level=warn logger=gpu_exporter.server msg="port 9445 in use"'
    """

    LEVELS: ClassVar[dict[str, str]] = {"WARNING": "warn", "CRITICAL": "error"}

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style_name = style

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        fields = {"ts": stamp, "level": self.LEVELS.get(record.levelname, record.levelname.lower()),
                  "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.style_name == "json":
            return json.dumps(fields)
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())


def _logfmt_value(value: str) -> str:
    return value if value and not any(c in value for c in ' ="\\') and value.isprintable() else json.dumps(value)


def setup_logging(level: str, style: str) -> None:
    """Log at ``level`` (debug, info, warning, error) to stderr in ``style`` (logfmt or json)."""
    handler = logging.StreamHandler()
    handler.setFormatter(LogFormatter(style))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def _serve(args: argparse.Namespace) -> int:
    from gpu_exporter.commands.client_cli import EXIT_NO_DRIVER, fail

    flags: dict[str, Any] = {s.key: getattr(args, s.attr, None) for s in SETTINGS}
    if args.simulate is not None:
        flags["simulate.enabled"] = True
        flags["simulate.scenario"] = args.simulate or None
    try:
        config = load_config(args.config, flags=flags)
    except ConfigError as err:
        return fail(str(err))
    setup_logging(config.log_level, config.log_format)

    from gpu_exporter.app import Exporter
    from gpu_exporter.nvml import DriverNotFound
    from gpu_exporter.server import AddressInUse

    # Until the exporter serves, SIGTERM and SIGINT keep their default action: a slow start (bcrypt
    # hashing, TLS setup, a hanging file) ends at once instead of after the slow step returns.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    stop = threading.Event()

    def handle_signals() -> None:
        """From the first answered request on, SIGTERM and SIGINT stop the exporter cleanly (exit 0)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())

    try:
        exporter = Exporter(config)
        exporter.start(before_serving=handle_signals)
    except DriverNotFound as err:
        return fail(str(err), EXIT_NO_DRIVER)
    except AddressInUse as err:
        return fail(str(err), 1)
    except ValueError as err:  # a bad scenario or web config file
        return fail(str(err))
    try:
        stop.wait()
    finally:
        exporter.stop()
    return 0


SUBCOMMANDS["serve"] = ("serve metrics (the default)", _add_serve_arguments, _serve)
COMMAND_MODULES = {"query": "gpu_exporter.commands.query", "diagnose": "gpu_exporter.commands.diagnose",
                   "report": "gpu_exporter.commands.report"}
"""Sub-commands whose module registers itself on first use: serving never imports them."""


def command_names() -> list[str]:
    """Every sub-command, serve first, without importing the lazily registered ones."""
    return ["serve", *COMMAND_MODULES]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every sub-command (only ``command``'s when given).

    The usage line names every sub-command either way, so an error never hides one.
    """
    for name in [command] if command in COMMAND_MODULES else [] if command else COMMAND_MODULES:
        if name not in SUBCOMMANDS:
            import_module(COMMAND_MODULES[name]).register(SUBCOMMANDS)
    parser = argparse.ArgumentParser(
        prog="gpu-exporter",
        description="Prometheus exporter that finds NVIDIA GPUs below 30% utilization and explains why.",
        epilog="Without a sub-command it serves metrics: see 'gpu-exporter serve --help' for every flag.",
        allow_abbrev=False)
    parser.add_argument("-V", "--version", action="version", version=f"gpu-exporter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(command_names()) + "}")
    for name, (help_text, add_arguments, run) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        add_arguments(sp)
        sp.set_defaults(run=run)
    return parser


def _unknown_command(word: str) -> int:
    """A first word that is no sub-command (serve takes no positional argument): name every sub-command."""
    names = command_names()
    close = difflib.get_close_matches(word, names, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    build_parser("serve").error(f"unknown sub-command '{word}'{hint} (choose from {', '.join(names)})")
    return 2  # not reached: error() exits with status 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpu-exporter`` console script; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and not args_list[0].startswith("-") and args_list[0] not in command_names():
        return _unknown_command(args_list[0])
    if not args_list or (args_list[0] not in command_names()
                         and args_list[0] not in ("-h", "--help", "-V", "--version")):
        args_list.insert(0, "serve")
    command = args_list[0] if args_list[0] in command_names() else None
    args = build_parser(command).parse_args(args_list)
    try:
        code: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return closed_output()
    return code


EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE
"""The exit status when the reader of the output went away (``| head``): a shell's for a program SIGPIPE ended."""


def closed_output() -> int:
    """Quietly stop a command whose output's reader went away: no traceback, and stdout pointed at /dev/null so
    the interpreter's last flush at exit does not fail again. Returns :data:`EXIT_OUTPUT_CLOSED`."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OUTPUT_CLOSED


if __name__ == "__main__":
    sys.exit(main())
