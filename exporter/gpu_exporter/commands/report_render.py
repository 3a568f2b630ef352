"""``gpu-exporter report``'s renderings: one :class:`Report` as text, Markdown, JSON or one self-contained HTML
file with inline SVG plots (nothing is fetched to view it)."""

from __future__ import annotations

import html
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_exporter.commands.client_cli import fail, iso
from gpu_exporter.training.protocol import CHECKPOINT, COMMUNICATION, COMPUTE, DATA, METRICS, OTHER
from gpu_exporter.verdict.causes import BY_ID
from gpu_exporter.verdict.code import IdleSplit
from gpu_exporter.verdict.efficiency import EFFICIENCY_BY_ID, SOURCES, UNKNOWN
from gpu_exporter.verdict.format import pct
from gpu_exporter.verdict.timeline import Effective

PHASE_COLORS = {DATA: "#e4572e", COMPUTE: "#2e86ab", METRICS: "#f3a712", CHECKPOINT: "#8e44ad",
                COMMUNICATION: "#29bf12", OTHER: "#9e9e9e"}

STYLE = ("body{font-family:sans-serif;margin:24px;color:#222;max-width:960px}"
         "table{border-collapse:collapse;margin:8px 0 20px}th,td{border:1px solid #ddd;padding:4px 8px;"
         "text-align:left;font-size:13px}th{background:#f3f3f3}h1{font-size:20px}h2{font-size:16px}")
"""The pages' stylesheet (run and fleet report)."""


@dataclass(frozen=True)
class CauseSpan:
    """A cause of the table over the range: the wall-clock seconds it applied to some rank, when, and to which
    (a verdict of the ladder: to which GPUs, in ``ranks``)."""

    cause: str
    code: str
    title: str
    seconds: float
    intervals: list[tuple[float, float]]
    remedy: str
    ranks: list[str]


@dataclass
class Report:
    """Everything the renderers print; ``to_json`` is its JSON form."""

    run: str
    source: str
    start: float
    end: float
    wall_seconds: float
    gpus: list[str]
    ranks: list[dict[str, Any]]
    mean_utilization: float | None
    shares: dict[str, float]
    gpu_hours: float
    gpu_hours_below_target: float
    causes: list[CauseSpan]
    main_cause: str | None
    projected_wall_seconds: float | None
    projection_share: float | None
    step: float
    times: list[float] = field(default_factory=list)
    utilization: dict[str, list[float | None]] = field(default_factory=dict)
    phase_series: dict[str, list[float | None]] = field(default_factory=dict)
    target: float = 0.85
    low: float = 0.3
    run_id: str = ""
    """The launch reported ("" for a run whose library sent no run id: then the range is all that ``run`` did)."""
    tags: dict[str, str] = field(default_factory=dict)
    verdicts: list[CauseSpan] = field(default_factory=list)
    """Each verdict of the ladder the run's GPUs had (``ranks``: the GPUs), longest first."""
    verdict_series: dict[str, list[str | None]] = field(default_factory=dict)
    """Each GPU's verdict at each of ``times`` (None: the run was not on it)."""
    effective: Effective | None = None
    """Effective utilization (SM activity) beside busy, and the GPU-hours between them (verdict.timeline)."""
    sm_activity: dict[str, list[float | None]] = field(default_factory=dict)
    """Each GPU's SM activity at each of ``times`` (None: unknown)."""
    idle: tuple[IdleSplit, float] | None = None
    """How much of the GPUs' idle time FO, HW and M3 explained, the mean of the points' splits, and the GPU-seconds
    it covers (verdict.timeline.idle_over); None: no point below target with a live run."""

    def idle_text(self) -> str:
        """The split's own line (gpu_exporter.verdict.code.IdleSplit.text) and the GPU time it covers."""
        if self.idle is None:
            return ""
        split, seconds = self.idle
        return f"{split.text()}; the mean over {duration(seconds)} of GPU time below target"

    def effective_text(self) -> str:
        """``"25% SM activity (GPM) beside 96% busy; compute phase 27%"``, or the unknown line."""
        e = self.effective
        if e is None or e.sm is None:
            return UNKNOWN
        source = "/".join(SOURCES.get(s, s) for s in e.sources)
        compute = f"; compute phase {pct(e.compute)} SM activity" if e.compute is not None else ""
        return f"{pct(e.sm)} SM activity ({source}) beside {pct(e.busy or 0.0)} busy{compute}"

    def projection_text(self) -> str:
        """``"8.1 h; down to ~3.4 h if loading overlapped compute (input-bound (M1))"``."""
        wall = duration(self.wall_seconds)
        if self.main_cause is None:
            return f"{wall}; no cause applied"
        cause = BY_ID[self.main_cause]
        if self.projected_wall_seconds is None:
            return f"{wall}; main cause {cause.label}: no projection (it is counted, not timed)"
        return f"{wall}; down to ~{duration(self.projected_wall_seconds)} {cause.hidden} ({cause.label})"

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run, "run_id": self.run_id, "tags": self.tags,
            "source": self.source, "start": iso(self.start), "end": iso(self.end),
            "wall_seconds": round(self.wall_seconds, 3), "gpus": self.gpus, "ranks": self.ranks,
            "gpu_hours": round(self.gpu_hours, 6), "mean_utilization": _round(self.mean_utilization),
            "shares": {p: round(v, 4) for p, v in self.shares.items()},
            "gpu_hours_below_target": round(self.gpu_hours_below_target, 6),
            "utilization_target": self.target,
            "causes": [{"cause": c.cause, **_span(c), "ranks": c.ranks, "remedy": c.remedy} for c in self.causes],
            "main_cause": self.main_cause, "projection_share": _round(self.projection_share),
            "projected_wall_seconds": _round(self.projected_wall_seconds),
            "projection": self.projection_text(), "step_seconds": self.step,
            "idle": None if self.idle is None else {
                **{k: v if isinstance(v, bool) else round(v, 4) for k, v in vars(self.idle[0]).items()},
                "gpu_seconds": round(self.idle[1], 3), "text": self.idle_text()},
            "verdicts": [{"verdict": v.cause, **_span(v), "gpus": v.ranks} for v in self.verdicts],
            "effective_utilization": None if self.effective is None or self.effective.sm is None else {
                "sm_activity": _round(self.effective.sm), "busy_utilization": _round(self.effective.busy),
                "sources": list(self.effective.sources), "compute_phase_sm_activity": _round(self.effective.compute),
                "gpu_hours_busy_not_effective": round(self.effective.lost, 6),
                "worth_gpu_hours": {k: round(v, 6) for k, v in self.effective.worth.items()}},
            "effective": self.effective_text(),
            "series": {"times": [iso(t) for t in self.times], "verdicts": self.verdict_series,
                       "sm_activity": {u: [_round(v) for v in vs] for u, vs in self.sm_activity.items()},
                       "utilization": {u: [_round(v) for v in vs] for u, vs in self.utilization.items()},
                       "phase_shares": {p: [_round(v) for v in vs] for p, vs in self.phase_series.items()}},
        }


