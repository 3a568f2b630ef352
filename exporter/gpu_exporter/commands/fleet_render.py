"""``report --fleet`` and ``report --list`` printed: text, Markdown, JSON, and HTML with SVG bars.

The figures are gpu_exporter.verdict.fleet's; the HTML's plot of utilization over time is the run report's
(:func:`gpu_exporter.commands.report_render.svg_utilization`).
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from collections.abc import Sequence
from typing import Any

from gpu_exporter.commands import report_render as render
from gpu_exporter.commands.client_cli import iso
from gpu_exporter.verdict.fleet import NONE, Fleet, LaunchRow, Point, Prices, Range, Tally
from gpu_exporter.verdict.format import pct
from gpu_exporter.verdict.funnel import lines as funnel_lines
from gpu_exporter.verdict.ladder import VERDICT_TITLES


def _h(hours: float) -> str:
    """GPU-hours to 3 decimals, or to 5 below 0.1 (a short range).

    >>> _h(1234.56789), _h(0.0028)
    ('1234.568', '0.00280')
    """
    return f"{hours:.3f}" if hours >= 0.1 or hours == 0 else f"{hours:.5f}"


def _money(prices: Prices, value: float) -> str:
    return f"{value:.2f} {prices.currency}" if value >= 1 or value == 0 else f"{value:.4f} {prices.currency}"


TEXT_WIDTH = 100
"""The widest line of the text report (its tables' labels, headline and offenders wrap to it)."""
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z])")
"""A full stop that ends a sentence: followed by a capital, not the one of "e.g." or "i.e."."""


def _first(remedy: str) -> str:
    """The first sentence of a remedy (the JSON has all of it); "e.g." or a dotted name does not end it.

    >>> _first("Cheaper decoding (on the GPU, e.g. DALI), or cache torch.compile output. Then more.")
    'Cheaper decoding (on the GPU, e.g. DALI), or cache torch.compile output.'
    """
    line = (remedy.splitlines() or [""])[0]
    end = _SENTENCE_END.search(line)
    return line[:end.start() + 1] if end else line


def _wrap(line: str, indent: int, width: int = TEXT_WIDTH) -> list[str]:
    """``line`` in lines of at most ``width`` columns, the later ones indented by ``indent``; no word is cut."""
    return textwrap.wrap(line, width, subsequent_indent=" " * indent, break_long_words=False,
                         break_on_hyphens=False) or [line]


def _headline(f: Fleet) -> list[tuple[str, str]]:
    r = f.r
    rows = [("fleet", f"{f.gpus} GPU(s) on {f.nodes} node(s) at {r.source}"
                      + "".join(f", {k} {v}" for k, v in f.filters.items())),
            ("range", f"{iso(r.start)} .. {iso(r.end)} ({render.duration(r.end - r.start)}, one point every "
                      f"{render.duration(r.step)}, judged over {render.duration(r.window)})"),
            ("GPU-hours", _h(f.total.gpu_hours)),
            ("GPU-hours below target", f"{_h(f.total.below_target)} (below {pct(r.target)})"),
            ("idle GPU-hours below target", f"{_h(f.total.idle)} (the capacity lost)")]
    if f.prices is not None:
        unpriced = f", and {_h(f.total.unpriced)} idle GPU-hours of models without a price" if f.total.unpriced else ""
        rows.append(("money lost", f"{_money(f.prices, f.total.money)} (idle GPU-hours below target x "
                                   f"{f.prices.source}'s price per GPU-hour{unpriced})"))
    return [*rows, *funnel_lines(f.funnel, f.titles), ("runs", str(len(f.r.launches)))]


def _table_rows(f: Fleet) -> list[tuple[str, list[tuple[str, Tally]]]]:
    causes = [(f"{f.titles[k]}{'' if f.below[k] else ' (not below target)'}", v) for k, v in f.by_cause.items()]
    owners = [("Kubernetes owner", list(f.by_owner.items()))] if f.by_owner else []
    return [("cause", causes), ("team", list(f.by_team.items())), ("namespace", list(f.by_namespace.items())),
            *owners, ("node", list(f.by_node.items())), ("GPU model", list(f.by_model.items()))]


def _columns(f: Fleet) -> list[str]:
    return ["GPU-hours", "below target", "idle below target", *(["money lost"] if f.prices else [])]


def _cells(f: Fleet, t: Tally) -> list[str]:
    return [_h(t.gpu_hours), _h(t.below_target), _h(t.idle), *([_money(f.prices, t.money)] if f.prices else [])]


