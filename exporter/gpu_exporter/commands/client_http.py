"""HTTP to exporters and Prometheus: one GET (or POST) with TLS and credentials, every failure one sentence.

:func:`fetch` is the one request every client source makes (:mod:`~gpu_exporter.commands.client_sources`,
:mod:`~gpu_exporter.commands.client_prometheus`); :class:`Connection` holds its TLS context and auth headers
(made from the command line by :func:`gpu_exporter.commands.client_cli.connection`). A failure is a
:class:`MetricsError` that says what went wrong and what to check.
"""

from __future__ import annotations

import base64
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from gpu_exporter.training import protocol


class MetricsError(Exception):
    """A source could not be read; ``str(err)`` is one sentence for the user."""


def normalize_url(text: str, default_path: str, what: str) -> str:
    """``host:port`` or ``http(s)://host:port[/path]`` as a full URL; ``default_path`` when none is given.

    The training library's rule (:func:`gpu_exporter.training.protocol.normalize_url`), so ``--url`` and
    ``GPU_EXPORTER_URL`` take the same URLs; a bad one is a MetricsError.

    >>> normalize_url("node7:9445", "/metrics", "exporter")
    'http://node7:9445/metrics'
    """
    try:
        return protocol.normalize_url(text, default_path, what)
    except ValueError as err:
        raise MetricsError(str(err)) from None


def tls_context(ca_file: str | None, insecure: bool, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext | None:
    """The TLS context for https URLs: the system CAs, ``ca_file``'s, or no verification (``insecure``);
    with ``cert_file`` (and ``key_file``) a client certificate too. None when nothing is set.

    >>> tls_context(None, False) is None
    True
    """
    if ca_file is None and not insecure and cert_file is None:
        return None
    if ca_file is not None and insecure:
        raise MetricsError("--ca-file and --insecure exclude each other: verify with a CA, or do not verify")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise MetricsError(f"cannot read the CA file {ca_file!r}: {_reason(err)}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as err:
            raise MetricsError(f"cannot load the client certificate {cert_file!r}"
                               f"{f' with the key {key_file!r}' if key_file else ''}: {_reason(err)}") from None
    return context


def _reason(err: OSError | ssl.SSLError) -> str:
    return str((err.reason if isinstance(err, ssl.SSLError) else err.strerror) or err)


def basic_auth(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass(frozen=True)
class Connection:
    """How a client command talks to one server: the TLS context (None: the defaults) and the auth headers."""

    context: ssl.SSLContext | None = None
    headers: dict[str, str] = field(default_factory=dict)


def fetch(url: str, what: str, timeout: float, conn: Connection | None = None, form: str | None = None) -> bytes:
    """GET ``url``, or POST ``form`` (URL-encoded) to it."""
    conn = conn or Connection()
    parts = urllib.parse.urlsplit(url)
    headers = {"Accept": "text/plain, application/json", **conn.headers}
    if form is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if parts.username is not None:
        headers["Authorization"] = basic_auth(urllib.parse.unquote(parts.username),
                                              urllib.parse.unquote(parts.password or ""))
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, ""))
    shown = urllib.parse.urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    try:
        request = urllib.request.Request(url, None if form is None else form.encode(), headers)
        with urllib.request.urlopen(request, timeout=timeout, context=conn.context) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as err:
        sent = "the credentials were refused" if "Authorization" in headers else "it needs credentials"
        hint = {401: f"{sent}: give --username with --password-file, or --bearer-token-file",
                403: "the credentials are not allowed to read this",
                404: f"check the path (the {what} serves {'/metrics' if what == 'exporter' else '/api/v1/'})"}
        raise MetricsError(f"the {what} at {shown} answered HTTP {err.code} {err.reason}"
                           f"{': ' + hint[err.code] if err.code in hint else ''}") from None
    except (urllib.error.URLError, TimeoutError) as err:
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(reason, ConnectionRefusedError):
            raise MetricsError(f"cannot connect to the {what} at {shown}: connection refused "
                               f"(is {'gpu-exporter' if what == 'exporter' else 'it'} running there?)") from None
        if isinstance(reason, socket.gaierror):
            raise MetricsError(f"cannot resolve the host {parts.hostname!r} of the {what} URL {shown}") from None
        if isinstance(reason, TimeoutError):
            raise MetricsError(f"the {what} at {shown} did not answer within {timeout:g} s") from None
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise MetricsError(f"the {what} at {shown} has a certificate this machine does not trust "
                               f"({reason.verify_message}): pass --ca-file with its CA, or --insecure") from None
        if isinstance(reason, ssl.SSLError):
            raise MetricsError(f"the TLS handshake with the {what} at {shown} failed ({reason.reason or reason}): "
                               "does it want a client certificate (--cert-file, --key-file)?") from None
        raise MetricsError(f"cannot reach the {what} at {shown}: {reason}") from None
    except ssl.SSLError as err:
        raise MetricsError(f"the TLS connection to the {what} at {shown} failed ({err.reason or err}): "
                           "does it want a client certificate (--cert-file, --key-file)?") from None
    except OSError as err:
        raise MetricsError(f"cannot reach the {what} at {shown}: {err.strerror or err}") from None
