"""Run identity: one run id per launch, shared by the ranks of one job, and the user's tags.

The problem: a run name says what a job is, not which launch it was. A nightly job reuses its name
every night, and every job without a name used to be named after its script (``train``), so the
exporter, Prometheus and ``gpu-exporter report`` could not tell two launches apart. Every run now
carries a run id (snapshot field ``run_id``, label ``run_id`` of ``gpu_training_run_info``), taken
from the first of these that is set (docs/training.md, "Run identity"):

1. ``run_id=`` of ``training.start`` (or the callbacks' and ``watch``'s options);
2. ``$GPU_EXPORTER_RUN_ID``: the operator's override (for example a Kubernetes Job's controller uid
   through the downward API);
3. ``$TORCHELASTIC_RUN_ID``, torchrun's rendezvous id, unless it is torchrun's default ``none``
   (``torchrun --standalone`` draws a fresh one per launch; every rank sees the same);
4. ``$SLURM_JOB_ID`` (``slurm-<id>``, ``-r<n>`` appended after a requeue: ``$SLURM_RESTART_COUNT``);
5. a launch id drawn once per process start (``launch-<12 hex digits>``; every run this process
   starts shares it). Ranks that are separate processes without torchrun (``mp.spawn``, ``mpirun``,
   a rank per container) each draw their own: give them one with ``$GPU_EXPORTER_RUN_ID``.

Tags (``tags=`` and ``$GPU_EXPORTER_TAGS="team=vision,user=ana"``; the argument wins per key) are
validated here and again by the exporter (training/protocol.py: at most 8, keys ``[a-z][a-z0-9_]*``
up to 32 characters, values in the label charset up to 64).

Standard library only. Example::

    >>> resolve_run_id("nightly-42", {})
    ('nightly-42', 'argument')
    >>> resolve_run_id(None, {"TORCHELASTIC_RUN_ID": "rdzv-7f3a"})
    ('rdzv-7f3a', 'TORCHELASTIC_RUN_ID')
    >>> resolve_tags({"team": "vision"}, {"GPU_EXPORTER_TAGS": "team=nlp,user=ana"})
    {'team': 'vision', 'user': 'ana'}
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping

from .protocol import MAX_LABEL_LENGTH, check_label, check_tags, to_label

RUN_ID_ENV = "GPU_EXPORTER_RUN_ID"
"""The operator's override of the run id (wins over torchrun's and Slurm's)."""
TAGS_ENV = "GPU_EXPORTER_TAGS"
"""Tags from the environment: ``key=value`` pairs separated by commas."""
TORCHRUN_DEFAULT = "none"
"""``$TORCHELASTIC_RUN_ID`` when torchrun was given no ``--rdzv-id`` (shared by every launch: not an id)."""

_launch_id: str | None = None
"""This process's launch id, drawn on first use (reset in a forked child: a new process, a new launch)."""

def check_labels(name: str, rank: str, uuid: str | None) -> None:
    """Raise ValueError (``training.start: ...``) unless the run name, the rank and a given uuid are valid labels.

    >>> check_labels("resnet50", "0", "")  # "" asks for no uuid
    """
    labels = [("run name", name, ""), ("rank", rank, " (set rank= or $RANK)")]
    if uuid:  # "" asks for no uuid
        labels.append(("uuid", uuid, ""))
    for kind, value, hint in labels:
        if (problem := check_label(kind, value)) is not None:
            raise ValueError(f"training.start: {problem}{hint}")


def resolve_run_id(given: str | None = None, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(run id, its source): see the module docstring for the order. ValueError on a bad ``given``.

    >>> resolve_run_id(None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "8812", "SLURM_RESTART_COUNT": "1"})
    ('slurm-8812-r1', 'SLURM_JOB_ID')
    >>> resolve_run_id(None, {})[0] == resolve_run_id(None, {})[0]  # one launch id per process
    True
    """
    if given is not None:
        if (problem := check_label("run_id", given)) is not None:
            raise ValueError(f"training.start: {problem}")
        return given, "argument"
    environ = os.environ if env is None else env
    if override := environ.get(RUN_ID_ENV, "").strip():  # not ours to refuse: made a label
        return to_label(override), RUN_ID_ENV
    torchrun = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if torchrun and torchrun != TORCHRUN_DEFAULT:
        return to_label(torchrun), "TORCHELASTIC_RUN_ID"
    if slurm := environ.get("SLURM_JOB_ID", "").strip():
        restarts = environ.get("SLURM_RESTART_COUNT", "0").strip()
        suffix = f"-r{restarts}" if restarts not in ("", "0") else ""
        return to_label(f"slurm-{slurm}{suffix}"), "SLURM_JOB_ID"
    global _launch_id
    if _launch_id is None:
        _launch_id = f"launch-{uuid.uuid4().hex[:12]}"
    return _launch_id, "launch"


def _new_process() -> None:
    """In a forked child: a process of its own draws its own launch id."""
    global _launch_id
    _launch_id = None


os.register_at_fork(after_in_child=_new_process)


def short_id(run_id: str) -> str:
    """The tail of ``run_id`` that a default run name carries: up to 12 characters.

    >>> short_id("launch-0123456789ab"), short_id("slurm-8812"), short_id("a4f0e6c2-1b2c-4d5e-8f90-123456789abc")
    ('0123456789ab', 'slurm-8812', '123456789abc')
    """
    return run_id.removeprefix("launch-")[-12:]


def default_run_name(stem: str, run_id: str) -> str:
    """The name of a run that was given none: the script's name, a dash and the run id's tail.

    >>> default_run_name("train", "launch-0123456789ab")
    'train-0123456789ab'
    """
    suffix = "-" + short_id(run_id)
    return stem[:MAX_LABEL_LENGTH - len(suffix)] + suffix


def parse_tags(text: str) -> dict[str, str]:
    """``"team=vision, user=ana"`` -> ``{"team": "vision", "user": "ana"}``; ValueError names a bad item.

    >>> parse_tags("team=vision, user=ana")
    {'team': 'vision', 'user': 'ana'}
    """
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"${TAGS_ENV}: {item.strip()[:40]!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def resolve_tags(given: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``$GPU_EXPORTER_TAGS`` updated by ``given``, validated; ValueError with one line on a bad tag.

    >>> resolve_tags({"team": "a b"}, {})
    Traceback (most recent call last):
    ...
    ValueError: training.start: tag team 'a b' may only contain A-Za-z0-9_.:/@+-
    """
    environ = os.environ if env is None else env
    try:
        tags = parse_tags(environ.get(TAGS_ENV, ""))
    except ValueError as err:
        raise ValueError(f"training.start: {err}") from None
    tags.update(given or {})
    if (problem := check_tags(tags)) is not None:
        raise ValueError(f"training.start: {problem}")
    return dict(sorted(tags.items()))