def _span(c: CauseSpan) -> dict[str, Any]:
    """What a cause's and a verdict's JSON share: code, title, seconds and the stretches it applied in."""
    return {"code": c.code, "title": c.title, "seconds": round(c.seconds, 3),
            "applied": [[iso(a), iso(b)] for a, b in c.intervals]}


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _known(share: float | None) -> str:
    return "unknown" if share is None else pct(share)


def duration(seconds: float) -> str:
    """``29160 -> "8.1 h"``, ``754 -> "12.6 min"``, ``25.04 -> "25.0 s"``."""
    size, unit = (3600, "h") if seconds >= 3600 else (60, "min") if seconds >= 60 else (1, "s")
    return f"{seconds / size:.1f} {unit}"


def _rows(r: Report) -> list[tuple[str, str]]:
    """The headline figures as (label, value) rows, shared by every format."""
    return [
        ("run", r.run),
        *([("run id", r.run_id)] if r.run_id else []),
        *([("tags", ", ".join(f"{k}={v}" for k, v in r.tags.items()))] if r.tags else []),
        ("range", f"{iso(r.start)} .. {iso(r.end)}"),
        ("wall time", duration(r.wall_seconds)),
        ("GPUs", f"{len(r.gpus)} ({', '.join(r.gpus)})" if r.gpus else "none joined (no GPU UUID)"),
        ("GPU-hours", f"{r.gpu_hours:.3f}"),
        ("mean utilization", _known(r.mean_utilization)),
        ("phase shares", _shares(r.shares)),
        ("GPU-hours below target", f"{r.gpu_hours_below_target:.3f} (below {pct(r.target)})"),
        *([("verdicts", ", ".join(f"{v.title} {duration(v.seconds)}" for v in r.verdicts))] if r.verdicts else []),
        ("projection", r.projection_text()),
        *([("idle time", r.idle_text())] if r.idle is not None else []),
        ("effective utilization", r.effective_text()),
        *([("GPU-hours busy, not effective", f"{r.effective.lost:.3f} (busy - SM activity)")]
          if r.effective is not None and r.effective.sm is not None else []),
        *((v.title, f"worth {r.effective.worth.get(v.cause, 0.0):.3f} GPU-hours; remedy: {v.remedy}")
          for v in r.verdicts if v.cause in EFFICIENCY_BY_ID and r.effective is not None),
    ]


