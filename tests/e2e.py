"""Pieces the end-to-end tests share: the shipped rules shrunk for tests, the firing cause alerts,
the training jobs they run, and where they keep the real output the docs quote.

``fast_rules`` and ``shrink`` (tests/test_alerting_e2e.py) make the shipped rules fast; everything
else about the rules stays as shipped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from test_alerting_e2e import PROM, fast_rules
from test_query import run_cli

from testbed import exporter_env, promql, wait_until


def shipped_fast_rules() -> dict[str, str]:
    """``{"rules/<name>": text}`` of every shipped rules file, durations shrunk (for run_prometheus)."""
    return {f"rules/{p.name}": fast_rules(p) for p in sorted((PROM / "rules").glob("*.rules.yml"))}


def firing_causes(prom: str) -> dict[str, set[tuple[str, str]]]:
    """uuid -> {(alertname, cause)} of the firing cause alerts."""
    out: dict[str, set[tuple[str, str]]] = {}
    for r in promql(prom, 'ALERTS{alertstate="firing", cause!=""}'):
        out.setdefault(r["metric"]["uuid"], set()).add((r["metric"]["alertname"], r["metric"]["cause"]))
    return out


def wait_for_causes(prom: str, wanted: Mapping[str, set[tuple[str, str]]], seconds: float, what: str,
                    check: Callable[[], None] | None = None) -> None:
    """Wait until every uuid of ``wanted`` fires at least its (alertname, cause) pairs; ``check`` runs at every
    look. On time-out the error lists what fires, the phase shares and the utilization Prometheus sees."""
    def settled() -> bool:
        if check is not None:
            check()
        firing = firing_causes(prom)
        return all(firing.get(uuid, set()) >= alerts for uuid, alerts in wanted.items())
    try:
        wait_until(settled, seconds, interval=1.0, what=what)
    except TimeoutError as err:
        shares = [(r["metric"].get("run"), r["metric"].get("uuid"), r["metric"]["phase"], r["value"][1])
                  for r in promql(prom, "run:gpu_training_phase:share5m > 0.01")]
        util = [(r["metric"]["uuid"], r["value"][1]) for r in promql(prom, "gpu:gpu_utilization:avg5m")]
        raise AssertionError(f"{err}: firing {firing_causes(prom)}; shares {shares}; utilization {util}") from None


def run_clis(calls: Sequence[Sequence[str]], timeout: float = 60.0) -> list[subprocess.CompletedProcess[str]]:
    """``run_cli(*args)`` of each of ``calls`` at the same time, the results in the order of ``calls``.

    ``diagnose --url URL --window W`` reads the exporter twice, W seconds apart, and spends the time between
    asleep: run one after another, N of them take N x W; side by side, about W (each still reads its own two
    readings over its own window)."""
    if not calls:
        return []
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda args: run_cli(*args, timeout=timeout), calls))


def keep_output(variable: str, name: str, data: bytes | str) -> None:
    """Write ``data`` to ``$variable/name`` when that variable is set (the docs quote these files)."""
    folder = os.environ.get(variable)
    if not folder:
        return
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


@contextlib.contextmanager
def running_jobs(commands: Sequence[Sequence[str]], timeout: float = 60,
                 env: dict[str, str] | None = None) -> Iterator[list[subprocess.Popen[str]]]:
    """Start each command (the exporter's environment plus ``env``, stderr kept); afterwards stop them and require
    that each ended by itself (0) or by the SIGTERM sent here (-15), with its stderr in the message otherwise.

    Each job is a process group and the SIGTERM goes to the whole group: a job's own children (DDP ranks) end with
    it, where a rank left alone to its parent's death signal could block in a collective its peer had left."""
    jobs = [subprocess.Popen(list(c), env=exporter_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, start_new_session=True) for c in commands]
    try:
        yield jobs
    finally:
        for job in jobs:
            with contextlib.suppress(ProcessLookupError):  # the whole group has ended already
                os.killpg(job.pid, signal.SIGTERM)
        for job in jobs:
            _, err = job.communicate(timeout=timeout)
            assert job.returncode in (0, -15), err[-2000:]
