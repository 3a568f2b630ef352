"""Start real processes for the tests and the benches: the exporter, Prometheus, Alertmanager,
VictoriaMetrics and vmalert.

Every server binds 127.0.0.1 on a free port, lives in a temporary directory and is
stopped when its context manager exits. Example::

    with run_exporter(["--simulate", str(scenario)]) as url:
        text = http_get(url + "/metrics")
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from testbed.net import free_port, http_get, http_status, wait_until

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "exporter"


def exporter_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process (an exporter, a training job): our sources first on PYTHONPATH, then the
    repository root, where a job script of tests/ finds the test bed (tests/ddp_loops.py's free port)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(REPO), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Process:
    """A child process in its own session, its output to ``log``; :meth:`stop` ends its whole group."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None, log: Path) -> None:
        self.log = log
        self._fh = log.open("wb")
        self.proc = subprocess.Popen(list(argv), stdout=self._fh, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._fh.close()


@contextlib.contextmanager
def run_exporter(args: Sequence[str], env: dict[str, str] | None = None,
                 port: int | None = None, scheme: str = "http",
                 ready_timeout: float = 20.0) -> Iterator[str]:
    """Run ``python -m gpu_exporter serve <args>`` on a free port; yield its base URL once /healthz answers."""
    port = port or free_port()
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "gpu_exporter", *args, "--web.listen-address", f"127.0.0.1:{port}"]
        p = Process(argv, exporter_env(env), Path(tmp) / "exporter.log")
        url = f"{scheme}://127.0.0.1:{port}"
        try:
            def up() -> bool:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"exporter exited with {p.proc.returncode}: {p.output()}")
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            wait_until(up, ready_timeout, what="exporter to listen")
            yield url
        finally:
            p.stop()


def promql(prom_url: str, expr: str) -> list[dict[str, Any]]:
    """Run an instant query against Prometheus and return the result vector."""
    q = urllib.parse.urlencode({"query": expr})
    body = json.loads(http_get(f"{prom_url}/api/v1/query?{q}"))
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr!r} failed: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def at_server_interval(text: str) -> str:
    """A rule file's ``text`` with no group ``interval:`` (any other file as it is): its groups evaluate at
    the server's own evaluation_interval. The shipped groups run every minute (``rule_interval``); the tests'
    servers evaluate every second so that a test need not wait minutes for a rule's first result."""
    if "interval:" not in text:
        return text
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if not (isinstance(doc, dict) and isinstance(doc.get("groups"), list)):
        return text
    for group in doc["groups"]:
        group.pop("interval", None)
    return str(yaml.safe_dump(doc, sort_keys=False))


@contextlib.contextmanager
def run_server(binary_names: Sequence[str], package: str, config_name: str, config_yaml: str,
               argv: Callable[[Path, int], Sequence[str]], files: dict[str, str] | None = None,
               ready_timeout: float = 30.0, rule_intervals: bool = False) -> Iterator[str]:
    """Any server of the Prometheus family: the first of ``binary_names`` on PATH (``package`` is the Debian
    package that installs it). Write ``config_yaml`` as ``config_name`` (and ``files``) to a temporary
    directory, start ``binary *argv(dir, port)`` and yield the base URL once ``/-/ready`` answers 200. Rule
    files lose their groups' intervals (:func:`at_server_interval`) unless ``rule_intervals``."""
    binary = next((b for name in binary_names if (b := shutil.which(name))), None)
    if binary is None:
        raise RuntimeError(f"{binary_names[0]} is not installed: run the README's test command "
                           f"(apt-get install {package})")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, text in (files or {}).items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text if rule_intervals else at_server_interval(text))
        (d / config_name).write_text(config_yaml)
        p = Process([binary, *argv(d, port)], None, d / f"{binary_names[0]}.log")
        url = f"http://127.0.0.1:{port}"
        try:
            def ready() -> bool:
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{binary_names[0]} exited: {p.output()[-2000:]}")
                return http_status(url + "/-/ready")[0] == 200
            wait_until(ready, ready_timeout, what=f"{binary_names[0]} to be ready")
            yield url
        finally:
            p.stop()


RULE_FILES = ("rules/gpu-recording.rules.yml", "rules/gpu-alerts.rules.yml")


def scrape_config(exporter_url: str, node: str, rule_files: Sequence[str] = RULE_FILES) -> str:
    """A Prometheus config scraping one exporter every second as job gpu-exporter (label ``node``),
    evaluating ``rule_files`` (paths relative to the config, as ``run_prometheus(files=...)`` writes them)."""
    rules = f"rule_files: [{', '.join(rule_files)}]\n" if rule_files else ""
    return (f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n{rules}"
            "scrape_configs:\n  - job_name: gpu-exporter\n    static_configs:\n"
            f"      - targets: [\"{urlsplit(exporter_url).netloc}\"]\n        labels: {{node: {node}}}\n")


