"""The wire contract between the training library and the exporter's ingest endpoint.

The library uses all of these; the exporter's ingest (gpu_exporter.ingest) imports
SCHEMA_VERSION and check_label, so the schema version and the label charset cannot drift
apart. The HTTP server (gpu_exporter.server) imports its ingest route, INGEST_PATH, from here too;
tests/test_training_load.py checks that they are one. Example::

    >>> from gpu_exporter.training.protocol import LABEL_RE
    >>> bool(LABEL_RE.fullmatch("resnet50-lr3e-4"))
    True
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable

SCHEMA_VERSION = 1
"""Value of the ``version`` field of every snapshot."""

INGEST_PATH = "/api/v1/training"
"""Path on the exporter that takes snapshots (HTTP POST, ``Content-Type: application/json``)."""

DEFAULT_URL = "http://127.0.0.1:9445"
"""Exporter base URL used when neither ``url=`` nor ``GPU_EXPORTER_URL`` is given."""


def normalize_url(text: str, default_path: str = "", what: str = "exporter") -> str:
    """``HOST:PORT`` or ``http(s)://[USER:PASSWORD@]HOST:PORT[/PATH]`` as a full URL, ``default_path`` when it has
    no path (a trailing ``/`` is no path). The one URL rule of the training library (``GPU_EXPORTER_URL``,
    ``url=``) and the CLI (``--url``, ``--prometheus-url``). Raises ValueError with one sentence.

    >>> normalize_url("localhost:9445"), normalize_url("https://node7:9445/", "/metrics")
    ('http://localhost:9445', 'https://node7:9445/metrics')
    """
    raw = text.strip()
    candidate = raw if "://" in raw else f"http://{raw}"
    try:
        parts = urllib.parse.urlsplit(candidate)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid:
        raise ValueError(f"{text!r} is not a valid {what} URL: use http://HOST:PORT")
    path = parts.path.rstrip("/") or default_path
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


DATA = "data"
"""The phase of time blocked waiting for the next batch (``run.data(loader)``; cause M1)."""

COMPUTE = "compute"
"""The phase of GPU work: forward, backward, the optimizer's update."""

METRICS = "metrics"
"""The phase of CPU work in the step that is not GPU work: metrics, logging, evaluation (cause M2)."""

CHECKPOINT = "checkpoint"
"""The phase of writing checkpoints (cause CK)."""

COMMUNICATION = "communication"
"""The phase of time spent in collectives (all-reduce, all-gather, ..., barrier); the straggler cause reads it."""

STANDARD_PHASES = (DATA, COMPUTE, METRICS, CHECKPOINT, COMMUNICATION)
"""Phases every run reports, even at zero seconds. ``communication`` is the time spent in
torch.distributed collectives (gpu_exporter.training.distributed measures it)."""

MAX_WORLD_SIZE = 1 << 20
"""Largest ``world_size`` a snapshot may carry (ranks of one distributed run)."""

OTHER = "other"
"""The phase that collects time spent outside every named phase, so phases add up to wall time."""

PHASE_ORDER = (*STANDARD_PHASES, OTHER)
"""The order phases are listed in wherever they are shown (status page, diagnose): the standard ones, then ``other``."""


def phase_order(names: Iterable[str]) -> list[str]:
    """``names`` in :data:`PHASE_ORDER`, custom phases after it in alphabetical order.

    >>> phase_order(["other", "warmup", "compute", "data", "callbacks"])
    ['data', 'compute', 'other', 'callbacks', 'warmup']
    """
    given = set(names)
    return [p for p in PHASE_ORDER if p in given] + sorted(given.difference(PHASE_ORDER))

LABEL_CHARS = "A-Za-z0-9_.:/@+-"
LABEL_RE = re.compile(f"[{LABEL_CHARS}]+")
"""Characters allowed in run names, ranks, UUIDs and phase names (one or more)."""

DEFAULT_MAX_CUSTOM_PHASES = 8
"""Custom phases a run may add beside the standard ones (the exporter caps phases per run too)."""

