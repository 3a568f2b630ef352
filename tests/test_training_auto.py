"""Zero-code activation (gpu_exporter.training.auto, .launch): jobs that know nothing of the library get their phases.

The startup hook is the one line :data:`auto.PTH_LINE` that the training wheel installs as a ``.pth``
file at the root of site-packages (tests/test_training_standalone.py checks the wheel and runs it in a
fresh virtual environment). Here the line runs from a folder that ``site.addsitedir`` processes at
interpreter start (a ``sitecustomize`` on PYTHONPATH), exactly as from site-packages, with this
checkout's torch and Lightning:

* unset (or ``0``), a fresh interpreter has imported nothing of ``gpu_exporter``; set, it has imported
  ``gpu_exporter.training.auto`` and still no torch;
* a real CPU plain PyTorch loop and a real CPU Lightning job (tests/auto_jobs.py, no line of the library
  in them), started with only environment variables set, push to a real exporter process phases
  within 0.05 of the run's wall time of their own timers; the same loop through
  ``python -m gpu_exporter.training.launch`` too;
* a bad setting or an exporter that does not answer never breaks the job: one log line, exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_exporter.training import auto
from prometheus_client.parser import text_string_to_metric_families

from testbed import exporter_env, http_get, run_exporter

JOBS = Path(__file__).with_name("auto_jobs.py")
TOLERANCE = 0.05
PHASES = ("data", "compute", "metrics", "checkpoint")


def hook_env(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose interpreters run the startup hook at start, as an installed training wheel does."""
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir(exist_ok=True)
    (site_dir / auto.PTH_NAME).write_text(auto.PTH_LINE)
    boot = tmp_path / "boot"
    boot.mkdir(exist_ok=True)
    (boot / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(site_dir)!r})\n")
    env = exporter_env(extra)
    env["PYTHONPATH"] = str(boot) + ":" + env["PYTHONPATH"]
    return env


PROBE = ("import sys; print(sorted(m for m in sys.modules if m.startswith('gpu_exporter')), "
         "'torch' in sys.modules)")


@pytest.mark.parametrize(("value", "loaded"), [(None, False), ("0", False), ("off", False), ("1", True)])
def test_the_startup_hook_imports_nothing_unless_the_variable_is_set(tmp_path: Path, value: str | None,
                                                                     loaded: bool) -> None:
    env = hook_env(tmp_path, {auto.ENV: value} if value is not None else None)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert out.returncode == 0 and not out.stderr, out.stderr
    expected = "['gpu_exporter', 'gpu_exporter.training', 'gpu_exporter.training.auto', " \
               "'gpu_exporter.training.protocol'] False" if loaded else "[] False"
    assert out.stdout.strip() == expected