def run_prometheus(config_yaml: str, files: dict[str, str] | None = None,
                   ready_timeout: float = 30.0, extra_args: Sequence[str] = (),
                   agent: bool = False, rule_intervals: bool = False,
                   tsdb_path: Path | None = None) -> contextlib.AbstractContextManager[str]:
    """Run a real Prometheus with ``config_yaml`` (other ``files`` are written beside it); yield its URL.

    Relative paths in the config (rule_files, ...) resolve against the temporary directory.
    ``extra_args``: more flags, e.g. ``--web.enable-remote-write-receiver``. ``agent``: agent mode
    (``--enable-feature=agent``: scrape and remote-write only, no queries, rules or local TSDB).
    ``rule_intervals``: keep the rule groups' own intervals (the bench); tests evaluate at the config's.
    ``tsdb_path``: the data directory (e.g. blocks that ``promtool tsdb create-blocks-from`` backfilled).
    """
    storage = (["--enable-feature=agent", "--storage.agent.path={d}/wal"] if agent
               else [f"--storage.tsdb.path={tsdb_path}" if tsdb_path else "--storage.tsdb.path={d}/data"])
    return run_server(["prometheus"], "prometheus", "prometheus.yml", config_yaml, lambda d, port: [
        f"--config.file={d / 'prometheus.yml'}", *(s.format(d=d) for s in storage),
        f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", *extra_args], files, ready_timeout,
        rule_intervals)


def run_victoriametrics(ready_timeout: float = 30.0) -> contextlib.AbstractContextManager[str]:
    """Run VictoriaMetrics' single-node server (Debian ``victoria-metrics``); yield its URL.

    It accepts Prometheus remote write at ``/api/v1/write`` and answers the Prometheus query API.
    Queries see samples up to 1 s old (its default hides the last 30 s).
    """
    return run_server(["victoria-metrics"], "victoria-metrics", "README", "VictoriaMetrics test data\n",
                       lambda d, port: [f"-storageDataPath={d / 'data'}", f"-httpListenAddr=127.0.0.1:{port}",
                                        "-search.latencyOffset=1s", "-search.disableCache"], None, ready_timeout)


def run_vmalert(rule_files: dict[str, str], datasource_url: str, remote_write_url: str, notifier_url: str,
                evaluation_interval: str = "15s", ready_timeout: float = 30.0,
                rule_intervals: bool = False) -> contextlib.AbstractContextManager[str]:
    """Run vmalert (Debian ``victoria-metrics``) on ``rule_files`` ({name: Prometheus rule file text}):
    it queries ``datasource_url``, writes recording results and alert states to
    ``remote_write_url`` and sends alerts to ``notifier_url`` (an Alertmanager); yield its URL."""
    return run_server(["vmalert"], "victoria-metrics", "README", "vmalert test rules\n", lambda d, port: [
        *(f"-rule={d / name}" for name in sorted(rule_files)), f"-datasource.url={datasource_url}",
        f"-remoteWrite.url={remote_write_url}", f"-notifier.url={notifier_url}",
        f"-evaluationInterval={evaluation_interval}", f"-httpListenAddr=127.0.0.1:{port}"],
        dict(rule_files), ready_timeout, rule_intervals)


def post_alerts(url: str, alerts: list[dict[str, str]]) -> None:
    """Post alerts (their labels) to the Alertmanager at ``url``, as Prometheus does."""
    request = urllib.request.Request(url + "/api/v2/alerts", data=json.dumps([{"labels": labels} for labels in alerts])
                                     .encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def alertmanager_alerts(url: str) -> list[dict[str, Any]]:
    """The alerts the Alertmanager at ``url`` holds, with their status (``inhibitedBy`` ...)."""
    alerts: list[dict[str, Any]] = json.loads(http_get(url + "/api/v2/alerts"))
    return alerts


def run_alertmanager(config_yaml: str, ready_timeout: float = 30.0) -> contextlib.AbstractContextManager[str]:
    """Run a real Alertmanager (Debian ``prometheus-alertmanager``) with ``config_yaml``; yield its URL."""
    cluster_port = free_port()
    return run_server(["prometheus-alertmanager", "alertmanager"], "prometheus-alertmanager", "alertmanager.yml",
                       config_yaml, lambda d, port: [
                           f"--config.file={d / 'alertmanager.yml'}", f"--storage.path={d / 'data'}",
                           f"--web.listen-address=127.0.0.1:{port}",
                           f"--cluster.listen-address=127.0.0.1:{cluster_port}",
                           f"--cluster.advertise-address=127.0.0.1:{cluster_port}"], None, ready_timeout)
