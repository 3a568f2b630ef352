"""TLS and basic auth for the HTTP endpoints, from an exporter-toolkit web config file.

The file has the format of node_exporter's ``--web.config.file``, so one file serves both::

    tls_server_config:
      cert_file: server.crt          # relative paths resolve against the config file's folder
      key_file: server.key
    basic_auth_users:
      prometheus: $2b$12$...         # bcrypt hash, e.g. from `htpasswd -nBC 12 prometheus`

Example::

    web = load_web_config("/etc/gpu-exporter/web.yml")
    context = web.ssl_context()                 # None when the file has no tls_server_config
    web.check_auth(request.headers.get("Authorization"))
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpu_exporter import yamlfile
from gpu_exporter.yamlfile import YamlMap

log = logging.getLogger(__name__)

_TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS_IGNORED = {"cipher_suites", "curve_preferences"}  # OpenSSL's defaults apply; warned about
_TLS_UNSUPPORTED = {"client_allowed_sans": "restrict clients with client_ca_file instead",
                    "cert": "put the certificate in a file and use cert_file",
                    "key": "put the key in a file and use key_file",
                    "client_ca": "put the CA certificates in a file and use client_ca_file"}
_HTTP_KEYS = {"http2", "headers"}
_HEADERS = {"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
            "Strict-Transport-Security"}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_VERSIONS_NOT_HONOURED = {"TLS10", "TLS11"}  # exporter-toolkit accepts them; OpenSSL here refuses them
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
                "RequireAnyClientCert": ssl.CERT_NONE,  # refused when the file is read
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
"""Every client_auth_type, and the verify mode each gets."""
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
BCRYPT_MIN_COST, BCRYPT_MAX_COST = 4, 14
"""Accepted bcrypt costs: cost 14 takes about a second per check, cost 31 days."""
_CACHE_SIZE = 256


class WebConfigError(ValueError):
    """The web config file is unreadable or invalid; the message is one line naming the key."""


@dataclass(frozen=True)
class TLSServerConfig:
    """The ``tls_server_config`` section with file paths already made absolute."""

    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None
    prefer_server_cipher_suites: bool = True


@dataclass
class WebConfig:
    """What a web config file asks for; an empty file means plain HTTP without auth.

    >>> WebConfig().check_auth(None)
    True
    """

    tls: TLSServerConfig | None = None
    basic_auth_users: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    # Checked for unknown users, so that a wrong user name costs as much time as a wrong password.
    dummy_hash: bytes = field(default=b"", repr=False)
    _cache: OrderedDict[bytes, None] = field(default_factory=OrderedDict, repr=False)
    _cache_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server-side SSL context for ``socket`` wrapping, or None without ``tls_server_config``.

        Raises WebConfigError when a certificate or key cannot be loaded.
        """
        tls = self.tls
        if tls is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _VERSIONS[tls.min_version]
        if tls.max_version is not None:
            context.maximum_version = _VERSIONS[tls.max_version]
        if tls.prefer_server_cipher_suites:
            context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        try:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (OSError, ssl.SSLError) as err:
            raise WebConfigError(f"tls_server_config: cannot load cert_file {tls.cert_file} with key_file "
                                 f"{tls.key_file}: {_reason(err)}") from None
        if tls.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=str(tls.client_ca_file))
            except (OSError, ssl.SSLError) as err:
                raise WebConfigError(f"tls_server_config: cannot load client_ca_file "
                                     f"{tls.client_ca_file}: {_reason(err)}") from None
        context.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
        return context

    def check_auth(self, authorization_header: str | None) -> bool:
        """True when basic auth is off, or the ``Authorization: Basic ...`` header names a user and password.

        Successful checks are cached (by a SHA-256 of user, password and hash), because bcrypt costs
        tens of milliseconds per call and Prometheus sends the same credentials every scrape.
        """
        if not self.basic_auth_users:
            return True
        credentials = _parse_basic(authorization_header)
        if credentials is None:
            return False
        user, password = credentials
        stored = self.basic_auth_users.get(user)
        hashed = stored.encode() if stored is not None else self.dummy_hash
        key = hashlib.sha256(b"\0".join((user.encode(), password, hashed))).digest()
        with self._cache_lock:
            if key in self._cache and stored is not None:
                self._cache.move_to_end(key)
                return True
        import bcrypt

        try:
            ok = bool(bcrypt.checkpw(password, hashed))
        except ValueError:
            ok = False
        if not ok or stored is None:
            return False
        with self._cache_lock:
            self._cache[key] = None
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return True