MAX_LABEL_LENGTH = 128
"""Longest run name, rank or phase name the library accepts (the exporter's default limit)."""


def check_label(kind: str, value: str, max_length: int = MAX_LABEL_LENGTH) -> str | None:
    """Return why ``value`` is not a valid label value, or None when it is.

    >>> check_label("run", "bad name")
    "run 'bad name' may only contain A-Za-z0-9_.:/@+-"
    """
    if not value:
        return f"{kind} must not be empty"
    if len(value) > max_length:
        return f"{kind} is {len(value)} characters long; the limit is {max_length}"
    if not LABEL_RE.fullmatch(value):
        return f"{kind} {value[:40]!r} may only contain {LABEL_CHARS}"
    return None


_NOT_LABEL = re.compile(f"[^{LABEL_CHARS}]")


def to_label(text: str) -> str:
    """``text`` in the label charset (any other character becomes ``_``), cut to :data:`MAX_LABEL_LENGTH`."""
    return _NOT_LABEL.sub("_", text)[:MAX_LABEL_LENGTH]

CONTEXT_FIELDS: dict[str, str] = {
    "num_workers": "count", "pin_memory": "bool", "prefetch_factor": "count", "persistent_workers": "bool",
    "loader_batch_size": "count", "cpu_cores": "number", "gpu_memory_used_bytes": "number",
    "gpu_memory_total_bytes": "number", "allocator_peak_bytes": "number",
}
"""Fields of a snapshot's optional ``context`` object (training/context.py) and their kinds: every
field is optional; ``count`` a whole number >= 0, ``bool`` true/false, ``number`` a finite number >= 0.
The exporter (gpu_exporter.ingest) validates them and exports them as gauges (verdict.remedies.GAUGES)."""

MAX_TAGS = 8
"""Most user tags one run may carry (``training.start(tags=...)``, ``$GPU_EXPORTER_TAGS``)."""

MAX_TAG_KEY_LENGTH = 32
"""Longest tag key; the exporter exports a tag as the label ``tag_<key>`` of gpu_training_run_info."""

MAX_TAG_VALUE_LENGTH = 64
"""Longest tag value (label charset :data:`LABEL_CHARS`)."""

TAG_KEY_RE = re.compile(r"[a-z][a-z0-9_]*")
"""Tag keys: lower case letters, digits and ``_``, starting with a letter (a Prometheus label name's tail)."""

TAG_LABEL_PREFIX = "tag_"
"""Prefix of the labels that carry a run's tags on gpu_training_run_info (``team`` -> ``tag_team``)."""


def check_tags(tags: object) -> str | None:
    """Return why ``tags`` is not a valid tag object (str -> str, bounded), or None when it is.

    The library checks them at ``training.start``; the exporter's ingest checks them again.

    >>> check_tags({"team": "vision", "git": "3f2a1c9"}) is None
    True
    >>> check_tags({"Team": "x"})
    "tag key 'Team' may only contain a-z, 0-9 and _, starting with a letter, up to 32 characters"
    """
    if not isinstance(tags, dict):
        return "tags must be an object of key -> value strings"
    if len(tags) > MAX_TAGS:
        return f"{len(tags)} tags exceed the limit of {MAX_TAGS}"
    for key, value in tags.items():
        if not isinstance(key, str) or not TAG_KEY_RE.fullmatch(key) or len(key) > MAX_TAG_KEY_LENGTH:
            return (f"tag key {str(key)[:40]!r} may only contain a-z, 0-9 and _, starting with a letter, "
                    f"up to {MAX_TAG_KEY_LENGTH} characters")
        if not isinstance(value, str):
            return f"tag {key} must be a string, not {type(value).__name__}"
        problem = check_label(f"tag {key}", value, MAX_TAG_VALUE_LENGTH)
        if problem is not None:
            return problem
    return None


