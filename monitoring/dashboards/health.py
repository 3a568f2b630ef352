"""The exporter health dashboard (grafana/dashboards/gpu-exporter-health.json, uid ``gpu-exporter-health``):
whether the exporters themselves work (targets up, collectors, NVML errors, sample age, training ingest,
authentication failures, build info); only targets of the exporter job count.
"""

from __future__ import annotations

from gpu_exporter import catalog as m
from grafana_foundation_sdk.builders import dashboard as dash

from monitoring import panels as p
from monitoring.dashboards.shared import HEALTH_UID


def exporter_health(cfg: p.Config) -> dash.Dashboard:
    """Whether the exporters themselves work; only targets of the exporter job count."""
    c = cfg.cluster
    job = f'job=~"{cfg.exporter_job}"'

    def sel(metric: str) -> str:
        return cfg.sel(metric, "node")

    def jobsel(metric: str) -> str:
        return sel(metric).replace("{", "{" + job + ", ", 1)

    board = p.dashboard(cfg, HEALTH_UID, "GPU exporter health",
                        "Is the exporter itself healthy: targets up, collectors succeeding, NVML errors, sample age, "
                        "training ingest.", "6h", [p.variable(cfg, "node", "Node", m.GPU_EXPORTER_BUILD_INFO.name)])
    stale = cfg.default("stale_after")
    legend = f"{{{{{c}}}}} {{{{node}}}}"
    return (board
            .with_panel(p.stat_panel(
                "Exporters up", f"Exporter scrape targets (job matching {cfg.exporter_job}) of the selected "
                "nodes that answered the last scrape; other targets such as kubelets do not count.",
                p.query(f"sum({jobsel('up')})"), w=6))
            .with_panel(p.stat_panel("GPUs visible",
                                     f"GPUs the exporters see now ({m.GPU_EXPORTER_GPUS.name}), all selected "
                                     "nodes.", p.query(f"sum({sel(m.GPU_EXPORTER_GPUS.name)})"), w=6))
            .with_panel(p.stat_panel("Training runs tracked", "Training runs (run, rank) whose snapshots the "
                                     "exporters hold.", p.query(f"sum({sel(m.GPU_EXPORTER_TRAINING_RUNS.name)})"),
                                     w=6))
            .with_panel(p.stat_panel(
                "Newest sample age", f"Age of the newest NVML sample; /readyz fails when it grows past "
                f"stale_after ({stale:g} s by default); orange from half that.",
                p.query(f"max({sel(m.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.name)})", "oldest node"), unit="s", w=6,
                thresholds=p.steps(("green", None), ("orange", stale / 2), ("red", stale))))
            .with_panel(p.state_timeline(
                "Collector success", "1 while a collector's last run succeeded; a failing collector never fails "
                "the scrape, it shows here.", p.query(sel(m.GPU_EXPORTER_COLLECTOR_SUCCESS.name),
                                                   f"{legend} {{{{collector}}}}"),
                unit="bool_on_off", thresholds=p.steps(("red", None), ("green", 1))))
            .with_panel(p.timeseries("Collector duration", "Time each collector took on the last scrape.",
                                     [p.query(sel(m.GPU_EXPORTER_COLLECTOR_DURATION_SECONDS.name),
                                              f"{legend} {{{{collector}}}}")], unit="s"))
            .with_panel(p.timeseries(
                "NVML errors", "NVML calls that failed, by function and error, per interval.",
                [p.query(f"sum {cfg.by('node', 'function', 'error')} "
                         f"(increase({sel(m.GPU_EXPORTER_NVML_ERRORS_TOTAL.name)}[$__rate_interval]))",
                         f"{legend} {{{{function}}}}: {{{{error}}}}")], unit="none", bars=True))
            .with_panel(p.timeseries(
                "Sample age and scrape duration", "Age of the newest NVML sample and the time Prometheus needed "
                "to scrape each exporter (exporter jobs only).",
                [p.query(sel(m.GPU_EXPORTER_LAST_SAMPLE_AGE_SECONDS.name), f"{legend} sample age"),
                 p.query(jobsel("scrape_duration_seconds"), f"{legend} scrape duration")], unit="s"))
            .with_panel(p.timeseries(
                "Training ingest", "Snapshots pushed by training jobs per second, by outcome (accepted, or the "
                "reason for rejection). Outcomes without a push in the interval are not drawn: every exporter "
                "serves each outcome from 0, and at 10,000 GPUs those zeros made this the slowest query "
                "(docs/fleet.md).",
                [p.query(f"sum {cfg.by('node', 'outcome')} "
                         f"(rate({sel(m.GPU_EXPORTER_INGEST_REQUESTS_TOTAL.name)}[$__rate_interval])) > 0",
                         f"{legend} {{{{outcome}}}}")], unit="reqps"))
            .with_panel(p.timeseries(
                "HTTP authentication failures", "Requests rejected for bad credentials, per interval.",
                [p.query(f"sum {cfg.by('node')} "
                         f"(increase({sel(m.GPU_EXPORTER_HTTP_AUTH_FAILURES_TOTAL.name)}[$__rate_interval]))",
                         legend)], unit="none", bars=True))
            .with_panel(p.table_panel(
                "Build info", "Exporter, Python and nvidia-ml-py versions per node.",
                [f"max {cfg.by('node', 'version', 'python_version', 'pynvml_version')} "
                 f"({sel(m.GPU_EXPORTER_BUILD_INFO.name)})"],
                w=24, h=6, merge=False, hide=("Value",))))
