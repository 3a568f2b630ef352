"""The test bed: real processes (the exporter, Prometheus, Alertmanager, VictoriaMetrics, vmalert) on free
ports of 127.0.0.1, started, waited for and stopped, for the tests (tests/) and the benches (bench/) alike.

Run from the repository root (pytest and ``python -m bench...`` put it on ``sys.path``); the installed
package (exporter/) does not ship it. Example::

    from testbed import run_exporter, run_prometheus, scrape_config, wait_until, promql

    with run_exporter(["--simulate", "bursty.yaml"]) as exporter, \\
            run_prometheus(scrape_config(exporter, "node-a", rule_files=())) as prom:
        wait_until(lambda: promql(prom, "up == 1"), 30, what="the first scrape")
"""

from __future__ import annotations

from testbed.net import closed_url, free_port, http_get, http_status, wait_until
from testbed.servers import (
    REPO,
    RULE_FILES,
    SRC,
    Process,
    alertmanager_alerts,
    at_server_interval,
    exporter_env,
    post_alerts,
    promql,
    run_alertmanager,
    run_exporter,
    run_prometheus,
    run_server,
    run_victoriametrics,
    run_vmalert,
    scrape_config,
)

__all__ = ["REPO", "RULE_FILES", "SRC", "Process", "alertmanager_alerts", "at_server_interval", "closed_url",
           "exporter_env", "free_port", "http_get", "http_status", "post_alerts", "promql", "run_alertmanager",
           "run_exporter", "run_prometheus", "run_server", "run_victoriametrics", "run_vmalert", "scrape_config",
           "wait_until"]
