"""Panel helpers for the generated Grafana dashboards, on top of grafana-foundation-sdk builders.

The problem: the five dashboards share one data source variable, one way to select a cluster/node/GPU,
one set of utilization colours and a handful of panel shapes; written out by hand those repeated
options were most of the JSON and drifted apart. Here each shape is one function, every number
comes from the one config (:class:`Config`, read from ``exporter/gpu_exporter/thresholds.yml``), and
:func:`render` turns a built dashboard into the committed JSON. Example::

    cfg = Config.load()
    panel = timeseries("Temperature", "GPU die temperature.", [query(cfg.sel("gpu_temperature_celsius"))],
                       unit="celsius")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from gpu_exporter import catalog
from gpu_exporter.config import SETTINGS
from gpu_exporter.thresholds import ThresholdsFile, read_thresholds_file
from gpu_exporter.verdict.alerts import runbook_anchor
from gpu_exporter.verdict.levels import LEVELS, LOW, OK, TARGET
from grafana_foundation_sdk.builders import bargauge, common, prometheus, stat, statetimeline, table
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

DATASOURCE_UID = "gpu-prometheus"
"""The provisioned Prometheus (grafana/provisioning/datasources/prometheus.yml) the dashboards default to."""
DATASOURCE = cm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "gpu-exporter"

LEVEL_COLOURS = {LOW: "red", TARGET: "yellow", OK: "green"}
"""The colour of a utilization level on every dashboard."""

P = TypeVar("P", ts.Panel, stat.Panel, bargauge.Panel, statetimeline.Panel, table.Panel)


class Config(ThresholdsFile):
    """The one config (thresholds.yml, read and checked by the typed loader of gpu_exporter.thresholds: its
    ``text`` and ``num``) with the query helpers the dashboards and Grafana alerts share."""

    @classmethod
    def load(cls, file: ThresholdsFile | None = None) -> Config:
        """Read thresholds.yml (or take ``file``, as :func:`read_thresholds_file` returns)."""
        file = read_thresholds_file() if file is None else file
        return cls(file.source, file.values)

    @property
    def cluster(self) -> str:
        """The label that names a cluster (config key ``cluster_label``)."""
        return self.text("cluster_label")

    @property
    def exporter_job(self) -> str:
        return self.text("exporter_job_regex")

    @staticmethod
    def default(setting: str) -> float:
        """The exporter's default of a numeric setting: ``stale_after`` (seconds), when /readyz starts failing;
        ``ingest.stale_after_seconds``, when it drops a silent training rank."""
        return float(next(s.default for s in SETTINGS if s.key == setting))

    def runbook(self, alert: str) -> str:
        """The runbook URL of an alert (its section: gpu_exporter.verdict.alerts.runbook_anchor)."""
        return self.runbook_url(runbook_anchor(alert))

    def sel(self, metric: str, *labels: str, **fixed: str) -> str:
        """``metric{cluster=~"$cluster", node=~"$node", ...}``: the cluster variable, then one ``=~"$x"``
        per label in ``labels`` and one exact match per ``fixed`` item.

        >>> Config.load(read_thresholds_file().with_values(cluster_label="k8s_cluster")).sel(
        ...     "gpu_info", "node", phase="data")
        'gpu_info{k8s_cluster=~"$cluster", node=~"$node", phase="data"}'
        """
        matchers = [f'{self.cluster}=~"$cluster"', *(f'{name}=~"${name}"' for name in labels),
                    *(f'{name}="{value}"' for name, value in fixed.items())]
        return f"{metric}{{{', '.join(matchers)}}}"

    def by(self, *labels: str) -> str:
        """``by (cluster, node, ...)``: every aggregation keeps the cluster label apart."""
        return f"by ({', '.join((self.cluster, *labels))})"

    def on(self, *labels: str) -> str:
        """``on (cluster, uuid)``: joins match within one cluster (an absent label matches absent)."""
        return f"on ({', '.join((self.cluster, *labels))})"

    def utilization_steps(self) -> dash.ThresholdsConfig:
        """Each level's colour (the levels of gpu_exporter.verdict.levels, lowest first) from the line of
        the level below it: red below ``utilization_low_threshold``, yellow below ``utilization_target``,
        green above."""
        starts = [None, *(self.num(lv.key) for lv in LEVELS)]
        colours = [*(LEVEL_COLOURS[lv.name] for lv in LEVELS), LEVEL_COLOURS[OK]]
        return steps(*zip(colours, starts, strict=True))


# ------------------------------------------------------------------------------------------- pieces


def steps(*pairs: tuple[str, float | None]) -> dash.ThresholdsConfig:
    """Absolute threshold steps ``(colour, from value)``; the first one starts at ``None`` (-inf)."""
    return (dash.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=value, color=color) for color, value in pairs]))


def query(expr: str, legend: str = "__auto", *, instant: bool = False) -> prometheus.Dataquery:
    """One PromQL target: a range query by default, an instant one for bar gauges and tables."""
    target = prometheus.Dataquery().expr(expr).legend_format(legend).editor_mode(pm.QueryEditorMode.CODE)
    return target.instant() if instant else target.range()


def link_url(uid: str, **variables: str) -> str:
    """The URL of another generated dashboard, carrying the data source, the cluster and the time range."""
    params = "".join(f"var-{name}={value}&" for name, value in
                     {"datasource": "${datasource}", "cluster": "${cluster}", **variables}.items())
    return f"/d/{uid}/{uid}?{params}${{__url_time_range}}"


def runbook_links(cfg: Config, alerts: Sequence[tuple[str, str]]) -> list[dash.DashboardLink]:
    """Panel links ``(title, alert)`` to the alerts' runbook sections (config ``runbook_url_pattern``)."""
    return [dash.DashboardLink(f"Runbook: {title}").type(dm.DashboardLinkType.LINK).url(cfg.runbook(alert))
            .target_blank(True) for title, alert in alerts]