def _offender_line(f: Fleet, i: int, o: dict[str, Any]) -> str:
    money = f", {_money(f.prices, o['money_lost'])}" if f.prices else ""
    remedy = _first(o["remedy"]) or "none"
    where = [f"team {o['team']}"] if o["team"] != NONE else []
    where += [] if o["who"].startswith("GPU ") else [f"node {o['node'] or NONE}"]
    return (f"{i}. {o['who']}{' (' + ', '.join(where) + ')' if where else ''}: {o['title']}, "
            f"{_h(o['gpu_hours_below_target'])} "
            f"GPU-hours below target, {_h(o['idle_gpu_hours_below_target'])} idle{money}; remedy: {remedy}")


def render_text(f: Fleet) -> str:
    """The report for a terminal: no line wider than :data:`TEXT_WIDTH` (a table's long labels wrap in their
    column, the numbers on their first line)."""
    head = _headline(f)
    width = max(len(k) for k, _ in head)
    lines = [wrapped for k, v in head for wrapped in _wrap(f"{k.ljust(width)}  {v}", width + 2)]
    for name, rows in _table_rows(f):
        cols = _columns(f)
        cells = [_cells(f, t) for _, t in rows]
        widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
        numbers = sum(widths) + 2 * len(widths)  # each column and the two spaces before it
        room = max(TEXT_WIDTH - 3 - numbers, 12)  # the label column's widest
        labels = [_wrap(k, 2, room) for k, _ in rows]
        label = max([len(name), *(len(part) for parts in labels for part in parts)])
        header = "  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))
        lines += ["", f"{('by ' + name).ljust(label + 3)}  {header}"]
        for parts, row in zip(labels, cells, strict=True):
            values = "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
            lines += [f"   {parts[0].ljust(label)}  {values}", *(f"   {part}" for part in parts[1:])]
    lines += ["", "top offenders (idle GPU-hours below target)"]
    offenders = [_offender_line(f, i, o) for i, o in enumerate(f.offenders, 1)] or ["none: no GPU time below target"]
    lines += [wrapped for line in offenders for wrapped in _wrap(line, 3)]
    return "\n".join(lines) + "\n"


def render_markdown(f: Fleet) -> str:
    out = ["### GPU fleet report", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in _headline(f))]
    for name, rows in _table_rows(f):
        cols = _columns(f)
        out += ["", f"| {name} | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        out += [f"| {k} | " + " | ".join(_cells(f, t)) + " |" for k, t in rows]
    out += ["", "| # | offender | team | verdict | below target | idle | remedy |", "|---|---|---|---|---:|---:|---|"]
    out += [f"| {i} | {o['who']} | {o['team']} | {o['title']} | {_h(o['gpu_hours_below_target'])} | "
            f"{_h(o['idle_gpu_hours_below_target'])} | {_first(o['remedy'])} |"
            for i, o in enumerate(f.offenders, 1)]
    return "\n".join(out) + "\n"


def render_json(f: Fleet) -> str:
    return json.dumps(fleet_json(f), indent=2) + "\n"


def svg_bars(title: str, rows: Sequence[tuple[str, Tally]], w: int = 900) -> str:
    """Horizontal bars: each group's GPU-hours, the part below target and the idle part of it."""
    h = 40 + 22 * max(len(rows), 1)
    scale = max([t.gpu_hours for _, t in rows] + [1e-12])
    left, right = 260, w - 120
    parts = render.svg_open(w, h, title)
    for i, (name, t) in enumerate(rows):
        y = 28 + 22 * i
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">{html.escape(name[:40])}</text>')
        for value, color in ((t.gpu_hours, "#cfd8dc"), (t.below_target, "#f4a261"), (t.idle, "#e76f51")):
            width = max((right - left) * value / scale, 0.0)
            parts.append(f'<rect x="{left}" y="{y}" width="{width:.1f}" height="16" fill="{color}"/>')
        parts.append(f'<text x="{right + 6}" y="{y + 13}" font-size="11">{_h(t.gpu_hours)} h</text>')
    return "\n".join([*parts, "</svg>"])


def render_html(f: Fleet) -> str:
    head = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in _headline(f))
    tables, plots = [], []
    for name, rows in _table_rows(f):
        cols = "".join(f"<th>{html.escape(c)}</th>" for c in _columns(f))
        body = "".join(f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td>{c}</td>" for c in _cells(f, t)) + "</tr>"
                       for k, t in rows)
        tables.append(f"<h2>By {html.escape(name)}</h2><table><tr><th>{html.escape(name)}</th>{cols}</tr>{body}"
                      "</table>")
        if name in ("cause", "team"):
            plots.append(svg_bars(f"GPU-hours by {name}: all (grey), below target (orange), idle below target (red)",
                                  rows))
    if f.times:  # the run report's plot of utilization over time, with the target and alert lines
        plots.insert(0, render.svg_utilization(f.r.start, f.r.end, f.times, f.utilization, f.r.target, f.r.low))
    offenders = "".join(f"<li>{html.escape(_offender_line(f, i, o)[len(str(i)) + 2:])}</li>"
                        for i, o in enumerate(f.offenders, 1)) or "<li>none: no GPU time below target</li>"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>GPU fleet report</title>"
            f"<style>{render.STYLE}</style></head><body>\n<h1>GPU fleet report</h1>\n<table>{head}</table>\n"
            + "\n".join(plots) + "\n" + "\n".join(tables)
            + f"\n<h2>Top offenders</h2><ol>{offenders}</ol>\n<p>Every GPU judged at every point by the verdict "
              "ladder of diagnose; see docs/cli.md.</p>\n</body></html>\n")


