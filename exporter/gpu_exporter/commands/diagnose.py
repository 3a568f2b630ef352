"""``gpu-exporter diagnose``: one verdict per GPU on why it is below the utilization target.

Reads a node's exporter (two scrapes ``--window`` apart, judged with the cause table of
:mod:`gpu_exporter.verdict.causes`) or Prometheus (the recording rules generated from that same table), joins the
live training runs on each GPU by ``uuid``, and gives each GPU one verdict: the first row of the ladder
(:data:`gpu_exporter.verdict.ladder.LADDER`) that holds. Every verdict states the effective utilization
(SM activity: GPM, a dcgm-exporter with ``--dcgm-url``, or Prometheus) beside the busy one.

This module is only the command line: the sources (:mod:`gpu_exporter.verdict.readings` for
an exporter, :mod:`gpu_exporter.commands.diagnose_sources` for Prometheus, keyed by the thresholds'
``cluster_label`` and ``uuid`` as the rules are), the judge of one moment
(:func:`gpu_exporter.verdict.timeline.judged`) and the renderings (:mod:`gpu_exporter.commands.diagnose_render`)
live in their own modules. ``--prometheus-url`` with ``--window`` and/or ``--at`` judges any window ending at any
time Prometheus still holds, from the raw counters (``diagnose_sources.from_prometheus_window``).

Only live runs count: a run that finished (it reports no current phase) or has not pushed for
``max(30 s, 2 x window)`` is listed as finished and ignored when judging. ``--run`` judges only
that run. Runs whose snapshots carry no GPU UUID cannot be joined to a GPU: they are listed
separately with the fix.

Exit status: 0 when no GPU with work is below the target, 1 when one is, 2 on bad input or an
unreachable source. Example::

    $ gpu-exporter diagnose --url http://127.0.0.1:9445 --window 30s
    $ gpu-exporter diagnose --url http://a100-node:9445 --dcgm-url http://a100-node:9400
    $ gpu-exporter diagnose --prometheus-url http://prometheus:9090 --namespace ml-team --output json
    $ gpu-exporter diagnose --prometheus-url http://prometheus:9090 --run resnet --window 2h --at=-8h
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any, TextIO

from gpu_exporter.commands import client_cli
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.client_sources import DcgmSource, ExporterSource, read_after
from gpu_exporter.commands.diagnose_render import render_json, render_text
from gpu_exporter.commands.diagnose_sources import from_prometheus, from_prometheus_window
from gpu_exporter.thresholds import ThresholdsError, load_thresholds, parse_duration
from gpu_exporter.verdict import launches
from gpu_exporter.verdict.join import unjoined_runs
from gpu_exporter.verdict.readings import dcgm, from_snapshots
from gpu_exporter.verdict.timeline import judged

DEFAULT_URL = "http://127.0.0.1:9445"
DEFAULT_WINDOW_EXPORTER = "15s"
PROMETHEUS_WINDOW = "5m"
"""The window of the recording rules diagnose reads from Prometheus."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("exit status: 0 no GPU below the target (unused and MIG GPUs do not count), 1 a GPU with work "
                     "below the target, 2 an error (bad flag, unreachable exporter or Prometheus), 130 interrupted")
    parser.add_argument("--url", default=None, metavar="URL",
                        help=f"the node's exporter (default {DEFAULT_URL}); two scrapes --window apart")
    parser.add_argument("--dcgm-url", metavar="URL",
                        help="with --url: also read a dcgm-exporter's /metrics for the SM, tensor and DRAM activity "
                             "of GPUs without GPM (A100 and older; GPM wins where the exporter has it)")
    parser.add_argument("--prometheus-url", metavar="URL",
                        help="diagnose from Prometheus instead, reading the recording rules of "
                             "prometheus/rules (a fleet; narrow it with --node/--namespace/--run)")
    parser.add_argument("--window", metavar="DURATION",
                        help=f"time to average over (default {DEFAULT_WINDOW_EXPORTER} with --url; from Prometheus "
                             f"the recording rules' {PROMETHEUS_WINDOW}, any other window is computed for you)")
    parser.add_argument("--at", metavar="TIME",
                        help="with --prometheus-url: judge the window ending at TIME (default now): --at=-8h, Unix "
                             "seconds or 2026-12-03T05:00:00Z")
    parser.add_argument("--node", help="only GPUs of this node (its node or instance label; Prometheus only)")
    parser.add_argument("--namespace", help="only GPUs allocated to pods of this Kubernetes namespace")
    parser.add_argument("--run", dest="run_name", metavar="RUN",
                        help="only the GPUs of this training run, judged by this run alone (its latest launch, with "
                             "a note on stderr when other launches of the name are live)")
    parser.add_argument("--run-id", dest="run_id", metavar="ID",
                        help="only the GPUs of the launch with this run id (its run_id label)")
    parser.add_argument("-i", "--id", metavar="ID[,ID...]", help="only these GPUs (indexes or UUIDs)")
    parser.add_argument("--thresholds", metavar="FILE",
                        help="thresholds YAML to judge with (default: the copy packaged with gpu_exporter, "
                             "which prometheus/thresholds.yml links to in a source checkout)")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text for people, json for tools")
    client_cli.add_client_arguments(parser, "--url or --prometheus-url")


