"""The cause rules, from gpu_exporter.verdict.causes.CAUSES: the run's level (in ``gpu-utilization.recording``),
a ``gpu-cause-<cause>.recording`` group per cause (``run:gpu_training_cause:share`` at the run's level, its projections)
and a ``gpu-cause-<cause>.alerts`` group per cause (a warning and an info alert, reading only those series).

Written as template text (``${key}`` placeholders), so the values come from thresholds.yml like
everywhere else. Each cause's condition, alert reason and projection come from its kind
(gpu_exporter.verdict.kinds: ``Cause.promql``, ``alert_reason``, ``alert_projection``, ``alert_remedy``), next to the
same logic in Python that gpu_exporter.verdict.causes.find_causes applies.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.alerts import TRAINING_BELOW_TARGET
from gpu_exporter.verdict.causes import CAUSES
from gpu_exporter.verdict.kinds import COMPUTED, HIDDEN, Cause
from gpu_exporter.verdict.levels import BY_LEVEL, LOW, TARGET
from gpu_exporter.verdict.levels import LEVELS as LEVEL_ROWS
from gpu_exporter.verdict.promql import CAUSE_SHARE, RUN, RUN_SEL, USEFUL, C, busier, cause_share, held_low

from monitoring.model import Alert, Record, indent, wrap

LEVELS_GROUP = "gpu-utilization.recording"
"""The levels sit right after the useful utilization they read (the rules of a group run in order)."""
RECORDING = "gpu-cause-{cause}.recording"
ALERTS = "gpu-cause-{cause}.alerts"
"""One recording and one alert group per cause (its share and projection; its warning and info alert):
Prometheus and vmalert evaluate groups concurrently, and each stays within its interval on a large fleet
(docs/fleet.md)."""
LEVELS = {lv.name: f"{USEFUL}" + (f" >= ${{{below.key}}}" if below else "") + f" < ${{{lv.key}}}"
          for below, lv in zip((None, *LEVEL_ROWS), LEVEL_ROWS, strict=False)}
"""Each level's condition on a run's useful utilization, from the one table of levels (gpu_exporter.verdict.levels)."""
LEVEL_SERIES = m.RUN_USEFUL_UTILIZATION_LEVEL.name
"""The run's level, recorded once per evaluation: each cause rule joins it (``group_left (level)``) instead of
evaluating its condition twice, once per level. It exists only for live runs (the useful utilization does), so
the join also keeps a cause to the runs that report a current phase."""
PROJECTION = {HIDDEN: ("/", "(1 - {})", "u / (1 - s): hiding a phase of share s leaves the GPU work and shortens the "
                                        "step to 1 - s"),
              COMPUTED: ("+", "{}", "u + s: a launch-bound GPU busy through its whole compute phase reaches the "
                                    "compute share s")}
"""How a kind's projection (``Cause.projected_by``) combines the run's useful utilization u with the cause's share."""


def projection(cause: Cause) -> Record:
    """The utilization the GPU could reach without ``cause``, an upper bound (in the cause's group)."""
    op, share, why = PROJECTION[cause.projected_by]
    joined = share.format(cause_share(cause.cause))
    return Record(RECORDING.format(cause=cause.cause), m.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name,
                  f"clamp_max(\n    {USEFUL}\n  {op} on {RUN} group_right ()\n    {joined},\n  1\n)\n",
                  (("cause", cause.cause),),  # the share's own; written, so no two groups record one rule
                  comment=wrap(f"The utilization the GPU could reach without the cause (an upper bound), from its "
                               f"useful utilization u ({USEFUL}): {why}."))


