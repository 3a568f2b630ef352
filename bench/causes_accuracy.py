"""``python -m bench.causes_accuracy [--update-docs] [--wave NAME ...]``: how often each path names the right cause.

Every injected bottleneck of bench/causes_cases.py (each cause of the cause table and the GPU-level causes read
from SM activity, in every shape of job it applies to: plain loops, Lightning, the Transformers Trainer, DDP) runs
as a job of the tests' loops on its own simulated GPU that does its own work (tests/async_loops.py,
tests/integration_loops.py, tests/cause_loops.py, tests/ddp_loops.py; docs/simulation.md). One exporter
(``--simulate``, one node with a GPU per case) and one real Prometheus with the shipped rules (durations shrunk
``--scale``-fold with the end-to-end tests' shrink, default 20: ``[5m]`` -> ``[15s]``, ``for: 10m`` -> ``30s``;
evaluated every second) serve every wave. The tests shrink 60-fold; a 5 s window is too short here: the exporter's
busy counter includes the device's work up to a lag that varies by about a second on a loaded machine, which moves a
5 s rate by 20% (a GPU 99.9% busy read 78-97% over 5 s windows and 97-98% over 30 s ones at load 9).

The jobs run in waves of similar cost (:data:`bench.causes_cases.waves`); each wave's jobs
start at once, and once every one of them has pushed (or ``--start-timeout`` passed) and ``--settle`` seconds
more, each case is judged once per path, at the same moment:

* ``alerts``: the cause alerts firing for the GPU in Prometheus (``ALERTS{alertstate="firing", cause!=""}``);
  several may fire on one GPU, each counts; none firing names "healthy";
* ``diagnose --url``: the exporter judged by diagnose over the shrunk 5 m window;
* ``diagnose --prometheus-url``: the recording rules judged by diagnose;
* ``report``: ``gpu-exporter report --run RUN --step S`` (a window of 4 steps, about the rules' shrunk 5 m), the verdict
  the GPU held longest over the run.

The raw results go to a JSON file; bench/causes_doc.py makes the document (precision and recall per cause and
path) from it. With ``--update-docs`` they are docs/accuracy.json and docs/accuracy.md, and the README's line is
regenerated; else a new temporary folder (printed). About 18 minutes on 2 cores (eight waves of about 2).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "tests", REPO / "exporter"):  # the tests' loops and rules (test modules), the package
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import test_alerting_e2e  # noqa: E402
from e2e import firing_causes, run_clis, shipped_fast_rules  # noqa: E402
from gpu_exporter import catalog  # noqa: E402

from bench import causes_doc  # noqa: E402
from bench.causes_cases import CAUSES, Case, Job, scenario, waves  # noqa: E402
from testbed import exporter_env, promql, run_exporter, run_prometheus, scrape_config  # noqa: E402

PATHS = ("alerts", "diagnose --url", "diagnose --prometheus-url", "report")
CHANNEL_ENV = "GPU_SIM_DEVICE_DIR"


def _say(message: str) -> None:
    print(f"causes_accuracy: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _started(jobs: Sequence[Job], exporter: str, tmp: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start every job of a wave (its own process group, stderr to a log); stop them all afterwards."""
    procs = []
    for i, job in enumerate(jobs):
        argv = [a.format(url=exporter, tmp=tmp) for a in job.argv]
        log = (tmp / f"job-{job.cases[0].run}-{i}.log").open("wb")
        procs.append(subprocess.Popen(argv, env=exporter_env({CHANNEL_ENV: str(tmp / "channel"), **job.env}),
                                      stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True))
        log.close()
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _pushing(prom: str) -> set[str]:
    """The GPUs whose runs Prometheus has phase timers of."""
    phases = catalog.GPU_TRAINING_PHASE_SECONDS_TOTAL.name
    return {r["metric"].get("uuid", "") for r in promql(prom, f"count by (uuid) ({phases})")}


def _named_by_alerts(uuid: str, firing: dict[str, set[tuple[str, str]]]) -> list[str]:
    return sorted({cause for _, cause in firing.get(uuid, set())})


TRUTH_SECONDS = 20.0
"""The device's own account is read over this many seconds before the judgement."""