def _shares(shares: dict[str, float]) -> str:
    """``"data 53%, metrics 30%, compute 17%"`` (phases under 0.5% left out; JSON has them all)."""
    return ", ".join(f"{p} {pct(v)}" for p, v in shares.items() if v >= 0.005)


def render_text(r: Report) -> str:
    width = max(len(k) for k, _ in _rows(r))
    lines = [f"{k.ljust(width)}  {v}" for k, v in _rows(r)]
    causes = [f"{c.title}: {duration(c.seconds)} on rank(s) {', '.join(c.ranks)} in {len(c.intervals)} stretch(es), "
              f"first {iso(c.intervals[0][0])}, last until {iso(c.intervals[-1][1])}; remedy: {c.remedy}"
              for c in r.causes] or ["no cause of the table applied"]
    lines.append("causes" + " " * (width - 4) + ("\n" + " " * (width + 2)).join(causes))
    for rank in r.ranks:
        lines.append(f"rank {rank['rank']} on {rank['uuid'] or '(no GPU UUID)'}: {duration(rank['wall_seconds'])}, "
                     f"utilization {_known(rank['utilization'])}, " + _shares(rank["shares"]))
    return "\n".join(lines) + "\n"


def render_markdown(r: Report) -> str:
    out = [f"### GPU report: run `{r.run}`", "", "| | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in _rows(r)[1:]]
    out += ["", "| cause | applied | stretches | remedy |", "|---|---|---|---|"]
    out += [f"| {c.title} | {duration(c.seconds)} | {', '.join(f'{iso(a)} .. {iso(b)}' for a, b in c.intervals[:5])}"
            f"{' ...' if len(c.intervals) > 5 else ''} | {c.remedy} |" for c in r.causes] or ["| none | | | |"]
    out += ["", "| rank | GPU | wall time | utilization | phases |", "|---|---|---|---|---|"]
    out += [f"| {k['rank']} | {k['uuid']} | {duration(k['wall_seconds'])} | {_known(k['utilization'])} | "
            + _shares(k["shares"]) + " |" for k in r.ranks]
    return "\n".join(out) + "\n"


def svg_open(w: int, h: int, title: str, x: int = 0) -> list[str]:
    """The opening tag of a ``w`` by ``h`` plot of either report, and its ``title`` in bold at ``x``."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
            f'aria-label="{html.escape(title)}">',
            f'<text x="{x}" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>']


def _svg_frame(w: int, h: int, pad: int, start: float, end: float, title: str) -> list[str]:
    span = max(end - start, 1e-9)
    parts = [*svg_open(w, h, title, pad),
             f'<rect x="{pad}" y="24" width="{w - 2 * pad}" height="{h - 54}" fill="#fafafa" stroke="#ccc"/>']
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        x = pad + frac * (w - 2 * pad)
        parts.append(f'<text x="{x:.1f}" y="{h - 14}" font-size="11" text-anchor="middle">'
                     f'+{duration(frac * span)}</text>')
    for level in (0, 0.5, 1.0):
        y = 24 + (1 - level) * (h - 54)
        parts.append(f'<text x="{pad - 4}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{pct(level)}</text>')
    return parts


def _xy(start: float, end: float, ts: float, value: float, w: int, h: int, pad: int) -> tuple[float, float]:
    span = max(end - start, 1e-9)
    return pad + (ts - start) / span * (w - 2 * pad), 24 + (1 - min(max(value, 0.0), 1.0)) * (h - 54)


def svg_utilization(start: float, end: float, times: list[float], utilization: dict[str, list[float | None]],
                    target: float, low: float, w: int = 900, h: int = 260, pad: int = 50) -> str:
    """Utilization over time from ``start`` to ``end`` (either report's plot): one line per series of ``utilization``
    (a value per point of ``times``, None: no reading), with the ``target`` and alert (``low``) lines."""
    parts = _svg_frame(w, h, pad, start, end, "GPU utilization over time")
    for level, color, name in ((target, "#2a9d8f", "target"), (low, "#e76f51", "alert threshold")):
        _, y = _xy(start, end, start, level, w, h, pad)
        parts.append(f'<line x1="{pad}" x2="{w - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
                     f'stroke-dasharray="6 4"/><text x="{w - pad - 4}" y="{y - 4:.1f}" font-size="11" '
                     f'text-anchor="end" fill="{color}">{name} {pct(level)}</text>')
    palette = ("#1d3557", "#e63946", "#457b9d", "#f4a261", "#2a9d8f", "#6d597a")
    for i, (uuid, values) in enumerate(sorted(utilization.items())):
        points = " ".join("{:.1f},{:.1f}".format(*_xy(start, end, ts, v, w, h, pad))
                          for ts, v in zip(times, values, strict=False) if v is not None)
        color = palette[i % len(palette)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{320 + 170 * i}" y="16" font-size="11" fill="{color}">{html.escape(uuid)}</text>')
    return "\n".join([*parts, "</svg>"])


def svg_phases(r: Report, w: int = 900, h: int = 260, pad: int = 50) -> str:
    parts = _svg_frame(w, h, pad, r.start, r.end, "Phase shares over time (all ranks)")
    base = [0.0] * len(r.times)
    for phase in r.shares:
        values = r.phase_series.get(phase, [])
        top = [b + (values[i] or 0.0 if i < len(values) else 0.0) for i, b in enumerate(base)]
        upper = [_xy(r.start, r.end, ts, v, w, h, pad) for ts, v in zip(r.times, top, strict=True)]
        lower = [_xy(r.start, r.end, ts, v, w, h, pad) for ts, v in zip(r.times, base, strict=True)][::-1]
        if upper:
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in upper + lower)
            color = PHASE_COLORS.get(phase, "#607d8b")
            parts.append(f'<polygon fill="{color}" fill-opacity="0.85" stroke="none" points="{points}">'
                         f'<title>{html.escape(phase)}</title></polygon>')
        base = top
    for i, phase in enumerate(p for p in r.shares if r.shares[p] >= 0.005):
        x = 320 + i * 105
        color = PHASE_COLORS.get(phase, "#607d8b")
        parts.append(f'<rect x="{x}" y="7" width="10" height="10" fill="{color}"/><text x="{x + 14}" '
                     f'y="16" font-size="11">{html.escape(phase)} {pct(r.shares[phase])}</text>')
    return "\n".join([*parts, "</svg>"])


def svg_causes(r: Report, w: int = 900, pad: int = 50) -> str:
    span = max(r.end - r.start, 1e-9)
    parts = svg_open(w, 40 + 22 * max(len(r.causes), 1), "When each cause applied")
    for i, c in enumerate(r.causes):
        y = 28 + 22 * i
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">{html.escape(c.code)}</text>')
        for a, b in c.intervals:
            x0 = pad + (max(a, r.start) - r.start) / span * (w - 2 * pad)
            x1 = pad + (min(b, r.end) - r.start) / span * (w - 2 * pad)
            parts.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="16" fill="#e76f51">'
                         f'<title>{html.escape(c.title)}: {iso(a)} .. {iso(b)}</title></rect>')
    if not r.causes:
        parts.append('<text x="0" y="44" font-size="12">No cause of the table applied.</text>')
    return "\n".join([*parts, "</svg>"])


def render_html(r: Report) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _rows(r))
    causes = "".join(f"<tr><td>{html.escape(c.title)}</td><td>{duration(c.seconds)}</td>"
                     f"<td>{html.escape(iso(c.intervals[0][0]))} .. {html.escape(iso(c.intervals[-1][1]))}</td>"
                     f"<td>{html.escape(c.remedy)}</td></tr>" for c in r.causes) \
        or '<tr><td colspan="4">No cause of the table applied.</td></tr>'
    ranks = "".join(f"<tr><td>{html.escape(k['rank'])}</td><td>{html.escape(k['uuid'])}</td>"
                    f"<td>{duration(k['wall_seconds'])}</td><td>{_known(k['utilization'])}</td>"
                    f"<td>{html.escape(_shares(k['shares']))}</td></tr>"
                    for k in r.ranks)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>GPU report: {html.escape(r.run)}</title><style>{STYLE}</style></head><body>\n"
            f"<h1>GPU report: run {html.escape(r.run)}</h1>\n<table>{rows}</table>\n"
            f"{svg_utilization(r.start, r.end, r.times, r.utilization, r.target, r.low)}\n"
            f"{svg_phases(r)}\n{svg_causes(r)}\n"
            f"<h2>Causes</h2><table><tr><th>cause</th><th>applied</th><th>from .. until</th><th>remedy</th></tr>"
            f"{causes}</table>\n<h2>Ranks</h2><table><tr><th>rank</th><th>GPU</th><th>wall time</th>"
            f"<th>utilization</th><th>phases</th></tr>{ranks}</table>\n"
            f"<p>Source {html.escape(r.source)}; one point every {duration(r.step)}. Projection: "
            f"wall time x (1 - share of the main cause); see docs/cli.md.</p>\n</body></html>\n")


def render_json(r: Report) -> str:
    return json.dumps(r.to_json(), indent=2) + "\n"


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json, "html": render_html}


def write(text: str, out: str | None) -> int:
    """Write a rendered report to ``out`` (stdout when None); the exit status (2: cannot write)."""
    if out:
        try:
            Path(out).write_text(text)
        except OSError as err:
            return fail(f"cannot write {out}: {err.strerror}")
    else:
        sys.stdout.write(text)
    return 0
