"""The exporter-toolkit web config: parsing, TLS contexts (real handshakes) and basic auth."""

from __future__ import annotations

import base64
import http.server
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
from gpu_exporter.web_config import WebConfig, WebConfigError, load_web_config, parse_web_config


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """Write a self-signed certificate for 127.0.0.1/localhost and its key; return (cert, key)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60)
    return cert, key


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    self_signed(d, "server")
    self_signed(d, "client")
    return d


HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def write(directory: Path, text: str) -> Path:
    path = directory / "web.yml"
    path.write_text(text)
    return path


@contextmanager
def https_server(context: ssl.SSLContext) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def client_context(certs: Path, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs / "server.crt"))
    if with_cert:
        ctx.load_cert_chain(str(certs / "client.crt"), str(certs / "client.key"))
    return ctx


def fetch(port: int, ctx: ssl.SSLContext) -> str:
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/", context=ctx, timeout=5) as resp:
        return str(resp.read().decode())


def test_empty_file_means_plain_http_without_auth(tmp_path: Path) -> None:
    web = load_web_config(write(tmp_path, ""))
    assert web.ssl_context() is None and web.check_auth(None) is True


def test_tls_with_relative_paths_serves_https(tmp_path: Path, certs: Path) -> None:
    (tmp_path / "tls").mkdir()
    for f in ("server.crt", "server.key"):
        (tmp_path / "tls" / f).write_bytes((certs / f).read_bytes())
    web = load_web_config(write(tmp_path, "tls_server_config:\n  cert_file: tls/server.crt\n"
                                          "  key_file: tls/server.key\n"))
    assert web.tls is not None and web.tls.cert_file == tmp_path / "tls" / "server.crt"
    context = web.ssl_context()
    assert context is not None and context.minimum_version == ssl.TLSVersion.TLSv1_2
    with https_server(context) as port:
        assert fetch(port, client_context(certs)) == "ok"


def test_min_version_tls13_refuses_a_tls12_client(tmp_path: Path, certs: Path) -> None:
    web = load_web_config(write(tmp_path, f"tls_server_config:\n  cert_file: {certs}/server.crt\n"
                                          f"  key_file: {certs}/server.key\n  min_version: TLS13\n"))
    context = web.ssl_context()
    assert context is not None
    old = client_context(certs)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with https_server(context) as port:
        assert fetch(port, client_context(certs)) == "ok"
        with pytest.raises(urllib.error.URLError):
            fetch(port, old)


def test_required_client_certificate(tmp_path: Path, certs: Path) -> None:
    web = load_web_config(write(tmp_path, f"""
tls_server_config:
  cert_file: {certs}/server.crt
  key_file: {certs}/server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {certs}/client.crt