def device_truth(channel: Path, uuid: str, t0: float, t1: float) -> dict[str, float] | None:
    """The share of ``[t0, t1]`` (monotonic seconds) the GPU's device was busy, and its SM, tensor and DRAM activity,
    read from the device's channel file itself (``START END BUSY SM TENSOR DRAM``, gpu_exporter.simulate.channel),
    not through the exporter; None when the device wrote nothing.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "GPU-x.busy").write_text("0 2 1 0.5 0 0.2\\n2 4\\n")
    >>> device_truth(d, "GPU-x", 1.0, 3.0)
    {'busy': 0.75, 'sm': 0.575, 'tensor': 0.3, 'dram': 0.2}
    """
    path = channel / f"{uuid}.busy"
    if not path.exists():
        return None
    total = [0.0, 0.0, 0.0, 0.0]
    for line in path.read_text().splitlines():
        fields = [float(x) for x in line.split()]
        if len(fields) < 2 or fields[1] <= fields[0]:
            continue
        start, end = fields[0], fields[1]
        span = end - start
        busy = fields[2] if len(fields) > 2 else span
        shares = fields[3:6] if len(fields) >= 6 else [busy * 0.9, busy * 0.6, busy * 0.3]
        part = max(0.0, min(end, t1) - max(start, t0)) / span
        for i, value in enumerate((busy, *shares)):
            total[i] += part * value
    return {k: round(v / (t1 - t0), 4) for k, v in zip(("busy", "sm", "tensor", "dram"), total, strict=True)}


def _verdicts(result: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, float | None]]:
    """uuid -> (verdict, utilization) of a ``diagnose --output json`` (empty when it failed: every case then reads
    "no answer")."""
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError:
        _say(f"diagnose gave no JSON (exit {result.returncode}): {result.stderr.strip()[-300:]}")
        return {}
    return {g["uuid"]: (str(g["verdict"]["verdict"]), g.get("utilization")) for g in doc.get("gpus", [])}


def _report_verdict(result: subprocess.CompletedProcess[str], uuid: str) -> str:
    """The verdict ``uuid`` held longest over the run in a ``report --output json`` ("" when there is none)."""
    try:
        series = json.loads(result.stdout)["series"]["verdicts"].get(uuid, [])
    except (json.JSONDecodeError, KeyError):
        return ""
    counts = collections.Counter(v for v in series if v)
    return counts.most_common(1)[0][0] if counts else ""


def judge_wave(name: str, jobs: Sequence[Job], exporter: str, prom: str, tmp: Path, start_timeout: float,
               settle: float, scale: int) -> list[dict[str, Any]]:
    """Run one wave's jobs, judge each of their cases once per path; returns one record per case."""
    cases = [case for job in jobs for case in job.cases]
    wanted = {c.uuid for c in cases}
    began = time.monotonic()
    with _started(jobs, exporter, tmp) as procs:
        deadline = began + start_timeout
        while time.monotonic() < deadline and not wanted <= _pushing(prom):
            time.sleep(2)
        seen = _pushing(prom) & wanted
        _say(f"wave {name}: {len(seen)} of {len(wanted)} GPUs pushing after {time.monotonic() - began:.0f} s; "
             f"settling {settle:g} s (load {os.getloadavg()[0]:.1f})")
        time.sleep(settle)
        judged_at = time.monotonic()
        exited = [job.cases[0].run for job, p in zip(jobs, procs, strict=True) if p.poll() is not None]
        load = os.getloadavg()[0]
        firing = firing_causes(prom)
        pending: dict[str, set[str]] = {}
        for r in promql(prom, 'ALERTS{alertstate="pending", cause!=""}'):
            pending.setdefault(r["metric"].get("uuid", ""), set()).add(r["metric"]["cause"])
        seen_alerts: dict[str, dict[str, int]] = {}  # uuid -> cause -> evaluations pending or firing, last 30 s
        for r in promql(prom, 'sum by (uuid, cause) (count_over_time(ALERTS{cause!=""}[30s]))'):
            seen_alerts.setdefault(r["metric"].get("uuid", ""), {})[r["metric"]["cause"]] = int(float(r["value"][1]))
        runs = sorted({c.run for c in cases})
        window, step = f"{300 // scale}s", f"{max(1, 300 // scale // 4)}s"
        results = run_clis([["diagnose", "--url", exporter, "--window", window, "--output", "json"],
                            ["diagnose", "--prometheus-url", prom, "--output", "json"],
                            *(["report", "--prometheus-url", prom, "--run", run, "--step", step, "--output", "json"]
                              for run in runs)], timeout=180)
        url, by_prom = _verdicts(results[0]), _verdicts(results[1])
        reports = dict(zip(runs, results[2:], strict=True))
        judged_after = time.monotonic() - began
    records = []
    for case in cases:
        records.append({
            "wave": name, "shape": case.shape, "cause": case.cause, "uuid": case.uuid, "run": case.run,
            "pushing": case.uuid in seen, "job_exited_early": case.run in exited,
            "alerts_pending": sorted(pending.get(case.uuid, set())),
            "alerts_last_30s": seen_alerts.get(case.uuid, {}),
            "utilization": {"diagnose --url": url.get(case.uuid, ("", None))[1],
                            "diagnose --prometheus-url": by_prom.get(case.uuid, ("", None))[1]},
            "device": device_truth(tmp / "channel", case.uuid, judged_at - TRUTH_SECONDS, judged_at),
            "named": {"alerts": _named_by_alerts(case.uuid, firing),
                      "diagnose --url": url.get(case.uuid, ("", None))[0],
                      "diagnose --prometheus-url": by_prom.get(case.uuid, ("", None))[0],
                      "report": _report_verdict(reports[case.run], case.uuid)}})
    _say(f"wave {name}: judged {len(cases)} cases {judged_after:.0f} s after the start (load {load:.1f})")
    for proc, job in zip(procs, jobs, strict=True):
        if proc.returncode not in (0, -15, None):
            _say(f"  job {job.cases[0].run} ended with {proc.returncode}: {tmp}")
    return records