def records() -> list[Record]:
    """The run's level (one rule, in ``gpu-utilization.recording``), then a group per cause: its share
    rule, which takes its level from the level series, and its projections."""
    levels = "\nor\n".join(f'label_replace(0 * ({condition}) + 1, "level", "{lvl}", "", "")'
                            for lvl, condition in LEVELS.items())
    rules = [Record(LEVELS_GROUP, LEVEL_SERIES, f"{levels}\n", comment=wrap(
        "The run's level: 1 for a live run whose useful utilization is in the level's band, labelled with it. "
        "One rule, so a run changes level in one write: a cause rule (its own group) never joins two levels or "
        "none."))]
    for cause in CAUSES:
        group = RECORDING.format(cause=cause.cause)
        expr = f"(\n{indent(cause.promql(), 2)}\n)\n* on {RUN} group_left (level)\n{LEVEL_SERIES}\n"
        rules.append(Record(
            group, CAUSE_SHARE, expr, (("cause", cause.cause), ("code", cause.code), ("remedy", cause.remedy)),
            f"{cause.label}, at the run's level: value = {cause.value_text()}."))
        rules += [projection(cause)] if cause.projected_by else []
        rules += [Record(group, name, expr, comment=doc) for name, expr, doc in cause.records()]
    return rules


WHERE = ("Training run {{ $labels.run }} rank {{ $labels.rank }} on GPU {{ $labels.gpu }} ({{ $labels.uuid }}), "
         "node {{ $labels.node }}{{ with $labels.pod }}, pod {{ $labels.namespace }}/{{ . }}{{ end }}")
UTIL_NOW = (f'{{{{ with printf "{USEFUL}{RUN_SEL[0]}" {RUN_SEL[1]} | query }}}}'
            "{{ . | first | value | humanizePercentage }}{{ end }}"
            f"{busier(USEFUL, RUN_SEL)} useful ({{{{ . | first | value | humanizePercentage }}}} busy, "
            f'{{{{ with printf "1 - {USEFUL}{RUN_SEL[0]}" {RUN_SEL[1]} | query }}}}'
            "{{ . | first | value | humanizePercentage }}{{ end }} of the step in collectives){{ end }}")
"""The run's useful utilization now, as :func:`gpu_exporter.verdict.levels.useful_text` writes it: ``8%``, or
``35% useful (95% busy, 65% of the step in collectives)`` when its collectives hide part of the GPU's busy time."""
HELD_LOW_RUN = held_low(USEFUL, RUN)
"""The run's useful utilization (its causes' level) was low within ``alert_hold`` (verdict.promql.held_low)."""


def _alert(name: str, cause: Cause, lvl: str, summary: str, gap: str) -> Alert:
    # the cause's latest share (M4: events) in the last alert_hold, at either level
    held = f"max without (level) (last_over_time({cause_share(cause.cause)}[${{alert_hold}}]))"
    expr = (f"(\n    {held}\n  {'and' if lvl == LOW else 'unless'} on {RUN}\n    {HELD_LOW_RUN}\n)\n"
            f"* on ({C}, uuid) group_left (gpu, namespace, pod, container) {m.GPU_WORKLOAD_INFO.name}\n")
    description = (f"{WHERE} {cause.alert_reason(CAUSES)} The GPU is at {UTIL_NOW} ({gap}).{cause.alert_projection()} "
                   f"{cause.alert_remedy()}{cause.advice}")
    labels = (("severity", BY_LEVEL[lvl].severity), ("level", lvl),
              *((("cause", cause.cause),) if lvl == TARGET else ()))
    return Alert(ALERTS.format(cause=cause.cause), name, expr, "cause_for", labels, summary, wrap(description))


def alerts() -> list[Alert]:
    """The ``gpu-cause.alerts`` group: a warning alert per cause (level low), an info alert per cause (target)."""
    return ([_alert(cause.alert, cause, LOW, "A training job's GPU is below ${utilization_low_threshold|percent}, "
                    f"cause {cause.label}.", "the alert threshold is ${utilization_low_threshold|percent}")
             for cause in CAUSES]
            + [_alert(TRAINING_BELOW_TARGET, cause, TARGET, "A training job's GPU is below the "
                      "${utilization_target|percent} target and the cause is known.",
                      "the target is ${utilization_target|percent}") for cause in CAUSES])
