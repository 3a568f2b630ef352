"""The thresholds diagnose uses are the alert rules' thresholds: same file, typed, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_exporter.thresholds import ThresholdsError, load_thresholds, parse_duration

from testbed import REPO

PACKAGED = REPO / "exporter" / "gpu_exporter" / "thresholds.yml"
RULES_SOURCE = REPO / "prometheus" / "thresholds.yml"


def test_packaged_thresholds_are_the_rules_thresholds() -> None:
    # monitoring/rules.py reads prometheus/thresholds.yml, a link to the packaged file: one source.
    assert RULES_SOURCE.is_symlink() and RULES_SOURCE.resolve() == PACKAGED.resolve()
    t = load_thresholds()
    assert (t.utilization_low_threshold, t.idle_utilization_threshold, t.work_memory_used_ratio) == (0.3, 0.02, 0.05)
    assert (t.input_bound_share, t.metrics_bound_share) == (0.3, 0.2)
    assert (t.batch_compute_share, t.batch_memory_used_ratio) == (0.5, 0.5)
    assert (t.allocator_window, t.allocator_retries_threshold, t.memory_nearly_full_ratio) == (600.0, 3, 0.95)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("15m", 900), ("1h30m", 5400), ("1d", 86400),
                                               ("250ms", 0.25)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("change", "message"), [
    (("input_bound_share: 0.3", "input_bound_share: 1.3"), "input_bound_share must be a ratio between 0 and 1"),
    (("allocator_window: 10m", "allocator_window: ten"), "allocator_window: 'ten' is not a duration"),
    (("allocator_retries_threshold: 3", "allocator_retries_threshold: 2.5"),
     "allocator_retries_threshold must be a whole number >= 0"),
    (("metrics_bound_share: 0.2\n", ""), "lacks the key metrics_bound_share"),
    (("utilization_low_threshold: 0.3", "utilization_low_threshold: [0.3"), "invalid YAML"),
])
def test_bad_thresholds_file_is_one_sentence(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    text = RULES_SOURCE.read_text()
    assert change[0] in text
    path = tmp_path / "thresholds.yml"
    path.write_text(text.replace(change[0], change[1]))
    with pytest.raises(ThresholdsError, match="^" + str(path)) as err:
        load_thresholds(path)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow  # end-to-end: real processes
def test_diagnose_judges_with_the_thresholds_file_it_is_given(tmp_path: Path) -> None:
    """``--thresholds FILE`` changes diagnose's verdicts (the packaged copy is only the default)."""
    from e2e import run_clis

    from testbed import run_exporter

    t = load_thresholds()
    assert (t.utilization_target, t.checkpoint_share, t.batch_busy_ratio) == (0.85, 0.2, 0.5)
    stricter = tmp_path / "thresholds.yml"
    stricter.write_text(RULES_SOURCE.read_text().replace("utilization_target: 0.85", "utilization_target: 0.99"))
    # Two GPUs at 92%, 7 points from both targets: diagnose times its window by the client's clock, which
    # a loaded machine can put 0.1 s off (97% read as 100% over 3 s beside two CPU burners).
    scenario = tmp_path / "at-92.yaml"
    scenario.write_text((REPO / "tests" / "scenarios" / "diagnose-healthy.yaml").read_text()
                        .replace("constant: 0.97", "constant: 0.92").replace("constant: 0.96", "constant: 0.92"))
    assert scenario.read_text().count("constant: 0.92") == 2
    with run_exporter(["--simulate", str(scenario), "--poll-interval", "0.2"]) as url:
        default, custom = run_clis([["diagnose", "--url", url, "--window", "5s"],  # side by side, each its window
                                    ["diagnose", "--url", url, "--window", "5s", "--thresholds", str(stricter)]])
    assert default.returncode == 0, default.stdout + default.stderr
    assert custom.returncode == 1, custom.stdout + custom.stderr
    assert "  verdict      below target: not instrumented: " in custom.stdout
    assert custom.stdout.endswith("2 of 3 GPU(s) below the 99% utilization target.\n")
