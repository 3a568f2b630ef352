"""The README's promises: its training script runs against a real exporter and its numbers arrive,
and its CPU demo block, run as written, shows the input-bound verdict (M1) and then the fix."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_exporter.thresholds import load_thresholds
from prometheus_client.parser import text_string_to_metric_families

from testbed import exporter_env, free_port, http_get, run_exporter, wait_until

README = Path(__file__).resolve().parents[1] / "README.md"
DEMO_HEADING = "### The demo, on a machine without a GPU"


def test_readme_opens_with_the_two_commands() -> None:
    """The user's command, then the contributor's test command, each labelled; the Python version is pyproject's."""
    first_block = re.search(r"```sh\n(.*?)```", README.read_text(), re.S)
    assert first_block is not None
    lines = first_block.group(1).splitlines()
    commands = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    assert len(commands) == 2
    user, contributor = (lines[i] for i in commands)
    assert "gpu-exporter --simulate" in user and "pip install" in user
    assert contributor == "bash tests/run.sh"
    assert "bash tests/run.sh" in (README.parent / ".ci" / "run").read_text()
    user_label, contributor_label = (" ".join(lines[:commands[0]]), " ".join(lines[commands[0] + 1:commands[1]]))
    assert user_label.startswith("# For users:") and contributor_label.startswith("# For contributors:")
    assert f"Python {_pyproject('requires-python').removeprefix('>=')} or newer" in user_label


def _pyproject(key: str) -> str:
    """A top-level value of pyproject.toml's [project] table, as written (tomllib is Python 3.11+)."""
    found = re.search(rf'^{re.escape(key)} = (.+)$', (README.parent / "pyproject.toml").read_text(), re.M)
    assert found is not None, key
    return found.group(1).strip('"') if found.group(1).startswith('"') else found.group(1)