def _properties(props: dict[str, Any]) -> list[dm.DynamicConfigValue]:
    """Override properties for a field (``custom_fillOpacity: 0`` sets ``custom.fillOpacity``)."""
    return [dm.DynamicConfigValue(id_val=key.replace("_", "."), value=value) for key, value in props.items()]


DASHED = {"custom_fillOpacity": 0, "custom_lineStyle": {"dash": [10, 10], "fill": "dash"}}
"""Override for reference lines (a limit, a total) drawn dashed and unfilled beside the measured series."""


def _common(panel: P, title: str, description: str, targets: Sequence[prometheus.Dataquery], unit: str,
            w: int, h: int, thresholds: dash.ThresholdsConfig | None,
            colours: dm.FieldColorModeId = dm.FieldColorModeId.THRESHOLDS, ratio_range: bool = True) -> P:
    """The parts every panel has: colours from ``thresholds`` (default: all green) or the palette; a ratio unit
    fixes the range to 0-1 (unless not ``ratio_range``)."""
    panel = (panel.title(title).description(description).datasource(DATASOURCE).unit(unit).span(w).height(h)
             .thresholds(thresholds or steps(("green", None))).color_scheme(dash.FieldColor().mode(colours)))
    for ref, target in zip("ABCDEFGH", targets, strict=False):
        panel = panel.with_target(target.ref_id(ref).datasource(DATASOURCE))
    return panel.min(0).max(1) if ratio_range and unit == "percentunit" else panel


# ------------------------------------------------------------------------------------------- panels


def timeseries(title: str, description: str, targets: Sequence[prometheus.Dataquery], *, unit: str,
               w: int = 12, h: int = 8, thresholds: dash.ThresholdsConfig | None = None,
               threshold_style: cm.GraphThresholdsStyleMode = cm.GraphThresholdsStyleMode.OFF,
               bars: bool = False, stacked: bool = False, fill: int | None = None,
               dashed: str | None = None, links: Sequence[dash.DashboardLink] = ()) -> ts.Panel:
    """A time series: lines (fill 10) or bars (fill 80), optionally stacked; a ratio unit fixes 0-1;
    ``dashed`` names a regex of series drawn as dashed reference lines."""
    panel = (_common(ts.Panel(), title, description, targets, unit, w, h, thresholds,
                     dm.FieldColorModeId.PALETTE_CLASSIC)
             .draw_style(cm.GraphDrawStyle.BARS if bars else cm.GraphDrawStyle.LINE)
             .line_width(1).fill_opacity(fill if fill is not None else 80 if bars else 10)
             .show_points(cm.VisibilityMode.NEVER).span_nulls(False)
             .thresholds_style(common.GraphThresholdsStyleConfig().mode(threshold_style))
             .legend(common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))
    if stacked:
        panel = panel.stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if dashed:
        panel = panel.override_by_regexp(dashed, _properties(DASHED))
    if links:
        panel = panel.data_links(list(links))
    return panel


