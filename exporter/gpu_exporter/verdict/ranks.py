"""The ranks of a distributed training run, side by side, for the verdict, ``diagnose`` and the status page.

The problem: diagnose judges one GPU at a time, but in a distributed run one rank's cause shows on
the other ranks' GPUs (they wait for it in collectives). This module gives diagnose the run-level
view: the ``communication`` share of each live rank of a run (what the straggler cause ST and the
communication-bound cause CM of :mod:`gpu_exporter.verdict.causes` compare), the straggler's own
cause in words for the waiting ranks' verdicts, and a table of the run's ranks (rank, node, GPU,
phases, verdict) with the run's step time and the step time if the straggler kept up. A run is its
cluster and name: in a fleet read with a ``cluster_label`` two clusters' runs of one name stay apart,
as the rules keep them. Example::

    comm = communication_by_run(runs)               # {("", "ddp"): {"0": 0.71, "1": 0.02}}
    views = name_straggler_causes(views)            # fills Finding.straggler_cause
    for run in distributed_runs(judged_views): ...  # judged_views: (GpuView, Verdict) pairs
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_exporter.training.protocol import COMMUNICATION
from gpu_exporter.verdict.causes import cause_order
from gpu_exporter.verdict.format import pct, seconds
from gpu_exporter.verdict.kinds import Finding
from gpu_exporter.verdict.views import evolve

if TYPE_CHECKING:
    from gpu_exporter.verdict.views import GpuView, RunView, Verdict


def communication_by_run(runs: Iterable[tuple[str, RunView]]) -> dict[tuple[str, str], dict[str, float]]:
    """(cluster, run) -> {rank: communication share} over the live ranks that report the phase, from (cluster,
    run view) pairs.

    >>> from gpu_exporter.verdict.views import RunView
    >>> def view(rank, share):
    ...     return RunView("ddp", rank, {"communication": share}, 10.0, False, None, 0.0, 0.0)
    >>> communication_by_run([("", view("0", 0.7)), ("", view("1", 0.02)), ("eu", view("0", 0.1))])
    {('', 'ddp'): {'0': 0.7, '1': 0.02}, ('eu', 'ddp'): {'0': 0.1}}
    """
    out: dict[tuple[str, str], dict[str, float]] = {}
    for cluster, r in runs:
        if r.live and COMMUNICATION in r.shares:
            out.setdefault((cluster, r.run), {})[r.rank] = r.shares[COMMUNICATION]
    return out


def own_cause(rank: str, finding: Finding | None, utilization: float | None) -> str:
    """What holds the straggler ``rank`` back, in the words of the waiting ranks' verdict.

    >>> own_cause("3", None, 0.96)
    'rank 3 has no cause of its own above the thresholds (its GPU at 96%: more work, or a slower or throttled GPU)'
    """
    if finding is None:
        gpu = f"its GPU at {pct(utilization)}: " if utilization is not None else ""
        return (f"rank {rank} has no cause of its own above the thresholds ({gpu}more work, or a slower or "
                "throttled GPU)")
    return f"rank {rank} is {finding.cause.label}, {finding.cause.own(finding.value)}"


def name_straggler_causes(views: Sequence[GpuView]) -> list[GpuView]:
    """``views`` with each ST finding's ``straggler_cause`` filled from the straggler rank's own findings."""
    by_rank: dict[tuple[str, str, str], tuple[RunView, float | None]] = {
        (v.cluster, r.run, r.rank): (r, v.utilization) for v in views for r in v.runs if r.live}

    def named(f: Finding, cluster: str, run: str) -> Finding:
        if not f.cause.waits:
            return f
        straggler, util = by_rank.get((cluster, run, f.straggler), (None, None))
        if straggler is None:  # its snapshots carry no GPU UUID: its own cause is not judged here
            return evolve(f, straggler_cause=f"rank {f.straggler}'s own cause is unknown here (it reports from no "
                                              "GPU read here)")
        # Its own cause: not what every rank pays (CM) nor a wait (ST), the same as the alert's text.
        own = sorted((g for g in straggler.findings if not g.cause.run_wide), key=cause_order)
        return evolve(f, straggler_cause=own_cause(f.straggler, own[0] if own else None, util))

    def renamed(v: GpuView) -> GpuView:
        if not any(f.cause.waits for r in v.runs for f in r.findings):
            return v
        return evolve(v, runs=tuple(evolve(r, findings=tuple(named(f, v.cluster, r.run) for f in r.findings))
                                     for r in v.runs))

    return [renamed(v) for v in views]


@dataclass(frozen=True)
class RankRow:
    """One rank of a distributed run: where it runs, where its time goes, its GPU's verdict."""

    rank: str
    node: str
    gpu: str
    uuid: str
    shares: Mapping[str, float]
    step_seconds: float | None
    verdict: str