def _github_anchor(heading: str) -> str:
    """The fragment GitHub gives a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_benchmark_claims_link_to_their_measurement_and_name_the_missed_goals() -> None:
    text = README.read_text()
    doc = (README.parent / "docs" / "benchmarks.md").read_text()
    anchors = {_github_anchor(line.lstrip("#")) for line in doc.splitlines() if line.startswith("#")}
    links = re.findall(r"\]\(docs/benchmarks\.md#([^)]+)\)", text)
    assert links and set(links) <= anchors, set(links) - anchors
    start = text.index("### Measured, and what is not met yet")
    section = text[start:text.index("\n## ", start)]
    assert "](docs/benchmarks.md" in section
    # Every figure the README quotes is one of the document's (regenerate both together).
    quoted = set(re.findall(r"\d+\.\d+", section))
    assert quoted and not {n for n in quoted if n not in doc}, sorted(n for n in quoted if n not in doc)
    # Every goal the document marks missed, in any of its runs, is named as missed.
    goals = doc[doc.index("### Goals"):doc.index("\n## ", doc.index("### Goals"))]
    rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in goals.splitlines() if row.startswith("| ")]
    # a goal's name without its link to a section: "goal (1 to 64 GPUs; [section](#...))" -> "goal"
    missed = [re.sub(r"\s*\([^()]*\]\([^)]*\)\)", "", goal) for goal, _, status in rows
              if "**missed**" in status]
    flat = " ".join(section.split())
    said = flat.find("are **missed**")
    named = re.findall(r"(?<!\*)\*([^*]+)\*(?!\*)", flat[said:]) if said >= 0 else []
    assert named == missed, (named, missed)


def test_readme_names_every_packaged_scenario_and_dashboard() -> None:
    """The scenario list of the Running block and the dashboards of the file list are the shipped ones."""
    import json

    from gpu_exporter.simulate.scenario import DEFAULT_SCENARIO

    text = README.read_text()
    listed = re.search(r"# a packaged scenario: (.+)\n", text)
    assert listed is not None
    shipped = sorted(p.stem for p in DEFAULT_SCENARIO.parent.glob("*.yaml") if p != DEFAULT_SCENARIO)
    assert listed.group(1).split(", ") == shipped
    dashboards = re.search(r"(\w+) dashboards \(([^)]+)\)", " ".join(text.split()))
    assert dashboards is not None
    titles = sorted(json.loads(p.read_text())["title"].removeprefix("GPU ")
                    for p in (README.parent / "grafana" / "dashboards").glob("*.json"))
    assert sorted(dashboards.group(2).split(", ")) == titles
    assert dashboards.group(1) == ["one", "two", "three", "four", "five", "six", "seven"][len(titles) - 1]


def test_readers_docs_cite_no_internal_issue_number() -> None:
    """Readers cannot see the project's issue tracker: README, docs/, CHANGELOG, the chart's README and the examples
    say what changed in words ("issue 30, item 4" means nothing to them)."""
    root = README.parent
    files = [README, root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md")),
             *sorted(root.glob("helm/**/README*")), *sorted(p for p in (root / "examples").rglob("*") if p.is_file())]
    cited = [f"{path.relative_to(root)}:{n}: {line.strip()}" for path in files
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if re.search(r"\bissues? #?\d+|\bissue-\d+", line, re.I)]
    assert not cited, "\n".join(cited)


def test_license_is_the_apache_2_text_pyproject_names() -> None:
    license_text = (README.parent / "LICENSE").read_text()
    assert " ".join(license_text.split()[:4]) == "Apache License Version 2.0,"
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert _pyproject("license") == '{ text = "Apache-2.0" }'


@pytest.mark.slow  # end-to-end: real processes
def test_readme_training_script_reports_phases(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    script = tmp_path / "train.py"
    script.write_text(block.group(1))
    with run_exporter(["--simulate", "--poll-interval", "0.5"]) as url:
        proc = subprocess.run([sys.executable, str(script)], env=exporter_env({"GPU_EXPORTER_URL": url}),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr

        def phases() -> dict[str, float] | None:
            found = {s.labels["phase"]: s.value
                     for f in text_string_to_metric_families(http_get(url + "/metrics"))
                     for s in f.samples
                     if s.name == "gpu_training_phase_seconds_total" and s.labels["run"] == "mlp-demo"}
            return found or None

        shares = wait_until(phases, 10, what="the README run's phases")
        steps = [s.value for f in text_string_to_metric_families(http_get(url + "/metrics")) for s in f.samples
                 if s.name == "gpu_training_steps_total" and s.labels["run"] == "mlp-demo"]
    assert {"data", "compute", "metrics", "other"} <= shares.keys()
    assert shares["compute"] > 0 and shares["metrics"] > 0 and shares["data"] > 0
    assert steps == [3 * 4096 // 64]  # 3 epochs of 64 batches, all delivered by the final push


def readme_block(heading: str, language: str = "sh") -> str:
    """The first ``language`` code block after ``heading`` in the README, verbatim."""
    text = README.read_text()
    start = text.index(heading)
    block = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, start)
    assert block is not None, f"no {language} block after {heading!r}"
    return block.group(1)


def _isolated_loopback() -> list[str] | None:
    """argv prefix running a command in its own network namespace with only loopback up, so the
    README's fixed port 9445 is free whatever else runs on this machine; None where not allowed."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        return None
    probe = subprocess.run([unshare, "--net", "--map-root-user", ip, "link", "set", "lo", "up"],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    return [unshare, "--net", "--map-root-user", "bash", "-c", f'{ip} link set lo up && exec bash "$0"']


def _phase_shares(line: str) -> dict[str, float]:
    return {m.group(1): int(m.group(2)) / 100 for m in re.finditer(r"(\w+) (\d+)%", line)}


@pytest.mark.slow
def test_readme_cpu_demo_runs_as_written_and_shows_input_bound(tmp_path: Path) -> None:
    """Runs the README's demo block verbatim with bash in the repository root (in a private network
    namespace when the machine allows one, else with 9445 replaced by a free port: the only change)."""
    block = readme_block(DEMO_HEADING)
    repo = README.parent
    assert (repo / ".venv" / "bin" / "activate").exists(), "the demo runs in .venv (bash tests/run.sh makes it)"
    prefix = _isolated_loopback()
    if prefix is None:
        block = block.replace("9445", str(free_port()))
        prefix = ["bash"]
    script = tmp_path / "demo.sh"
    script.write_text(block)
    env = exporter_env({"DEMO_SECONDS": "20"})  # as the README says: each run trains 20 s instead of 30
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen([*prefix, str(script)], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("the README demo did not finish within 300 s:\n" + out)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    limit = load_thresholds().input_bound_share
    shares = [_phase_shares(line) for line in out.splitlines() if line.startswith("time per phase:")]
    assert len(shares) == 2, out
    slow, fixed = shares
    assert slow["data"] > limit + 0.2, out     # well above the M1 limit, not at its edge
    assert fixed["data"] < limit and fixed["data"] < slow["data"] / 3, out
    # diagnose prints one block per GPU ("GPU 0 ..."): the first run is judged input-bound, the fixed one not
    verdicts = re.split(r"^GPU 0 ", out, flags=re.M)[1:]
    assert len(verdicts) == 2, out
    assert "M1" in verdicts[0] and "input-bound" in verdicts[0], out
    assert "M1" not in verdicts[1].split("time per phase")[0], out
    assert "cannot tell which GPU" not in out, out  # the UUID wiring worked: no warning from the library
    assert "+cpu" in subprocess.run([str(repo / ".venv" / "bin" / "python"), "-c",
                                     "import torch; print(torch.__version__)"],
                                    capture_output=True, text=True, check=True).stdout


def test_training_library_warns_once_without_a_gpu_uuid(tmp_path: Path) -> None:
    """A job that cannot find its GPU (here: a CPU) says so once on stderr, and still trains."""
    script = tmp_path / "nouuid.py"
    script.write_text(
        "from gpu_exporter import training\n"
        "run = training.start('no-uuid', push_interval=0.2)\n"
        "for _ in range(3):\n"
        "    with run.phase('compute'):\n"
        "        pass\n"
        "    run.step()\n"
        "    run.snapshot()\n"
        "run.close()\n")
    with run_exporter(["--simulate", "--poll-interval", "0.5"]) as url:
        env = exporter_env({"GPU_EXPORTER_URL": url})
        env.pop("CUDA_VISIBLE_DEVICES", None)
        proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("cannot tell which GPU this process uses") == 1, proc.stderr
    assert "CUDA_VISIBLE_DEVICES=GPU-" in proc.stderr


def test_simulation_doc_python_snippet_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    doc = (README.parent / "docs" / "simulation.md").read_text()
    start = doc.index("## Python API")
    block = re.compile(r"```python\n(.*?)```", re.S).search(doc, start)
    assert block is not None
    claimed = re.search(r"It prints `([^`]+)`", doc[block.end():])
    assert claimed is not None
    script = tmp_path / "snippet.py"
    script.write_text(block.group(1))
    proc = subprocess.run([sys.executable, str(script)], env=exporter_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == claimed.group(1)