def _window(text: str) -> tuple[float, str]:
    """Seconds and a label (``30s``, ``15m``) of a ``--window`` value: a duration or plain seconds."""
    value = client_cli.parse_seconds(text, "--window")
    return value, f"{value:g}s" if text.replace(".", "", 1).isdigit() else text


def _wait(seconds: float, url: str, err: TextIO) -> None:
    """Sleep ``seconds``, with a progress line on stderr (rewritten every second on a terminal)."""
    deadline, tty, first = time.monotonic() + seconds, err.isatty(), True
    start, end = ("\r", "") if tty else ("", "\n")
    while (left := deadline - time.monotonic()) > 0:
        if tty or first:
            print(f"{start}diagnose: second reading of {url} in {math.ceil(left)}s ...", end=end, file=err, flush=True)
            first = False
        time.sleep(min(1.0, left))
    if tty:
        print("\r\033[K", end="", file=err, flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        thresholds = load_thresholds(args.thresholds)
        if args.url is not None and args.prometheus_url is not None:
            raise MetricsError("--url and --prometheus-url exclude each other: read one exporter or Prometheus")
        if args.node is not None and args.prometheus_url is None:
            raise MetricsError("--node needs --prometheus-url (an exporter only knows its own node)")
        if args.at is not None and args.prometheus_url is None:
            raise MetricsError("--at needs --prometheus-url (an exporter only knows the present)")
        if args.dcgm_url is not None and args.prometheus_url is not None:
            raise MetricsError("--dcgm-url goes with --url: from Prometheus the recording rules already read "
                               "dcgm-exporter's series")
        if args.prometheus_url is not None:
            at = None if args.at is None else client_cli.parse_time(args.at, "--at")
            prom = Prometheus(args.prometheus_url, at=at,
                              connection=client_cli.connection(args, args.prometheus_url, "--prometheus-url"))
            seconds, window = _window(args.window or PROMETHEUS_WINDOW)
            ending = "" if at is None else f" ending {client_cli.iso(at)}"
            if seconds == parse_duration(PROMETHEUS_WINDOW):
                window = f"{PROMETHEUS_WINDOW}{ending} (recording rules)"
                readings = from_prometheus(prom, cluster_label=thresholds.cluster_label,
                                           launches=args.run_name is not None or args.run_id is not None,
                                           sm_active_low=thresholds.sm_active_low,
                                           utilization_target=thresholds.utilization_target)
            else:
                window = f"{window}{ending} (the rules' signals over that window)"
                readings = from_prometheus_window(prom, seconds, cluster_label=thresholds.cluster_label)
            source = prom.base
        else:
            seconds, window = _window(args.window or DEFAULT_WINDOW_EXPORTER)
            exporter = ExporterSource(args.url or DEFAULT_URL,
                                      connection=client_cli.connection(args, args.url or DEFAULT_URL, "--url"))
            first = exporter.read()
            _wait(max(0.0, seconds - (time.monotonic() - first.at)), exporter.url, sys.stderr)
            readings, source = from_snapshots(first, read_after(exporter, first.at, 5.0)), exporter.url
            if args.dcgm_url is not None:  # no credentials: the exporter's token is not sent to another server
                dcgm(readings, DcgmSource(args.dcgm_url).read())
        live = {key: launch for key, launch in readings.launches.items() if key in readings.live}
        chosen, note = launches.choose(live, args.run_name, args.run_id)
        if note is not None:
            sys.stderr.write(f"gpu-exporter: {note}\n")
        results = judged(readings, thresholds, seconds, args.run_name, chosen, args.node, args.namespace, args.id)
        if not results:
            filters = [f"--{flag} {getattr(args, dest)}" for flag, dest in
                       (("node", "node"), ("namespace", "namespace"), ("run", "run_name"), ("run-id", "run_id"),
                        ("id", "id")) if getattr(args, dest) is not None]
            raise MetricsError(f"no GPU matches {' '.join(filters)} at {source}" if filters else
                               f"{source} reports no GPUs")
    except (MetricsError, ThresholdsError) as err:
        return client_cli.fail(str(err))
    except KeyboardInterrupt:
        return client_cli.fail("interrupted", 130)
    unjoined = [(r, k) for r, k in unjoined_runs(readings) if args.run_name in (None, r)]
    if args.output == "json":
        render_json(results, source, seconds, thresholds, sys.stdout, unjoined)
    else:
        render_text(results, window, thresholds, sys.stdout, unjoined)
    return 1 if any(verdict.below_target for _, verdict in results) else 0


def register(subcommands: dict[str, Any]) -> None:
    subcommands["diagnose"] = ("say per GPU why it is below the utilization target, and the remedy",
                               add_arguments, client_cli.without_gc(run))
