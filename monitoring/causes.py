"""The cause rules, from gpu_exporter.verdict.causes.CAUSES: the ``gpu-cause.recording`` group (the run's
level, ``run:gpu_training_cause:share`` per cause at that level, the projections) and the ``gpu-cause.alerts`` group
(a warning and an info alert per cause, reading only those series).

Written as template text (``${key}`` placeholders), so the values come from thresholds.yml like
everywhere else. Each cause's condition, alert reason and projection come from its kind
(gpu_exporter.verdict.causes: ``Cause.promql``, ``alert_reason``, ``alert_projection``), next to the
same logic in Python that gpu_exporter.verdict.causes.find_causes applies.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from gpu_exporter.verdict.causes import CAUSES, COMPUTED, HIDDEN, Cause
from gpu_exporter.verdict.levels import BY_LEVEL, LOW, TARGET
from gpu_exporter.verdict.levels import LEVELS as LEVEL_ROWS
from gpu_exporter.verdict.promql import CAUSE_SHARE, RUN, USEFUL, C, busier, held_low
from gpu_exporter.verdict.remedies import alert_text

from monitoring.model import Alert, Record, indent, wrap

RECORDING = "gpu-cause.recording"
ALERTS = "gpu-cause-{cause}.alerts"
"""The cause alerts' groups, one per cause (its warning and info alert): Prometheus evaluates groups
concurrently, and each stays within its interval on a large fleet (docs/fleet.md)."""
LEVELS = {lv.name: f"{USEFUL}" + (f" >= ${{{below.key}}}" if below else "") + f" < ${{{lv.key}}}"
          for below, lv in zip((None, *LEVEL_ROWS), LEVEL_ROWS, strict=False)}
"""Each level's condition on a run's useful utilization, from the one table of levels (gpu_exporter.verdict.levels)."""
LEVEL_SERIES = m.RUN_USEFUL_UTILIZATION_LEVEL.name
"""The run's level, recorded once per evaluation: each cause rule joins it (``group_left (level)``) instead of
evaluating its condition twice, once per level."""


def records() -> list[Record]:
    """The ``gpu-cause.recording`` group: the run's level (one rule per level), one share rule per cause that
    takes its level from it, then the projections."""
    rules = [Record(RECORDING, LEVEL_SERIES, f"0 * ({condition}) + 1", (("level", lvl),),
                    f"Level {lvl}: the live runs whose useful utilization is in its band (value 1)." if i == 0 else "")
             for i, (lvl, condition) in enumerate(LEVELS.items())]
    for cause in CAUSES:
        expr = f"(\n{indent(cause.promql(), 2)}\n)\n* on {RUN} group_left (level)\n{LEVEL_SERIES}\n"
        rules.append(Record(
            RECORDING, CAUSE_SHARE, expr, (("cause", cause.cause), ("code", cause.code), ("remedy", cause.remedy)),
            f"{cause.label}, at the run's level: value = {cause.value_text()}."))
    phase_causes = "|".join(c.cause for c in CAUSES if c.projected_by == HIDDEN)
    launch_causes = "|".join(c.cause for c in CAUSES if c.projected_by == COMPUTED)
    rules.append(Record(
        RECORDING, m.RUN_TRAINING_CAUSE_PROJECTED_UTILIZATION.name,
        f"clamp_max(\n    (\n        {USEFUL}\n      / on {RUN} group_right ()\n"
        f'        (1 - {CAUSE_SHARE}{{cause=~"{phase_causes}"}})\n    )\n  or\n'
        f"    (\n        {USEFUL}\n      + on {RUN} group_right ()\n"
        f'        {CAUSE_SHARE}{{cause=~"{launch_causes}"}}\n    ),\n  1\n)\n',
        comment="The utilization the GPU could reach without the cause (an upper bound), from its useful utilization\n"
                f"u ({USEFUL}). Hiding a phase of share s leaves the GPU work and shortens the\n"
                "step to 1 - s: u / (1 - s). A launch-bound GPU busy through its whole compute phase reaches the\n"
                "compute share: u + share."))
    return rules + [Record(RECORDING, name, expr, comment=doc) for c in CAUSES for name, expr, doc in c.records()]


WHERE = ("Training run {{ $labels.run }} rank {{ $labels.rank }} on GPU {{ $labels.gpu }} ({{ $labels.uuid }}), "
         "node {{ $labels.node }}{{ with $labels.pod }}, pod {{ $labels.namespace }}/{{ . }}{{ end }}")
_RUN_SEL = (f"{{{C}=%q,run=%q,rank=%q,uuid=%q}}", f"$labels.{C} $labels.run $labels.rank $labels.uuid")
"""A selector of this alert's run (rank) on its GPU for the queries of the text, with its printf arguments."""
UTIL_NOW = (f'{{{{ with printf "{USEFUL}{_RUN_SEL[0]}" {_RUN_SEL[1]} | query }}}}'
            "{{ . | first | value | humanizePercentage }}{{ end }}"
            f"{busier(USEFUL, _RUN_SEL)} useful ({{{{ . | first | value | humanizePercentage }}}} busy, "
            f'{{{{ with printf "1 - {USEFUL}{_RUN_SEL[0]}" {_RUN_SEL[1]} | query }}}}'
            "{{ . | first | value | humanizePercentage }}{{ end }} of the step in collectives){{ end }}")
"""The run's useful utilization now, as :func:`gpu_exporter.verdict.levels.useful_text` writes it: ``8%``, or
``35% useful (95% busy, 65% of the step in collectives)`` when its collectives hide part of the GPU's busy time."""
HELD_LOW_RUN = held_low(USEFUL, RUN)
"""The run's useful utilization (its causes' level) was low within ``alert_hold`` (verdict.promql.held_low)."""


def _alert(name: str, cause: Cause, lvl: str, summary: str, gap: str) -> Alert:
    # the cause's latest share (M4: events) in the last alert_hold, at either level
    held = f'max without (level) (last_over_time({CAUSE_SHARE}{{cause="{cause.cause}"}}[${{alert_hold}}]))'
    expr = (f"(\n    {held}\n  {'and' if lvl == LOW else 'unless'} on {RUN}\n    {HELD_LOW_RUN}\n)\n"
            f"* on ({C}, uuid) group_left (gpu, namespace, pod, container) {m.GPU_WORKLOAD_INFO.name}\n")
    description = (f"{WHERE} {cause.alert_reason()} The GPU is at {UTIL_NOW} ({gap}).{cause.alert_projection()} "
                   f"{alert_text(cause.cause)}{cause.advice}")
    labels = (("severity", BY_LEVEL[lvl].severity), ("level", lvl),
              *((("cause", cause.cause),) if lvl == TARGET else ()))
    return Alert(ALERTS.format(cause=cause.cause), name, expr, "cause_for", labels, summary, wrap(description))


def alerts() -> list[Alert]:
    """The ``gpu-cause.alerts`` group: a warning alert per cause (level low), an info alert per cause (target)."""
    return ([_alert(cause.alert, cause, LOW, "A training job's GPU is below ${utilization_low_threshold|percent}, "
                    f"cause {cause.label}.", "the alert threshold is ${utilization_low_threshold|percent}")
             for cause in CAUSES]
            + [_alert("GpuTrainingBelowTarget", cause, TARGET, "A training job's GPU is below the "
                      "${utilization_target|percent} target and the cause is known.",
                      "the target is ${utilization_target|percent}") for cause in CAUSES])