def _parse_basic(header: str | None) -> tuple[str, bytes] | None:
    scheme, _, encoded = (header or "").strip().partition(" ")
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        return (user.decode(), password) if sep and scheme.lower() == "basic" else None
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def _reason(err: BaseException) -> str:
    return str(getattr(err, "strerror", None) or getattr(err, "reason", None) or err)


def _where(section: dict[str, Any], key: str, source: str) -> str:
    """``file:line`` of ``key`` in ``section`` (the file alone when the line is unknown)."""
    return section.where(key) if isinstance(section, YamlMap) else source


def _mapping(parent: dict[str, Any], key: str, name: str, source: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{_where(parent, key, source)}: {name} must be a mapping, got {type(value).__name__}")
    return value


def _unknown(section: dict[str, Any], allowed: set[str], prefix: str, source: str) -> None:
    for key in section:
        if key not in allowed:
            raise WebConfigError(f"{_where(section, key, source)}: unknown key {prefix}{key!s} "
                                 f"(allowed: {', '.join(sorted(allowed))})")


def _path(section: dict[str, Any], key: str, base: Path, source: str) -> Path:
    value = section[key]
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{_where(section, key, source)}: tls_server_config.{key} must be a non-empty file path")
    path = Path(value)
    return path if path.is_absolute() else base / path


def _parse_tls(section: dict[str, Any], base: Path, source: str) -> TLSServerConfig:
    def fail(key: str, message: str) -> WebConfigError:
        return WebConfigError(f"{_where(section, key, source)}: tls_server_config.{message}")

    known = {f.name for f in fields(TLSServerConfig)} | _TLS_IGNORED | _TLS_UNSUPPORTED.keys()  # honoured or not
    _unknown(section, known, "tls_server_config.", source)
    for key, hint in _TLS_UNSUPPORTED.items():
        if section.get(key):
            raise fail(key, f"{key} is not supported by gpu-exporter: {hint}")
    for key in _TLS_IGNORED & section.keys():
        log.warning("web config: tls_server_config.%s is ignored; OpenSSL's defaults apply", key)
    if "cert_file" not in section or "key_file" not in section:
        raise WebConfigError(f"{source}: tls_server_config needs both cert_file and key_file")
    client_auth = section.get("client_auth_type") or "NoClientCert"
    if client_auth not in _CLIENT_AUTH:
        raise fail("client_auth_type", f"client_auth_type {client_auth!r} is invalid "
                                       f"(one of: {', '.join(sorted(_CLIENT_AUTH))})")
    if client_auth == "RequireAnyClientCert":
        raise fail("client_auth_type", "client_auth_type RequireAnyClientCert is not supported by "
                                       "gpu-exporter: use RequireAndVerifyClientCert with client_ca_file")
    ca = section.get("client_ca_file")
    if client_auth != "NoClientCert" and not ca:
        raise fail("client_auth_type", f"client_auth_type {client_auth} needs client_ca_file")
    versions: dict[str, str | None] = {}
    for key, default in (("min_version", "TLS12"), ("max_version", None)):
        version = section.get(key) or default
        if version in _VERSIONS_NOT_HONOURED:
            raise fail(key, f"{key} {version} is not honoured: gpu-exporter serves TLS 1.2 and 1.3 only, "
                            "so use TLS12 or TLS13")
        if version is not None and version not in _VERSIONS:
            raise fail(key, f"{key} {version!r} is invalid (one of: {', '.join(_VERSIONS)})")
        versions[key] = version
    low, high = str(versions["min_version"]), versions["max_version"]
    if high is not None and _VERSIONS[low] > _VERSIONS[high]:
        raise fail("max_version", f"min_version {low} is above max_version {high}, so no connection could "
                                  "agree on a version")
    prefer = section.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise fail("prefer_server_cipher_suites", "prefer_server_cipher_suites must be true or false")
    return TLSServerConfig(_path(section, "cert_file", base, source), _path(section, "key_file", base, source),
                           client_auth, _path(section, "client_ca_file", base, source) if ca else None, low, high,
                           prefer)


def _parse_users(section: dict[str, Any], source: str) -> tuple[dict[str, str], bytes]:
    """(user -> bcrypt hash, a dummy hash of the same cost for unknown users)."""
    users: dict[str, str] = {}
    for user, hashed in section.items():
        where = _where(section, user, source)
        if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT_PREFIXES) or len(hashed) != 60:
            raise WebConfigError(f"{where}: basic_auth_users.{user} must be a bcrypt hash ($2b$...), "
                                 "e.g. from `htpasswd -nBC 12 USER`")
        if ":" in str(user):
            raise WebConfigError(f"{where}: basic_auth_users: user name {user!r} must not contain ':'")
        cost = int(hashed[4:6]) if hashed[4:6].isdigit() else 0
        if not BCRYPT_MIN_COST <= cost <= BCRYPT_MAX_COST:
            raise WebConfigError(f"{where}: basic_auth_users.{user} has bcrypt cost {hashed[4:6]}, outside "
                                 f"{BCRYPT_MIN_COST}-{BCRYPT_MAX_COST} (each step doubles the CPU time of "
                                 "every login); hash it again with `htpasswd -nBC 12 USER`")
        users[str(user)] = hashed
    if not users:
        return users, b""
    try:
        import bcrypt
    except ImportError:
        raise WebConfigError(f"{source}: basic_auth_users needs the bcrypt package: install "
                             "'gpu-utilization-exporter[tls]'") from None
    cost = max(int(h[4:6]) for h in users.values())
    return users, bytes(bcrypt.hashpw(b"unknown user", bcrypt.gensalt(rounds=cost)))