@dataclass(frozen=True)
class DistributedRun:
    """A run with two or more ranks among the GPUs shown: its ranks and its straggler, if any."""

    run: str
    world_size: int
    ranks: tuple[RankRow, ...]
    straggler: str
    straggler_finding: Finding | None
    cluster: str = ""
    """Its GPUs' ``cluster_label`` value in a fleet read from Prometheus ("" for one node)."""

    @property
    def step_seconds(self) -> float | None:
        """The run's step time now: the slowest rank's mean step time."""
        steps = [r.step_seconds for r in self.ranks if r.step_seconds is not None]
        return max(steps) if steps else None


def distributed_runs(results: Sequence[tuple[GpuView, Verdict]]) -> list[DistributedRun]:
    """The runs of ``results`` with two or more live ranks (or a world size above 1), rank by rank."""
    rows: dict[tuple[str, str], list[RankRow]] = {}
    sizes: dict[tuple[str, str], int] = {}
    waits: dict[tuple[str, str], list[Finding]] = {}
    for view, verdict in results:
        for r in view.runs:
            if not r.live:
                continue
            key = (view.cluster, r.run)
            rows.setdefault(key, []).append(RankRow(r.rank, view.node, view.gpu, view.uuid, r.shares,
                                                    r.step_seconds, verdict.title))
            sizes[key] = max(sizes.get(key, 1), r.world_size)
            waits.setdefault(key, []).extend(f for f in r.findings if f.cause.waits)
    out = []
    for (cluster, run), ranks in sorted(rows.items(), key=lambda item: (item[0][1], item[0][0])):
        if len(ranks) < 2 and sizes[cluster, run] < 2:
            continue
        first = max(waits[cluster, run], key=lambda f: f.value, default=None)
        out.append(DistributedRun(run, max(sizes[cluster, run], len(ranks)),
                                  tuple(sorted(ranks, key=lambda r: (len(r.rank), r.rank))),
                                  first.straggler if first else "", first, cluster))
    return out


def _phases(shares: Mapping[str, float]) -> str:
    return ", ".join(f"{p} {pct(s)}" for p, s in sorted(shares.items(), key=lambda ps: -ps[1]) if s >= 0.005)


def render_text(runs: Sequence[DistributedRun]) -> str:
    """The runs' ranks side by side, for diagnose's text report."""
    out = []
    for d in runs:
        missing = (" (the others report elsewhere, e.g. to other nodes' exporters: diagnose --prometheus-url "
                   "sees the whole run)" if len(d.ranks) < d.world_size else "")
        where = f" in cluster {d.cluster}" if d.cluster else ""
        out.append(f"Run {d.run}{where}: {len(d.ranks)} of {d.world_size} ranks reporting{missing}\n")
        for r in d.ranks:
            step = f", step {seconds(r.step_seconds)}" if r.step_seconds is not None else ""
            mark = "  <- straggler" if r.rank == d.straggler else ""
            out.append(f"  rank {r.rank:<4} GPU {r.gpu} ({r.uuid}){f' on {r.node}' if r.node else ''}: "
                       f"{_phases(r.shares) or 'no phase time yet'}{step}; {r.verdict}{mark}\n")
        f = d.straggler_finding
        if f is not None:
            projected = f.projected_step_seconds
            step = (f" The run's step takes {seconds(f.step_seconds)}; ~{seconds(projected)} if rank {d.straggler} "
                    "kept up." if f.step_seconds is not None and projected is not None else "")
            cause = f.straggler_cause or "no cause of its own found"
            out.append(f"  straggler    rank {d.straggler}: {cause}.{step}\n")
        else:
            out.append("  straggler    none: no rank waits for another beyond the straggler threshold.\n")
        out.append("\n")
    return "".join(out)


def to_doc(runs: Sequence[DistributedRun]) -> list[dict[str, Any]]:
    """The runs' ranks for diagnose's JSON and the status page."""
    docs = []
    for d in runs:
        f = d.straggler_finding
        docs.append({
            "run": d.run, "cluster": d.cluster, "world_size": d.world_size, "ranks_reporting": len(d.ranks),
            "ranks": [{"rank": r.rank, "node": r.node, "gpu": r.gpu, "uuid": r.uuid,
                       "shares": dict(r.shares), "step_seconds": r.step_seconds, "verdict": r.verdict}
                      for r in d.ranks],
            "straggler": d.straggler or None,
            "straggler_cause": f.straggler_cause if f else None,
            "step_seconds": f.step_seconds if f else d.step_seconds,
            "projected_step_seconds": f.projected_step_seconds if f else None,
        })
    return docs
