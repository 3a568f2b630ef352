"""The causes of a distributed run, straggler (ST) and communication-bound (CM), in PromQL and alert text,
for the cause rules of monitoring/causes.py.

The problem: the other causes are judged per rank, from that rank's own phases. A straggler is a
relation between the ranks of one run: a rank waits in collectives (phase ``communication``)
for the rank that communicates least, the straggler. The condition therefore compares each
rank's communication share with the lowest one of its run (``bottomk by (cluster, run)``), adds the
straggler's rank as the label ``straggler_rank``, and the alert text names the straggler's own
cause by reading the straggler's ``run:gpu_training_cause:share`` series. The Python judge
(gpu_exporter.verdict.causes.find_causes) applies the same rule; tests/test_causes_conformance.py checks
that the two agree.

Communication-bound (CM) is the other half of the same comparison: the run's lowest live
communication share (``min by (cluster, run)``) is what every rank pays, and a rank's series of CM
carries it. A waiting rank's communication is thus split once: the common part (CM) and its excess
over it (ST), never the same time twice.

The pieces read the shared fragments (cluster label placeholder, the live-run filter, the phase share
expression) from gpu_exporter/verdict/promql.py.
"""

from __future__ import annotations

from gpu_exporter import catalog
from gpu_exporter.verdict.causes import ALLOCATOR, CAUSES, LAUNCH, RUN_WIDE, Cause
from gpu_exporter.verdict.promql import CAUSE_SHARE, LIVE, C, projected_query, run_query, share

from monitoring.model import Record

LABEL = "straggler_rank"
"""The label of a waiting rank's ST series that names the rank it waits for."""
STEP = catalog.RUN_TRAINING_STEP_SECONDS_AVG5M.name
"""Each rank's mean step time (recorded in prometheus/templates/gpu-recording.rules.yml.in)."""
PROJECTED_STEP = catalog.RUN_TRAINING_STRAGGLER_PROJECTED_STEP_SECONDS.name
"""The run's step time if the straggler kept up, per waiting rank."""


def condition(cause: Cause) -> str:
    """A waiting rank: its communication share minus the run's lowest, above ``straggler_wait_share``."""
    comm = share(cause.phase)
    lowest = (f"label_replace(\n      bottomk by ({C}, run) (1, {comm} and {LIVE}),\n"
              f'      "{LABEL}", "$1", "rank", "(.*)"\n    )')
    return (f"(\n    {comm}\n  - on ({C}, run) group_left ({LABEL})\n    {lowest}\n)\n"
            f"> ${{{cause.keys[0]}}}\nand ignoring ({LABEL})\n{LIVE}")


def common_condition(cause: Cause) -> str:
    """Every live rank of a run: the run's lowest live communication share, above ``communication_bound_share``."""
    comm = share(cause.phase)
    return (f"(\n    0 * {comm}\n  + on ({C}, run) group_left ()\n    min by ({C}, run) ({comm} and {LIVE})\n)\n"
            f"> ${{{cause.keys[0]}}}\nand\n{LIVE}")


def common_what(cause: Cause) -> str:
    """The alert text of CM: the share every rank pays, and why it is no straggler."""
    return ("spends {{ $value | humanizePercentage }} of its time in collectives (phase communication) that "
            "every live rank of the run pays (the run's least-communicating rank spends as much, so no straggler "
            "explains it): the gradient exchange itself is slow.")


def projected_step_rule(cause: Cause, group: str) -> Record:
    """The recording rule of the run's step time if the straggler kept up: step time x (1 - wait)."""
    return Record(group, PROJECTED_STEP,
                  f"{STEP}\n* on ({C}, run, rank, uuid) group_right ()\n"
                  f"(1 - max by ({C}, run, rank, uuid, {LABEL}) "
                  f'({CAUSE_SHARE}{{cause="{cause.cause}"}}))\n',
                  comment=f"The run's step time if rank {LABEL} kept up: the waiting rank's step time without its "
                          "wait.")


def _said(cause: Cause) -> str:
    """How the straggler's own cause reads, with its value (``$v``) as Go template text."""
    if cause.kind == ALLOCATOR:
        return f"{cause.label}, {{{{ $v | humanize }}}} allocator retries and OOMs"
    if cause.kind == LAUNCH:
        return f"{cause.label}, its GPU idle for {{{{ $v | humanizePercentage }}}} of the step inside compute"
    return f"{cause.label}, {{{{ $v | humanizePercentage }}}} of its time in {cause.phase}"


def what(cause: Cause) -> str:
    """The alert text: which rank this one waits for, how much, and the straggler's own cause."""
    run_wide = "|".join(c.cause for c in CAUSES if c.kind in RUN_WIDE)  # not the straggler's own cause
    query = (f'printf "topk(1, max without (level) ({CAUSE_SHARE}{{run=%q,rank=%q,'
             f'cause!~\\"{run_wide}\\"}}))" $labels.run $labels.{LABEL}')
    chain = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq $c "{other.cause}" }}}}{_said(other)}'
                    for i, other in enumerate(c for c in CAUSES if c.kind not in RUN_WIDE))
    return (f"is waiting for rank {{{{ $labels.{LABEL} }}}} (straggler): {{{{ with {query} | query }}}}"
            f'{{{{ $c := . | first | label "cause" }}}}{{{{ $v := . | first | value }}}}'
            f"rank {{{{ $labels.{LABEL} }}}} is {chain}{{{{ else }}}}{{{{ $c }}}}{{{{ end }}}}"
            f"{{{{ else }}}}rank {{{{ $labels.{LABEL} }}}} has no cause of its own above the thresholds (more work, "
            f"or a slower or throttled GPU){{{{ end }}}}. {{{{ $value | humanizePercentage }}}} of this rank's time is "
            f"that wait (its communication beyond rank {{{{ $labels.{LABEL} }}}}'s).")


def projection(cause: Cause) -> str:
    """The alert text of the projections: the GPU's utilization and the run's step time if the straggler kept up."""
    util, step, projected = projected_query(cause.cause), run_query(STEP), run_query(PROJECTED_STEP)
    return (f"{{{{ with {util} | query }}}} If rank {{{{ $labels.{LABEL} }}}} kept up, the GPU could reach at most "
            f"{{{{ . | first | value | humanizePercentage }}}}{{{{ end }}}}{{{{ with {projected} | query }}}} and the "
            f"run's step would take ~{{{{ . | first | value | humanizeDuration }}}}{{{{ end }}}}"
            f"{{{{ with {step} | query }}}} instead of {{{{ . | first | value | humanizeDuration }}}}{{{{ end }}}}.")
