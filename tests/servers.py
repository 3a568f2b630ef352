"""The tests' name for the test bed (testbed/ at the repository root): ``from servers import run_prometheus``
keeps working in every test file. New code imports ``testbed`` itself."""

from __future__ import annotations

from testbed import (
    REPO,
    RULE_FILES,
    SRC,
    Process,
    at_server_interval,
    closed_url,
    exporter_env,
    free_port,
    http_get,
    http_status,
    promql,
    run_alertmanager,
    run_exporter,
    run_prometheus,
    run_server,
    run_victoriametrics,
    run_vmalert,
    scrape_config,
    wait_until,
)

__all__ = ["REPO", "RULE_FILES", "SRC", "Process", "at_server_interval", "closed_url", "exporter_env", "free_port",
           "http_get", "http_status", "promql", "run_alertmanager", "run_exporter", "run_prometheus", "run_server",
           "run_victoriametrics", "run_vmalert", "scrape_config", "wait_until"]