def utilization_timeseries(cfg: Config, title: str, description: str, targets: Sequence[prometheus.Dataquery],
                           **kwargs: Any) -> ts.Panel:
    """A utilization time series with the low threshold drawn as a line over coloured bands."""
    return timeseries(title, description, targets, unit="percentunit", thresholds=cfg.utilization_steps(),
                      threshold_style=cm.GraphThresholdsStyleMode.LINE_AND_AREA, **kwargs)


def stat_panel(title: str, description: str, target: prometheus.Dataquery, *, unit: str = "none",
               w: int = 4, h: int = 5, thresholds: dash.ThresholdsConfig | None = None) -> stat.Panel:
    """A big number (last value, with its sparkline) coloured by ``thresholds``."""
    return (_common(stat.Panel(), title, description, [target], unit, w, h, thresholds)
            .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields(""))
            .color_mode(cm.BigValueColorMode.VALUE).graph_mode(cm.BigValueGraphMode.AREA)
            .text_mode(cm.BigValueTextMode.AUTO).justify_mode(cm.BigValueJustifyMode.AUTO)
            .orientation(cm.VizOrientation.AUTO))


def bar_gauge(title: str, description: str, target: prometheus.Dataquery, *, unit: str = "percentunit",
              w: int = 8, h: int = 8, thresholds: dash.ThresholdsConfig | None = None,
              panel_links: Sequence[dash.DashboardLink] = ()) -> bargauge.Panel:
    """Horizontal gradient bars, one per series, of an instant query."""
    panel = (_common(bargauge.Panel(), title, description, [target], unit, w, h, thresholds)
             .orientation(cm.VizOrientation.HORIZONTAL).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
             .show_unfilled(True)
             .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False).fields("")))
    return panel.links(list(panel_links)) if panel_links else panel


def state_timeline(title: str, description: str, target: prometheus.Dataquery, *, unit: str,
                   thresholds: dash.ThresholdsConfig, w: int = 12, h: int = 8, legend: bool = False,
                   links: Sequence[dash.DashboardLink] = ()) -> statetimeline.Panel:
    """One row per series, coloured by ``thresholds``; on/off signals merge equal neighbours."""
    panel = (_common(statetimeline.Panel(), title, description, [target], unit, w, h, thresholds)
             .show_value(cm.VisibilityMode.NEVER).merge_values(unit != "percentunit")
             .row_height(0.9 if unit == "percentunit" else 0.8).align_value(cm.TimelineValueAlignment.LEFT)
             .legend(common.VizLegendOptions().show_legend(legend).display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM))
             .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE).sort(cm.SortOrder.NONE)))
    return panel.data_links(list(links)) if links else panel


def table_panel(title: str, description: str, exprs: Sequence[str], *, unit: str = "none",
                w: int = 12, h: int = 8, merge: bool = True, hide: Sequence[str] = (),
                order: Sequence[str] = (), rename: dict[str, str] | None = None,
                overrides: dict[str, dict[str, Any]] | None = None,
                sort_by: str | None = None, sort_desc: bool = False,
                panel_links: Sequence[dash.DashboardLink] = ()) -> table.Panel:
    """Instant queries of ``exprs`` in table format, merged on their common labels into one row per series;
    ``hide``/``order``/``rename`` organise the columns (``Value #B`` is query B's value); ``sort_by`` a
    column, lowest first (highest with ``sort_desc``)."""
    targets = [query(expr, "", instant=True).format(pm.PromQueryFormat.TABLE) for expr in exprs]
    panel = _common(table.Panel(), title, description, targets, unit, w, h, None, dm.FieldColorModeId.PALETTE_CLASSIC,
                    ratio_range=False).show_header(True).cell_height(cm.TableCellHeight.SM)
    if sort_by:
        panel = panel.sort_by([common.TableSortByFieldState().display_name(sort_by).desc(sort_desc)])
    transformations = [dm.DataTransformerConfig(id_val="merge", options={})] if merge else []
    transformations.append(dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {name: True for name in ("Time", "__name__", "instance", "job", *hide)},
        "indexByName": {name: i for i, name in enumerate(order)},
        "renameByName": rename or {}}))
    panel = panel.transformations(transformations)
    for name, props in (overrides or {}).items():
        panel = panel.override_by_name(name, _properties(props))
    return panel.links(list(panel_links)) if panel_links else panel


