"""End to end: a real Prometheus scrapes the real exporter over HTTPS with basic auth.

Wrong credentials get 401 with a Basic challenge and are counted in
gpu_exporter_http_auth_failures_total; the health endpoints stay open for probes.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import bcrypt
import pytest
from test_http_server import exporter
from test_web_config import self_signed

from testbed import exporter_env, free_port, promql, run_exporter, run_prometheus, wait_until

pytestmark = pytest.mark.slow  # end-to-end: real processes


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def get(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """(status, WWW-Authenticate header, body) without raising on 4xx."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, context=context, timeout=5) as resp:
            return int(resp.status), "", resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), str(err.headers.get("WWW-Authenticate", "")), err.read().decode()


def test_prometheus_scrapes_over_https_with_basic_auth(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    hashed = bcrypt.hashpw(b"scrape-secret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    context = ssl.create_default_context(cafile=str(cert))

    with run_exporter(["--simulate", "--web.config.file", str(web)], scheme="https") as url:
        status, challenge, _ = get(url + "/metrics", context)
        assert status == 401 and challenge.startswith("Basic")
        assert get(url + "/metrics", context, basic("prometheus", "wrong"))[0] == 401
        assert get(url + "/healthz", context)[0] == 200  # probes need no credentials

        port = url.rsplit(":", 1)[1]
        config = f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: gpu-exporter
    scheme: https
    tls_config: {{ca_file: {cert}}}
    basic_auth: {{username: prometheus, password: scrape-secret}}
    static_configs: [{{targets: ["127.0.0.1:{port}"], labels: {{node: test-node}}}}]
  - job_name: gpu-exporter-wrong-password
    scheme: https
    tls_config: {{ca_file: {cert}}}
    basic_auth: {{username: prometheus, password: nope}}
    static_configs: [{{targets: ["127.0.0.1:{port}"], labels: {{node: test-node}}}}]
"""
        with run_prometheus(config) as prom:
            def scraped() -> bool:
                ups = {r["metric"]["job"]: r["value"][1] for r in promql(prom, "up")}
                return ups.get("gpu-exporter") == "1" and ups.get("gpu-exporter-wrong-password") == "0"

            wait_until(scraped, 30, what="Prometheus to scrape over HTTPS (and fail with the wrong password)")
            wait_until(lambda: promql(prom, 'gpu_info{job="gpu-exporter",node="test-node"}'), 15,
                       what="GPU series in Prometheus")

            def failures_counted() -> float:
                result = promql(prom, 'gpu_exporter_http_auth_failures_total{job="gpu-exporter"}')
                return float(result[0]["value"][1]) if result else 0.0

            # Two wrong requests above, plus one per scrape of the wrong-password job.
            assert wait_until(lambda: failures_counted() >= 3, 15, what="auth failures counted") is True
            _client_commands_behind_tls_and_auth(tmp_path, url, prom, cert, key)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_exporter", *args], env=exporter_env(env), capture_output=True,
                          text=True, timeout=60, check=False)


@contextlib.contextmanager
def auth_proxy(upstream: str, cert: Path, key: Path, client_ca: Path, token: str) -> Iterator[str]:
    """An HTTPS front of ``upstream`` as Mimir, Thanos or AMP gateways are: it wants a client certificate signed
    by ``client_ca`` and ``Authorization: Bearer <token>`` (401 otherwise), then forwards the GET."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != f"Bearer {token}":
                self.send_response(401)
                self.send_header("WWW-Authenticate", "Bearer")
                self.end_headers()
                return
            with urllib.request.urlopen(upstream + self.path, timeout=10) as resp:
                body = resp.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=str(client_ca))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _client_commands_behind_tls_and_auth(tmp_path: Path, exporter_url: str, prom: str, cert: Path, key: Path) -> None:
    """query, diagnose --url, diagnose --prometheus-url and report take one set of connection flags: a CA file,
    basic auth from --username/--password-file, a bearer token from a file or $GPU_EXPORTER_BEARER_TOKEN and a
    client certificate."""
    (tmp_path / "password").write_text("scrape-secret\n")
    (tmp_path / "wrong").write_text("nope\n")
    (tmp_path / "token").write_text("t0ken\n")
    client_cert, client_key = self_signed(tmp_path, "client")
    basic_flags = ["--ca-file", str(cert), "--username", "prometheus", "--password-file", str(tmp_path / "password")]
    query = cli("query", "--url", exporter_url, *basic_flags, "--query-gpu=index", "--format=csv,noheader", "-i", "0")
    assert (query.returncode, query.stdout) == (0, "0\n"), query.stderr
    refused = cli("query", "--url", exporter_url, *basic_flags[:4], "--password-file", str(tmp_path / "wrong"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "answered HTTP 401 Unauthorized: the credentials were refused: give --username" in refused.stderr
    node = cli("diagnose", "--url", exporter_url, *basic_flags, "--window", "1s", "--output", "json")
    assert node.returncode in (0, 1) and len(json.loads(node.stdout)["gpus"]) == 4, node.stderr

    with auth_proxy(prom, cert, key, client_cert, "t0ken") as gateway:
        tls = ["--ca-file", str(cert), "--cert-file", str(client_cert), "--key-file", str(client_key)]
        fleet = cli("diagnose", "--prometheus-url", gateway, *tls, "--bearer-token-file", str(tmp_path / "token"),
                    "--window", "5s", "--output", "json")
        assert fleet.returncode in (0, 1) and len(json.loads(fleet.stdout)["gpus"]) == 4, fleet.stderr
        # The token from the environment passes the gateway: Prometheus itself then answers (no such run).
        report = cli("report", "--prometheus-url", gateway, *tls, "--run", "nosuch",
                     env={"GPU_EXPORTER_BEARER_TOKEN": "t0ken"})
        assert report.returncode == 2 and "holds no training run 'nosuch'" in report.stderr, report.stderr
        no_token = cli("report", "--prometheus-url", gateway, *tls, "--run", "nosuch")
        assert no_token.returncode == 2, no_token.stderr
        assert "answered HTTP 401 Unauthorized: it needs credentials: give --username with --password-file, or " \
               "--bearer-token-file" in no_token.stderr
        no_cert = cli("diagnose", "--prometheus-url", gateway, "--ca-file", str(cert), "--window", "5s",
                      env={"GPU_EXPORTER_BEARER_TOKEN": "t0ken"})
        assert no_cert.returncode == 2 and no_cert.stderr.count("\n") == 1, no_cert.stderr
        assert "client certificate (--cert-file, --key-file)" in no_cert.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("ingest_flags", "warned"), [
    ([], True), (["--ingest.enabled", "false"], False), (["--ingest.token-file", "TOKEN"], False)])
def test_basic_auth_with_an_open_ingest_is_warned_about(tmp_path: Path, ingest_flags: list[str],
                                                        warned: bool) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{bcrypt.hashpw(b'pw', bcrypt.gensalt(4)).decode()}'\n")
    (tmp_path / "token").write_text("s3cret\n")
    flags = [str(tmp_path / "token") if flag == "TOKEN" else flag for flag in ingest_flags]
    with exporter("--web.config.file", str(web), *flags, tmp_path=tmp_path) as running:
        log = running.log.read_text()
    assert ("training ingest (POST /api/v1/training) accepts pushes from anyone: set ingest.token_file"
            in log) is warned, log


@pytest.mark.slow
def test_sigterm_ends_a_start_that_hangs(tmp_path: Path) -> None:
    """A start stuck in a slow step (here: reading a web config FIFO nobody writes) still obeys SIGTERM."""
    fifo = tmp_path / "web.yml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "gpu_exporter", "--simulate", "--web.config.file", str(fifo),
                             "--web.listen-address", f"127.0.0.1:{free_port()}"], env=exporter_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    writer = -1
    try:
        def reader_waits() -> bool:
            nonlocal writer
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds once the exporter opened it
            except OSError as err:
                if err.errno != errno.ENXIO:
                    raise
                return False
            return True

        wait_until(reader_waits, 30, interval=0.05, what="the exporter to open its web config")
        proc.send_signal(signal.SIGTERM)  # it now blocks reading, since the writer stays open and silent
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        if writer >= 0:
            os.close(writer)
        proc.kill()
        proc.wait()
