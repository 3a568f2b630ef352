"""``gpu-exporter report --list`` and ``report --fleet``: the runs of a range, and what a fleet's GPUs lost and why.

The run report answers one run's owner; the platform team asks *what did our GPUs lose last night, for which
teams, and why*. This module is the command line (``report`` adds its flags to its own): read the range
(:mod:`gpu_exporter.commands.fleet_sources`: every GPU judged at every point, the launches in it), add it up
(:mod:`gpu_exporter.verdict.fleet`), print it (:mod:`gpu_exporter.commands.fleet_render`).
"""

from __future__ import annotations

import argparse

from gpu_exporter.commands.client_cli import parse_seconds, parse_time
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.fleet_render import LIST_RENDERERS, RENDERERS
from gpu_exporter.commands.fleet_sources import judge_range, load_prices
from gpu_exporter.thresholds import Thresholds
from gpu_exporter.verdict.fleet import TEAM_TAG, TOP, fleet, keep_launches

DEFAULT_FROM = "-24h"
"""``--from`` of ``--list`` and ``--fleet`` when not given (``--to``: now)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``report --list`` and ``report --fleet`` (``report`` adds them to its own)."""
    group = parser.add_argument_group("runs and fleet", "--list and --fleet take --from/--to (default "
                                      f"{DEFAULT_FROM} .. now), --step, --output, --out")
    what = group.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true",
                      help="list the training runs in the range: run id, name, tags, owner, ranks, GPUs, wall time, "
                           "mean utilization, main cause")
    what.add_argument("--fleet", action="store_true",
                      help="the fleet report over the range: GPU-hours, GPU-hours below target and idle, by cause, "
                           f"team (tag {TEAM_TAG}), namespace, node and GPU model; top offenders with their remedy")
    group.add_argument("--namespace", help="only GPU time of pods in this Kubernetes namespace")
    group.add_argument("--team", help=f"only the runs whose tag {TEAM_TAG} is TEAM")
    group.add_argument("--node", help="only GPUs of this node (its node or instance label)")
    group.add_argument("--prices", metavar="FILE",
                       help="YAML: currency and gpu_hour (price per GPU-hour per GPU model, as the GPU's name label "
                            "spells it, or default): --fleet adds the money lost")
    group.add_argument("--top", type=int, default=TOP, metavar="N", help=f"offenders to list (default {TOP})")


def range_text(args: argparse.Namespace, prom: Prometheus, t: Thresholds) -> str:
    """What ``report --list`` / ``report --fleet`` print; MetricsError on bad flags or an unreadable Prometheus
    (``report``'s :func:`~gpu_exporter.commands.report.run` prints it as one line, exit status 2)."""
    if args.run_name is not None or args.run_id is not None:
        raise MetricsError("--list and --fleet cover every run of the range: drop --run/--run-id")
    if args.list and args.output == "html":
        raise MetricsError("--list writes text, markdown or json (--output html is for a report)")
    if args.top < 0:
        raise MetricsError(f"--top: {args.top} is not a count of offenders (0 or more)")
    prices = load_prices(args.prices) if args.prices else None
    now = parse_time("now", "now")
    end = parse_time(args.end, "--to") if args.end else now
    start = parse_time(args.start or DEFAULT_FROM, "--from", now)
    step = None if args.step is None else parse_seconds(args.step, "--step")
    r = judge_range(prom, t, start, end, step, now)
    if args.list:
        return LIST_RENDERERS[args.output](keep_launches(r.launches, args.namespace, args.team, args.node), r)
    return RENDERERS[args.output](fleet(r, prices, args.namespace, args.team, args.node, args.top))