# ------------------------------------------------------------------------------------------ dashboard


def variable(cfg: Config, name: str, label: str, metric: str, *parents: str, multi: bool = True,
             values: str = "") -> dash.QueryVariable:
    """A query variable ``label_values(metric{cluster, parents...}, name)`` (or of ``values``, a whole
    ``label_values(...)``); multi-value ones offer All (``.*``, which also matches series without the label)."""
    query = values or f"label_values({cfg.sel(metric, *parents)}, {name})"
    var = (dash.QueryVariable(name).label(label).datasource(DATASOURCE)
           .query({"query": query, "refId": f"{name}-variable", "qryType": 1})
           .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
           .multi(multi).include_all(multi))
    return var.all_value(".*") if multi else var


def textbox(name: str, label: str, default: str, description: str) -> dash.TextBoxVariable:
    """A free-text variable (``$name`` in the queries) whose value starts as ``default`` (a number of the
    config, such as the price of a GPU-hour)."""
    option = dm.VariableOption(selected=True, text=default, value=default)
    return (dash.TextBoxVariable(name).label(label).description(description)
            .default_value(default).current(option).options([option]))


def dashboard(cfg: Config, uid: str, title: str, description: str, time_from: str,
              variables: Sequence[dash.QueryVariable | dash.TextBoxVariable]) -> dash.Dashboard:
    """A dashboard with the shared frame: tag, links to its siblings, the data source and cluster
    variables (cluster values from ``gpu_exporter_build_info``), then ``variables``."""
    cluster = variable(cfg, "cluster", "Cluster", "",
                       values=f"label_values({catalog.GPU_EXPORTER_BUILD_INFO.name}, {cfg.cluster})").description(
        f"Values of the {cfg.cluster} label; All also matches series without it.")
    board = (dash.Dashboard(title).uid(uid).description(description).tags([TAG]).editable()
             .tooltip(dm.DashboardCursorSync.CROSSHAIR).timezone("browser").refresh("30s")
             .time(f"now-{time_from}", "now")
             .link(dash.DashboardLink("GPU dashboards").type(dm.DashboardLinkType.DASHBOARDS)
                   .tags([TAG]).as_dropdown(False).include_vars(False).keep_time(True).target_blank(False)
                   .icon("external link"))
             .with_variable(dash.DatasourceVariable("datasource").label("Data source").type("prometheus")
                            .current(dm.VariableOption(selected=True, text="Prometheus", value=DATASOURCE_UID)))
             .with_variable(cluster))
    for var in variables:
        board = board.with_variable(var)
    return board


def render(board: dash.Dashboard | dict[str, Any]) -> str:
    """The dashboard (built, or its :func:`model`) as committed JSON."""
    return json.dumps(board if isinstance(board, dict) else model(board), indent=2) + "\n"


def model(board: dash.Dashboard) -> dict[str, Any]:
    """The dashboard's JSON model: panels numbered in order (ids 1..n, rows included, so Grafana alerts
    can name a panel); no table ``options.footer`` (absent from Grafana 13's schema) and no
    interval-variable fields on other variables (absent from Grafana 12's and 13's)."""
    doc: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    for var in doc["templating"]["list"]:
        if var["type"] != "interval":  # the SDK writes interval-variable fields on every variable
            for key in ("auto", "auto_min", "auto_count"):
                var.pop(key, None)
    for number, panel in enumerate(doc["panels"], start=1):
        panel["id"] = number
        if panel["type"] == "table":
            panel.get("options", {}).pop("footer", None)
    return doc


def panel_id(board: dict[str, Any], title: str) -> int:
    """The id of the panel titled ``title`` in a dashboard model; KeyError when there is none."""
    for panel in board["panels"]:
        if panel["title"] == title:
            return int(panel["id"])
    raise KeyError(f"no panel titled {title!r}")