def _parse_http(section: dict[str, Any], source: str) -> dict[str, str]:
    _unknown(section, _HTTP_KEYS, "http_server_config.", source)
    if "http2" in section:
        log.warning("web config: http_server_config.http2 is ignored; gpu-exporter serves HTTP/1.1")
    headers = _mapping(section, "headers", "http_server_config.headers", source)
    for name, value in headers.items():
        if name not in _HEADERS:
            raise WebConfigError(f"{_where(headers, name, source)}: unknown key http_server_config.headers.{name} "
                                 f"(allowed: {', '.join(sorted(_HEADERS))})")
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise WebConfigError(f"{_where(headers, name, source)}: http_server_config.headers.{name} "
                                 "must be a one-line string")
    return {str(k): str(v) for k, v in headers.items()}


def parse_web_config(text: str, base: Path, source: str = "web config") -> WebConfig:
    """Parse web config YAML; relative file paths resolve against ``base``; errors start with ``source:line``.

    >>> parse_web_config("", Path(".")).tls is None
    True
    """
    try:
        data = yamlfile.parse(text, source)
    except yamlfile.YamlError as err:
        raise WebConfigError(str(err)) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise WebConfigError(f"{source}: the web config must be a mapping, got {type(data).__name__}")
    _unknown(data, _TOP_KEYS, "", source)
    tls_section = _mapping(data, "tls_server_config", "tls_server_config", source)
    users, dummy = _parse_users(_mapping(data, "basic_auth_users", "basic_auth_users", source), source)
    return WebConfig(
        tls=_parse_tls(tls_section, base, source) if tls_section else None,
        basic_auth_users=users, dummy_hash=dummy,
        headers=_parse_http(_mapping(data, "http_server_config", "http_server_config", source), source))


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check a web config file, including that its certificate and key load.

    Raises WebConfigError with one line that names the file (and line) and the problem.
    """
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as err:
        raise WebConfigError(f"cannot read web config file {file}: {_reason(err)}") from None
    config = parse_web_config(text, file.resolve().parent, str(file))
    try:
        config.ssl_context()
    except WebConfigError as err:
        raise WebConfigError(f"{file}: {err}") from None
    return config
