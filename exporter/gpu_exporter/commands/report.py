"""``gpu-exporter report``: what one training run cost and why, read from Prometheus after the fact.

The owner of last night's eight-hour run asks the next morning what it cost and why it was slow. This command
reads one run (every rank and GPU) over its lifetime or ``--from``/``--to``: wall time (its own phase timers),
GPU-hours, mean utilization, phase shares; every point of the range judged as ``diagnose --prometheus-url --run
RUN --window W --at T`` judges it (W: ``WINDOW_STEPS`` steps; :class:`gpu_exporter.verdict.timeline.Timeline`
over :func:`~gpu_exporter.commands.report_sources.readings_over`), so it says every verdict of the ladder on the
same GPU keys (cluster and uuid), and when each cause applied to a live rank; GPU-hours below target (per GPU: the
share of its points judged below target, times the wall time); the wall time without the main cause
(:func:`~gpu_exporter.verdict.timeline.projection_share`, docs/cli.md); and how much of the GPUs' idle time in
compute and between the phases FO, HW and M3 explained (:func:`~gpu_exporter.verdict.timeline.idle_over`). As
text, Markdown, JSON or a self-contained HTML page (:mod:`~gpu_exporter.commands.report_render`). Example::

    $ gpu-exporter report --prometheus-url http://prometheus:9090 --run resnet50 --from=-8h --to=-2h

Exit status: 0 report written, 2 bad input, an unreachable Prometheus or a run it does not hold.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from gpu_exporter.commands import fleet
from gpu_exporter.commands import report_sources as sources
from gpu_exporter.commands.client_cli import (
    add_client_arguments,
    connection,
    fail,
    iso,
    parse_seconds,
    parse_time,
    without_gc,
)
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.client_prometheus import Prometheus
from gpu_exporter.commands.report_render import RENDERERS, CauseSpan, Report, write
from gpu_exporter.thresholds import Thresholds, ThresholdsError, load_thresholds, parse_duration
from gpu_exporter.verdict.causes import BY_ID
from gpu_exporter.verdict.efficiency import EFFICIENCY_BY_ID
from gpu_exporter.verdict.hints import HINTS_BY_ID
from gpu_exporter.verdict.ladder import VERDICT_TITLES
from gpu_exporter.verdict.timeline import Span, Timeline, effective, idle_over, projection_share


def _verdict_span(verdict: str, hint: str, span: Span, step: float) -> CauseSpan:
    """A verdict's span: its code is its cause's, or for "not instrumented" with /proc evidence its hint's, whose
    label its title names."""
    named = HINTS_BY_ID.get(hint) or BY_ID.get(verdict) or EFFICIENCY_BY_ID.get(verdict)
    title = VERDICT_TITLES.get(verdict, verdict) + (f": {HINTS_BY_ID[hint].label}" if hint else "")
    remedy = EFFICIENCY_BY_ID[verdict].remedy if verdict in EFFICIENCY_BY_ID else ""
    return CauseSpan(verdict, named.code if named else "", title, span.seconds(step), span.intervals(step), remedy,
                     sorted(span.where))


def build(prom: Prometheus, run: str, t: Thresholds, start: float, end: float, step: float | None,
          lookback: str, final: sources.Totals | None = None, launch: sources.Launch | None = None) -> Report:
    """Read ``run`` (only ``launch``, when given) from ``start`` to ``end``: every figure of the report."""
    if end <= start:
        raise MetricsError(f"the range is empty: --from {iso(start)} is not before --to {iso(end)}")
    deltas = sources.deltas(prom, run, start, end, lookback, final, launch, cluster_label=t.cluster_label)
    if not deltas:
        raise MetricsError(f"Prometheus at {prom.base} has no phase timers of run {run!r} between {iso(start)} "
                           f"and {iso(end)}")
    walls = {key: sum(phases.values()) for key, phases in deltas.items()}
    wall = max(walls.values())
    if wall <= 0:
        raise MetricsError(f"run {run!r} did not run between {iso(start)} and {iso(end)}")
    gpus = sorted({gpu for _, gpu in deltas if gpu})
    names = [str(gpu) for gpu in gpus]
    totals: Counter[str] = Counter()
    for phases in deltas.values():
        totals.update(phases)
    all_seconds = sum(totals.values())
    shares = {p: v / all_seconds for p, v in sorted(totals.items(), key=lambda kv: -kv[1])}

    util = sources.utilization(prom, gpus, start, end, cluster_label=t.cluster_label) if gpus else {}
    mean_util = sum(util.values()) / len(util) if util else None

    step = step or max(sources.MIN_STEP, (end - start) / sources.POINTS)
    window = sources.WINDOW_STEPS * step
    grid = [start + k * step for k in range(int((end - start) / step + 1e-9) + 1)]
    points = sources.readings_over(prom, grid, step, window, t.cluster_label, gpus) if gpus else ()
    timeline = Timeline.judge(points, t, window, run, launch.run_id.split(",") if launch else ())
    times = timeline.times()
    moments = {gpu: series for gpu, series in timeline.series(times).items() if gpu in names}
    # Each GPU's hours below target: the share of its judged points whose verdict is below target, times the wall.
    below = 0.0
    for series in moments.values():
        judged = [m for m in series if m is not None and m.view.utilization is not None]
        below += wall * sum(m.verdict.below_target for m in judged) / len(judged) if judged else 0.0
    causes = sorted((CauseSpan(c, BY_ID[c].code, BY_ID[c].label, s.seconds(step), s.intervals(step), BY_ID[c].remedy,
                               sorted(s.where, key=lambda rank: (len(rank), rank)))
                     for c, s in timeline.causes().items()),
                    key=lambda c: (-c.seconds, -shares.get(BY_ID[c.cause].phase, 0.0)))
    verdicts = sorted((_verdict_span(v, hint, s, step) for (v, hint), s in timeline.verdicts().items()),
                      key=lambda v: -v.seconds)
    main = causes[0].cause if causes else None
    ranks = [{"rank": rank, "uuid": str(gpu), "wall_seconds": round(walls[(rank, gpu)], 3),
              "utilization": None if gpu not in util else round(util[gpu], 4),
              "shares": {p: round(v / walls[(rank, gpu)], 4) for p, v in sorted(phases.items(), key=lambda kv: -kv[1])
                         if walls[(rank, gpu)] > 0}}
             for (rank, gpu), phases in sorted(deltas.items())]
    share = projection_share(causes[0].cause, causes[0].ranks, deltas, mean_util) if causes else None
    return Report(run=run, source=prom.base, start=start, end=end, wall_seconds=wall, gpus=names, ranks=ranks,
                  mean_utilization=mean_util, shares=shares, gpu_hours=wall * max(len(gpus), 1) / 3600,
                  gpu_hours_below_target=below / 3600, causes=causes, main_cause=main,
                  projected_wall_seconds=None if share is None else wall * (1 - share), projection_share=share,
                  step=step, times=times,
                  utilization={gpu: [m.view.utilization if m else None for m in ms] for gpu, ms in moments.items()},
                  phase_series=timeline.phase_shares(times), target=t.utilization_target,
                  low=t.utilization_low_threshold, run_id="" if launch is None else launch.run_id,
                  tags=dict(launch.tags) if launch else {}, verdicts=verdicts,
                  verdict_series={gpu: [m.verdict.name if m else None for m in ms] for gpu, ms in moments.items()},
                  effective=effective(moments, wall),
                  sm_activity={gpu: [m.view.sm_active if m else None for m in ms] for gpu, ms in moments.items()},
                  idle=idle_over(moments, step))


# --- command line ------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: 0 report written, 2 an error (bad flag, unreachable Prometheus, unknown run)"
    parser.add_argument("--prometheus-url", metavar="URL", required=True, help="the Prometheus that scraped the run")
    parser.add_argument("--run", dest="run_name", metavar="RUN",
                        help="the training run by name (its run label): its latest launch, with a note on stderr when "
                             "the name was used by several launches")
    parser.add_argument("--run-id", dest="run_id", metavar="ID",
                        help="the training run by the run id of one launch (its run_id label)")
    parser.add_argument("--from", dest="start", metavar="TIME",
                        help="start of the range (default: the run's start): --from=-8h, Unix seconds or ISO 8601")
    parser.add_argument("--to", dest="end", metavar="TIME", help="end of the range (default: the run's last push)")
    parser.add_argument("--step", metavar="DURATION",
                        help=f"time between points of the series (default: the range / {sources.POINTS}, at least "
                             f"{sources.MIN_STEP:g}s); each point's rate window is {sources.WINDOW_STEPS} steps")
    parser.add_argument("--lookback", metavar="DURATION", default="30d",
                        help="how far back to look for the run (default 30d; a PromQL range: 2w, 36h)")
    parser.add_argument("--thresholds", metavar="FILE", help="thresholds YAML (default: the packaged copy)")
    parser.add_argument("--output", choices=tuple(RENDERERS), default="text", help="the format (default text)")
    parser.add_argument("--out", metavar="FILE", help="write the report to FILE instead of standard output")
    fleet.add_arguments(parser)
    add_client_arguments(parser, "--prometheus-url")


def run(args: argparse.Namespace) -> int:
    try:
        t = load_thresholds(args.thresholds)
        prom = Prometheus(args.prometheus_url, connection=connection(args, args.prometheus_url, "--prometheus-url"))
        now = parse_time("now", "now")
        if getattr(args, "list", False) or getattr(args, "fleet", False):
            return write(fleet.range_text(args, prom, t), args.out)
        step = None if args.step is None else parse_seconds(args.step, "--step")
        try:
            parse_duration(args.lookback)
        except ValueError as err:
            raise MetricsError(f"--lookback: {err}") from None
        end = parse_time(args.end, "--to") if args.end else None
        start = parse_time(args.start, "--from") if args.start else None
        final = None
        if args.run_name is None and args.run_id is None:
            raise MetricsError("name the run: --run NAME (its latest launch) or --run-id ID (one launch); "
                              "--list lists the runs of a range, --fleet reports on all GPUs")
        launch, note = sources.pick_launch(prom, end if end is not None else now, args.lookback, args.run_name,
                                           args.run_id, cluster_label=t.cluster_label)
        if note is not None:
            sys.stderr.write(f"gpu-exporter: {note}\n")
        if launch is not None:  # the launch's own range; --from/--to narrow it
            launch, totals = sources.launch_range(prom, launch, now)
            final = totals if end is None or end >= launch.end else None
            start = launch.start if start is None else max(start, launch.start)
            end = launch.end if end is None else min(end, launch.end)
        elif start is None or end is None:
            run_start, run_end, totals = sources.lifetime(prom, args.run_name, end if end is not None else now,
                                                          args.lookback, cluster_label=t.cluster_label)
            final = totals if end is None else None
            start = run_start if start is None else start
            end = run_end if end is None else end
        report = build(prom, launch.run if launch else args.run_name, t, start, end, step, args.lookback, final, launch)
    except (MetricsError, ThresholdsError) as err:
        return fail(str(err))
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    return write(RENDERERS[args.output](report), args.out)


def register(subcommands: dict[str, Any]) -> None:
    subcommands["report"] = ("what one training run cost and why, from Prometheus (text, Markdown, JSON, HTML)",
                             add_arguments, without_gc(run))