"""))
    context = web.ssl_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    with https_server(context) as port:
        assert fetch(port, client_context(certs, with_cert=True)) == "ok"
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            fetch(port, client_context(certs))


def test_basic_auth_accepts_only_the_right_password(tmp_path: Path) -> None:
    web = load_web_config(write(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n"))
    assert web.check_auth(basic("prometheus", "s3cret")) is True
    assert web.check_auth(basic("prometheus", "wrong")) is False
    assert web.check_auth(basic("nobody", "s3cret")) is False
    no_colon = "Basic " + base64.b64encode(b"nocolon").decode()
    for header in (None, "", "Bearer abc", "Basic !!notbase64", no_colon):
        assert web.check_auth(header) is False
    assert web.dummy_hash.startswith(b"$2b$04$")  # unknown users pay the same bcrypt cost


def test_successful_checks_are_cached_and_failures_are_not(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    web = load_web_config(write(tmp_path, f"basic_auth_users:\n  prometheus: '{HASH}'\n"))
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return bool(real(password, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    for _ in range(3):
        assert web.check_auth(basic("prometheus", "s3cret"))
        assert not web.check_auth(basic("prometheus", "wrong"))
    assert calls.count(b"s3cret") == 1 and calls.count(b"wrong") == 3


def test_headers_are_kept(tmp_path: Path) -> None:
    web = load_web_config(write(tmp_path, "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"))
    assert web.headers == {"X-Frame-Options": "deny"}


@pytest.mark.parametrize(("text", "message"), [
    ("tls_server_config: {cert_file: a}\nbogus: 1\n", "unknown key bogus"),
    ("tls_server_config: {cert_file: a, key_file: b, ciphers: x}\n", "unknown key tls_server_config.ciphers"),
    ("http_server_config: {headers: {X-Powered-By: me}}\n",
     "unknown key http_server_config.headers.X-Powered-By"),
    ("http_server_config: {compress: true}\n", "unknown key http_server_config.compress"),
    ("tls_server_config: {cert_file: a}\n", "needs both cert_file and key_file"),
    ("tls_server_config: {cert_file: a, key_file: b, min_version: TLS9}\n", "min_version 'TLS9' is invalid"),
    ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAndVerifyClientCert}\n",
     "needs client_ca_file"),
    ("tls_server_config: {cert_file: a, key_file: b, client_allowed_sans: [x]}\n",
     "client_allowed_sans is not"),
    ("basic_auth_users: {alice: plaintext}\n", "basic_auth_users.alice must be a bcrypt hash"),
    ("basic_auth_users: [alice]\n", "basic_auth_users must be a mapping"),
    ("tls_server_config: [\n", "web config:2: invalid YAML"),
    ("- 1\n", "the web config must be a mapping"),
])
def test_bad_files_give_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(WebConfigError) as err:
        parse_web_config(text, tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("text", "message"), [
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n",
     "web config:4: tls_server_config.min_version TLS10 is not honoured: gpu-exporter serves TLS 1.2 and 1.3 "
     "only, so use TLS12 or TLS13"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  max_version: TLS11\n",
     "web config:4: tls_server_config.max_version TLS11 is not honoured"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n",
     "web config:5: tls_server_config.min_version TLS13 is above max_version TLS12, so no connection could "
     "agree on a version"),
    ("basic_auth_users:\n  alice: '" + HASH.replace("$04$", "$15$") + "'\n",
     "web config:2: basic_auth_users.alice has bcrypt cost 15, outside 4-14"),
    ("basic_auth_users:\n  alice: '" + HASH.replace("$04$", "$03$") + "'\n",
     "web config:2: basic_auth_users.alice has bcrypt cost 03, outside 4-14"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Frame-Options: sameorigin\n",
     "web config:4: key 'X-Frame-Options' is given twice (first on line 3)"),
])
def test_versions_and_costs_that_cannot_work_are_one_sentence_with_the_line(text: str, message: str) -> None:
    with pytest.raises(WebConfigError) as err:
        parse_web_config(text, Path("."))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert str(err.value).count(". ") == 0  # one sentence


@pytest.mark.slow  # a cost-14 bcrypt hash: seconds of CPU
def test_bcrypt_cost_14_is_the_highest_accepted() -> None:
    web = parse_web_config("basic_auth_users:\n  alice: '" + HASH.replace("$04$", "$14$") + "'\n", Path("."))
    assert web.dummy_hash.startswith(b"$2b$14$")


def test_missing_certificate_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n")
    with pytest.raises(WebConfigError, match=r"web.yml: tls_server_config: cannot load cert_file .*nope.crt"):
        load_web_config(path)
    with pytest.raises(WebConfigError, match="cannot read web config file"):
        load_web_config(tmp_path / "absent.yml")


def test_ignored_tls_settings_are_warned_about(tmp_path: Path, certs: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    text = (f"tls_server_config: {{cert_file: {certs}/server.crt, key_file: {certs}/server.key, "
            "cipher_suites: [TLS_AES_128_GCM_SHA256]}\n")
    web = parse_web_config(text, tmp_path)
    assert isinstance(web, WebConfig) and web.tls is not None
    assert "cipher_suites is ignored" in caplog.text