def test_launch_without_a_script_says_how_to_use_it() -> None:
    out = subprocess.run([sys.executable, "-m", "gpu_exporter.training.launch"], env=exporter_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("usage: python -m gpu_exporter.training.launch")


def _phases(metrics: str, run: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == "gpu_training_phase_seconds_total" and s.labels.get("run") == run:
                out[s.labels["phase"]] = s.value
    return out


@pytest.mark.slow  # five torch jobs (one of them Lightning) side by side against a real exporter: about 20 s
def test_jobs_started_with_only_the_variable_report_their_own_timers(tmp_path: Path) -> None:
    seconds = "4"
    with run_exporter(["--simulate"]) as url:
        base = {"GPU_EXPORTER_URL": url}
        runs = {  # job -> (argv, environment, run name)
            "plain": ([str(JOBS), "plain"], {auto.ENV: "1", auto.NAME_ENV: "auto-plain"}, "auto-plain"),
            "launch": (["-m", "gpu_exporter.training.launch", str(JOBS), "plain"],
                       {"GPU_EXPORTER_RUN_ID": "launch-0123456789ab"}, "auto_jobs-0123456789ab"),
            "lightning": ([str(JOBS), "lightning"], {auto.ENV: "1", auto.NAME_ENV: "auto-lightning"},
                          "auto-lightning"),
            # never breaks a job: a bad setting, an exporter that does not answer
            "bad_url": ([str(JOBS), "plain"], {auto.ENV: "1", "GPU_EXPORTER_URL": "ftp://nowhere"}, ""),
            "unreachable": ([str(JOBS), "plain"], {auto.ENV: "1", "GPU_EXPORTER_URL": "127.0.0.1:1"}, ""),
        }
        # The hook's files are written once, before any job starts: rewriting them while an earlier job's
        # interpreter reads them at start (write_text truncates first) left that job without the hook.
        hooked = hook_env(tmp_path)
        jobs = {}
        for job, (argv, extra, _) in runs.items():
            env = {**hooked, **base, "CUDA_VISIBLE_DEVICES": f"GPU-zero-code-{job}", **extra}
            short = "1" if job in ("bad_url", "unreachable") else seconds
            jobs[job] = subprocess.Popen([sys.executable, *argv, str(tmp_path / f"{job}.json"), short], env=env,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        errors = {}
        for job, proc in jobs.items():
            _, errors[job] = proc.communicate(timeout=240)
            assert proc.returncode == 0, (job, errors[job][-3000:])
        metrics = http_get(url + "/metrics")  # the final snapshots were pushed before the jobs exited

    for job in ("bad_url", "unreachable"):
        lines = [line for line in errors[job].splitlines() if "gpu_exporter" in line or "exporter" in line]
        assert len(lines) == 1, (job, errors[job])
    assert "zero-code activation: timing this job failed" in errors["bad_url"]
    assert "cannot reach the exporter" in errors["unreachable"]

    table = {}
    for job in ("plain", "launch", "lightning"):
        own = json.loads((tmp_path / f"{job}.json").read_text())
        reported = _phases(metrics, runs[job][2])
        total = sum(reported.values())
        assert total > 2.5, (job, reported, errors[job][-3000:])
        table[job] = {p: (round(reported.get(p, 0.0) / total, 3), round(own[p] / total, 3)) for p in PHASES}
    print("\nphase -> [reported share, own timers' share]")
    for job, shares in table.items():
        print(f"  {job}: {json.dumps(shares)}")
    for job, shares in table.items():
        for phase, (reported_share, own_share) in shares.items():
            assert reported_share == pytest.approx(own_share, abs=TOLERANCE), (job, phase, table)
    for job in ("plain", "launch"):
        assert table[job]["checkpoint"][1] > 0.02 and table[job]["data"][1] > 0.2, table
    assert table["lightning"]["metrics"][1] > 0.1, table


def test_a_patch_that_fails_is_one_log_line_and_the_job_runs_on(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A framework whose Trainer looks different (no callback_handler), a torch without the optimizer hooks."""
    import types

    from gpu_exporter.training import transformers as integration

    monkeypatch.setattr(integration, "_class", [type("GpuExporterCallback", (integration.CallbackMixin,), {})])
    monkeypatch.setattr(auto, "_state", auto._State())

    class Trainer:  # a Transformers version this module does not know
        def __init__(self, model: object, *, callbacks: object = None) -> None:
            self.model = model

    module = types.SimpleNamespace(Trainer=Trainer)
    with caplog.at_level("WARNING", logger="gpu_exporter.training"):
        auto._imported(auto._TRANSFORMERS_TRAINER, module)  # type: ignore[arg-type]
        trainer = Trainer("model")
        auto._imported(auto._TORCH_OPTIMIZER, types.SimpleNamespace())  # type: ignore[arg-type]
    assert trainer.model == "model" and getattr(Trainer.__init__, "__wrapped__", None) is not None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "attaching the Transformers callback failed (AttributeError" in lines[0]
    assert "patching torch.optim.optimizer failed" in lines[1] and "the job runs on without it" in lines[1]