def _rules(scale: int) -> dict[str, str]:
    """The shipped rules shrunk ``scale``-fold (the end-to-end tests' transform, tests/test_alerting_e2e.py)."""
    test_alerting_e2e.SCALE = scale
    return shipped_fast_rules()


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return head.stdout.strip() or "unknown"


def _uncommitted() -> list[str]:
    """The product's files (exporter, rules, thresholds) that differ from the commit in the working tree."""
    status = subprocess.run(["git", "status", "--porcelain", "--", "exporter", "prometheus"], cwd=REPO,
                            capture_output=True, text=True)
    return sorted(line[3:] for line in status.stdout.splitlines() if line.strip())


def run(selected: Sequence[str], start_timeout: float, settle: float, keep: Path | None,
        command: str, scale: int) -> dict[str, Any]:
    """Every selected wave on one exporter and one Prometheus; returns the raw results (bench/causes_doc.py)."""
    started = time.monotonic()
    load_before = os.getloadavg()
    all_waves = waves(seconds=start_timeout + settle + 300)
    chosen = {name: all_waves[name] for name in selected}
    cases: list[Case] = [c for jobs in chosen.values() for job in jobs for c in job.cases]
    records: list[dict[str, Any]] = []
    loads: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="causes-accuracy-") as folder:
        tmp = keep or Path(folder)
        tmp.mkdir(parents=True, exist_ok=True)
        node = tmp / "node.yaml"
        node.write_text(scenario(cases))
        with run_exporter(["--simulate", str(node), "--poll-interval", "0.2"],
                          env={CHANNEL_ENV: str(tmp / "channel")}) as exporter, \
                run_prometheus(scrape_config(exporter, "accuracy-node"), _rules(scale)) as prom:
            for name, jobs in chosen.items():
                _say(f"wave {name}: {len(jobs)} jobs")
                records += judge_wave(name, jobs, exporter, prom, tmp, start_timeout, settle, scale)
                loads[name] = round(os.getloadavg()[0], 2)
    return {"command": command,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": _commit(),
            "uncommitted": _uncommitted(),
            "elapsed_s": round(time.monotonic() - started), "cpus": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            "load_per_wave": loads, "settle_s": settle, "truth_s": TRUTH_SECONDS, "scale": scale,
            "start_timeout_s": start_timeout,
            "waves": list(chosen), "all_waves": list(all_waves), "causes": list(CAUSES), "paths": list(PATHS),
            "cases": records, "notes": {}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.causes_accuracy", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--update-docs", action="store_true",
                        help="write docs/accuracy.json, docs/accuracy.md and the README's line (default: a new "
                             "temporary folder)")
    parser.add_argument("--wave", action="append", choices=list(waves(1.0)),
                        help="run only this wave (repeatable; default: every wave)")
    parser.add_argument("--settle", type=float, default=75.0,
                        help="seconds between the last job pushing and the judgement (default 75)")
    parser.add_argument("--scale", type=int, default=20,
                        help="shrink the shipped rules' windows and for: durations this many times (default 20)")
    parser.add_argument("--start-timeout", type=float, default=150.0,
                        help="seconds to wait for every job of a wave to push (default 150)")
    parser.add_argument("--keep", type=Path, help="keep the jobs' logs and the scenario in this folder")
    args = parser.parse_args(argv)
    if args.update_docs and args.wave:
        parser.error("--update-docs needs every wave (no --wave)")
    command = " ".join(["python -m bench.causes_accuracy", *(argv if argv is not None else sys.argv[1:])])
    results = run(args.wave or list(waves(1.0)), args.start_timeout, args.settle, args.keep, command, args.scale)
    if args.update_docs:
        previous = causes_doc.load() if causes_doc.RESULTS.exists() else {}
        results["notes"] = {k: v for k, v in previous.get("notes", {}).items()}
        causes_doc.RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        causes_doc.write()
        where = causes_doc.RESULTS.parent
    else:
        where = Path(tempfile.mkdtemp(prefix="causes-accuracy-out-"))
        (where / "accuracy.json").write_text(json.dumps(results, indent=1) + "\n")
        (where / "accuracy.md").write_text(causes_doc.render(results))
    print(causes_doc.summary_table(results))
    _say(f"results in {where} ({results['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