CALLBACK_PHASE = "callbacks"
"""The phase of the job's own callback hooks that write no checkpoint (training/callbacks.py; cause CB)."""

CALLBACK_PHASES = (CHECKPOINT, CALLBACK_PHASE, OTHER)
"""The phases a callback hook is counted as: ``checkpoint`` when it writes one, else :data:`CALLBACK_PHASE`
(``other`` when the run has no room for that custom phase)."""

MAX_CALLBACKS = 3
"""Most hooks a snapshot's ``callbacks`` field lists (the biggest by seconds); the exporter exports the first."""


def check_callbacks(doc: object, max_length: int = MAX_LABEL_LENGTH) -> str | None:
    """Return why ``doc`` is not a valid ``callbacks`` field, or None when it is: a list of at most
    :data:`MAX_CALLBACKS` objects ``{"name": label, "seconds": number >= 0, "phase": one of CALLBACK_PHASES}``.

    >>> check_callbacks([{"name": "SaveEvery.on_step_end", "seconds": 1.5, "phase": "checkpoint"}]) is None
    True
    >>> check_callbacks([{"name": "a b", "seconds": 1, "phase": "callbacks"}])
    "callback 'a b' may only contain A-Za-z0-9_.:/@+-"
    """
    return _check_items(doc, "callbacks", "callback", MAX_CALLBACKS, max_length, CALLBACK_PHASES)


CODE_PARTS = ("torch", "framework", "host")
"""The classes of the stack sampler's samples (training/sampler.py), the number fields of a snapshot's ``code``:
seconds the training thread ran torch's code, the framework's own (Lightning, Transformers, accelerate; cause FO)
and the job's own (host work in the step; cause HW)."""

MAX_CODE_FUNCTIONS = 3
"""Most functions of the job's own code a snapshot's ``code`` lists (the biggest); the exporter exports the first."""


def check_code(doc: object, max_length: int = MAX_LABEL_LENGTH) -> str | None:
    """Return why ``doc`` is not a valid ``code`` field, or None when it is: an object with a number >= 0 for
    each of :data:`CODE_PARTS` and ``functions``, a list of at most :data:`MAX_CODE_FUNCTIONS` objects
    ``{"name": label, "seconds": number >= 0}``.

    >>> check_code({"torch": 2.0, "framework": 0.0, "host": 0.5, "functions": [{"name": "a.py:3:f", "seconds": 0.5}]})
    >>> check_code({"torch": -1, "framework": 0, "host": 0, "functions": []})
    'code torch seconds must be a finite number >= 0'
    """
    if not isinstance(doc, dict):
        return "code must be an object"
    for part in CODE_PARTS:
        if not _is_seconds(doc.get(part)):
            return f"code {part} seconds must be a finite number >= 0"
    return _check_items(doc.get("functions"), "code functions", "function", MAX_CODE_FUNCTIONS, max_length)


def _is_seconds(value: object) -> bool:
    """A finite number >= 0 (a bool is no number here)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 <= value < float("inf")


def _check_items(items: object, field: str, kind: str, most: int, max_length: int,
                 phases: tuple[str, ...] | None = None) -> str | None:
    """Why ``items`` is not a list of at most ``most`` objects ``{"name": label, "seconds": number >= 0}`` (each
    with a ``"phase"`` of ``phases`` too, when given), or None; ``field`` and ``kind`` name them in the reason."""
    if not isinstance(items, list) or len(items) > most:
        return f"{field} must be a list of at most {most} objects"
    for item in items:
        if not isinstance(item, dict):
            return f"{field} must be a list of objects"
        name = item.get("name")
        problem = check_label(kind, name, max_length) if isinstance(name, str) else f"{kind} name must be text"
        if problem is not None:
            return problem
        if not _is_seconds(item.get("seconds")):
            return f"{kind} {name} seconds must be a finite number >= 0"
        if phases is not None and item.get("phase") not in phases:
            return f"{kind} {name} phase must be one of {', '.join(phases)}"
    return None