RENDERERS = {"text": render_text, "markdown": render_markdown, "json": render_json, "html": render_html}


def fleet_json(f: Fleet) -> dict[str, Any]:
    """The fleet report as ``--output json`` writes it."""
    priced = f.prices is not None
    out: dict[str, Any] = {
        "source": f.r.source, "start": iso(f.r.start), "end": iso(f.r.end),
        "step_seconds": f.r.step, "window_seconds": f.r.window, "utilization_target": f.r.target,
        "filters": f.filters, "gpus": f.gpus, "nodes": f.nodes, **f.total.to_json(priced),
        "by_cause": [{"verdict": k, "title": f.titles[k], "code": f.codes[k], "below_target": f.below[k],
                      **v.to_json(priced)} for k, v in f.by_cause.items()],
        **{f"by_{name}": [{name: k, **v.to_json(priced)} for k, v in getattr(f, f"by_{name}").items()]
           for name in ("team", "namespace", "owner", "node", "model")},
        "offenders": f.offenders, "runs": [launch_json(row) for row in f.r.launches], "funnel": f.funnel.to_json(),
    }
    if f.prices is not None:
        out["prices"] = {"currency": f.prices.currency, "gpu_hour": f.prices.gpu_hour,
                         "unpriced_idle_gpu_hours": round(f.total.unpriced, 6)}
    return out



# --- the list of runs --------------------------------------------------------------------------------

def _main_title(main: Point | None) -> str | None:
    return None if main is None else VERDICT_TITLES.get(main.verdict, main.verdict)


def launch_json(row: LaunchRow) -> dict[str, Any]:
    main = row.main()
    return {"run_id": row.ident, "run": row.run, "tags": row.tags, "owner": row.owners(),
            "kubernetes_owner": row.kube_owners,
            "start": iso(row.start), "end": iso(row.end), "ranks": row.ranks, "gpus": row.gpus,
            "wall_seconds": round(row.wall, 3), "mean_utilization": None if row.utilization is None
            else round(row.utilization, 4),
            "seconds_by_verdict": row.by_verdict(), "main_cause": None if main is None else main.verdict,
            "main_cause_title": _main_title(main)}


def _list_cells(row: LaunchRow, sep: str, empty: str) -> tuple[str, ...]:
    """A row of the list as text and Markdown show it: lists joined by ``sep``, ``empty`` for what is not known."""
    return (row.ident, row.run, sep.join(f"{k}={v}" for k, v in row.tags.items()) or empty,
            sep.join(row.kube_owners or row.owners()) or empty, str(len(row.ranks)), str(len(row.gpus)),
            iso(row.start), render.duration(row.wall), empty if row.utilization is None else pct(row.utilization),
            _main_title(row.main()) or empty)


def render_list_text(rows: Sequence[LaunchRow], r: Range) -> str:
    head = ("RUN ID", "RUN", "TAGS", "OWNER", "RANKS", "GPUS", "START", "WALL", "UTIL", "MAIN CAUSE")
    table = [head, *(_list_cells(row, ",", "-") for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table]
    lines.append(f"{len(rows)} run(s) between {iso(r.start)} and {iso(r.end)} at {r.source}")
    return "\n".join(lines) + "\n"


def render_list_json(rows: Sequence[LaunchRow], r: Range) -> str:
    return json.dumps({"source": r.source, "start": iso(r.start), "end": iso(r.end),
                       "runs": [launch_json(row) for row in rows]}, indent=2) + "\n"


def render_list_markdown(rows: Sequence[LaunchRow], r: Range) -> str:
    out = [f"### Training runs, {iso(r.start)} .. {iso(r.end)}", "",
           "| run id | run | tags | owner | ranks | GPUs | start | wall | utilization | main cause |",
           "|---|---|---|---|---:|---:|---|---:|---:|---|"]
    out += ["| " + " | ".join(_list_cells(row, ", ", "")) + " |" for row in rows]
    return "\n".join(out) + "\n"


LIST_RENDERERS = {"text": render_list_text, "markdown": render_list_markdown, "json": render_list_json}
