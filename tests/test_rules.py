"""The Prometheus rules: promtool checks and unit tests, one source for thresholds, runbooks.

Every alert must have a runbook section and promtool tests that show it both silent and firing;
the rules files must be what python -m monitoring makes from thresholds.yml.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from gpu_exporter.thresholds import read_thresholds_file

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.rules.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.test.yml"))
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/gpu-utilization-exporter/gpu-utilization-exporter/blob/main/docs/runbooks.md#"

CONTRACT_RECORDS = {
    "gpu:gpu_utilization:avg5m", "gpu:gpu_memory_used:ratio",
    "run:gpu_training_phase:share5m", "node:gpu_utilization:avg5m", "model:gpu_utilization:avg5m",
    "namespace:gpu_utilization:avg5m", "gpu:gpu_underutilized:bool5m", "node:gpu_idle_hours:increase1h",
    "gpu:gpu_has_work:bool", "run:gpu_training_cause:share", "run:gpu_training_cause:projected_utilization",
    "run:gpu_useful_utilization:avg5m", "gpu:gpu_useful_utilization:avg5m",
    "instance:gpu_exporter_series:count", "cluster:gpu_exporter_series:sum",
}
EXPECTED_ALERTS = {
    "GpuUtilizationLow", "GpuUtilizationBelowTarget", "GpuIdleButAllocated", "GpuTrainingInputBound",
    "GpuTrainingMetricsBound",
    "GpuBatchTooSmall", "GpuMemoryAllocatorThrashing", "GpuMemoryNearlyFull", "GpuExporterDown",
    "GpuTrainingCheckpointBound", "GpuTrainingCallbackBound", "GpuTrainingBelowTarget",
    "GpuTrainingFrameworkOverhead", "GpuTrainingHostWork",
    "GpuExporterCollectorFailing", "GpuExporterSamplesStale", "GpuXidErrors", "GpuThermalThrottling",
    "GpuMissing", "GpuTrainingStraggler", "GpuTrainingCommunicationBound",
    "GpuUninstrumentedInputBound", "GpuExporterSeriesGrowth",
    "GpuMemoryBoundKernels", "GpuSmBatchTooSmall", "GpuTensorCoresIdle", "GpuSmActivityLow",
}
CAUSE_REMEDIES = {"GpuTrainingInputBound": "M1", "GpuTrainingMetricsBound": "M2", "GpuBatchTooSmall": "M3",
                  "GpuMemoryAllocatorThrashing": "M4", "GpuTrainingCheckpointBound": "CK", "GpuTrainingStraggler": "ST",
                  "GpuTrainingCommunicationBound": "CM", "GpuTrainingCallbackBound": "CB",
                  "GpuTrainingFrameworkOverhead": "FO", "GpuTrainingHostWork": "HW"}

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(promtool is None, reason="promtool not installed (apt-get install prometheus)")


def load_generator() -> ModuleType:
    from monitoring import rules as generator
    return generator


def rules(kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(rule for rule in group["rules"] if kind in rule)
    return out


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules("alert")}


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the ``##`` headings of ``markdown``."""
    heads = re.findall(r"^#{2,3} (.+)$", markdown, flags=re.M)
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@needs_promtool
def test_promtool_check_rules() -> None:
    proc = subprocess.run([str(promtool), "check", "rules", *map(str, RULE_FILES)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(RULE_FILES)


# promtool evaluates every rule of its rule_files at every step. cardinality.test.yml spans 49 h at one step a
# minute: ~3,000 evaluations of every shipped rule took 27 s here (47 s in a CI run). It runs on the rules its
# checks can read instead (:func:`rules_read_by`), each as shipped, in its shipped group.
ONLY_THE_RULES_READ = {"cardinality.test.yml"}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def rules_read_by(test: dict[str, Any], files: dict[str, Any]) -> dict[str, Any]:
    """``files`` ({name: parsed rule file}) cut to the rules that a promtool test file's checks can read: the
    alerts its alert_rule_test names and the records its promql_expr_test queries, with every record those
    rules' expressions name, transitively. The groups keep their names, intervals and rule order."""
    every = [rule for doc in files.values() for group in doc["groups"] for rule in group["rules"]]
    checks = [case for t in test["tests"] for case in t.get("promql_expr_test", [])]
    names = {name for case in checks for name in _NAME.findall(case["expr"])}
    wanted = {case["alertname"] for t in test["tests"] for case in t.get("alert_rule_test", [])}
    if "ALERTS" in names or "ALERTS_FOR_STATE" in names:
        wanted |= {rule["alert"] for rule in every if "alert" in rule}
    kept: list[dict[str, Any]] = []
    while True:
        more = [rule for rule in every if rule not in kept
                and (rule.get("alert") in wanted or rule.get("record") in names | wanted)]
        if not more:
            break
        kept += more
        names |= {name for rule in more for name in _NAME.findall(rule["expr"])}
    return {file: {**doc, "groups": [{**group, "rules": [r for r in group["rules"] if r in kept]}
                                     for group in doc["groups"] if any(r in kept for r in group["rules"])]}
            for file, doc in files.items()}


@needs_promtool
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file: Path, tmp_path: Path) -> None:
    if test_file.name in ONLY_THE_RULES_READ:
        test = yaml.safe_load(test_file.read_text())
        files = {name: yaml.safe_load((test_file.parent / name).read_text()) for name in test["rule_files"]}
        for name, doc in rules_read_by(test, files).items():
            (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "tests" / name).write_text(yaml.safe_dump(doc, sort_keys=False))
        (tmp_path / "tests").mkdir(exist_ok=True)
        test_file = tmp_path / "tests" / test_file.name
        test_file.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", test_file.name], cwd=test_file.parent,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_promtool_test_runs_on_the_rules_its_checks_read() -> None:
    """cardinality.test.yml's cut keeps its alert, the records that alert and its queries read, and nothing
    else; a record named only inside a kept rule's expression comes along."""
    test = yaml.safe_load((PROM / "tests" / "cardinality.test.yml").read_text())
    files = {path.name: yaml.safe_load(path.read_text()) for path in RULE_FILES}
    cut = rules_read_by(test, files)
    kept = {rule.get("record") or rule["alert"]: group["name"]
            for doc in cut.values() for group in doc["groups"] for rule in group["rules"]}
    assert kept == {"instance:gpu_exporter_series:count": "gpu-cardinality.recording",
                    "cluster:gpu_exporter_series:sum": "gpu-cardinality.recording",
                    "GpuExporterSeriesGrowth": "gpu-health.alerts"}
    only_alert = {"tests": [{"alert_rule_test": [{"alertname": "GpuExporterSeriesGrowth"}]}]}
    assert "instance:gpu_exporter_series:count" in str(rules_read_by(only_alert, files))
    assert rules_read_by({"tests": [{}]}, files) == {name: {**doc, "groups": []} for name, doc in files.items()}


def test_rules_files_are_generated_from_thresholds() -> None:
    proc = subprocess.run([sys.executable, "-m", "monitoring", "--check"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_threshold_values_reach_the_rules() -> None:
    from monitoring import build

    gen = load_generator()
    values = read_thresholds_file()
    assert values.text("utilization_low_threshold") == "0.3"
    changed = values.with_values(utilization_low_threshold=0.42, utilization_low_for="17m")
    text = "".join(gen.generate(build(changed)).values())
    assert "min_over_time(gpu:gpu_useful_utilization:avg5m[10m]) < 0.42" in text  # GpuUtilizationLow
    assert "< bool 0.42" in text
    assert "for: 17m" in text
    assert "below 42% utilization" in text
    # No utilization comparison kept a literal 0.3: they all come from the one key.
    assert "< 0.3" not in text and ">= 0.3" not in text


def test_every_group_evaluates_at_the_configured_interval() -> None:
    """Every group, written in a template or generated, carries ``interval: <rule_interval>``; another value
    in thresholds.yml reaches every group."""
    from monitoring import build

    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    interval = read_thresholds_file().text("rule_interval")
    assert len(groups) > 10 and {g["name"]: g.get("interval") for g in groups} == dict.fromkeys(
        (g["name"] for g in groups), interval)
    text = "".join(load_generator().generate(build(read_thresholds_file().with_values(rule_interval="45s"))).values())
    assert text.count("    interval: 45s\n") == len(groups) and f"interval: {interval}" not in text


def test_generator_rejects_unknown_and_unused_keys() -> None:
    gen = load_generator()
    values = read_thresholds_file()
    with pytest.raises(KeyError, match="unknown threshold"):
        gen.render("x > ${nope}", values, source="t.in")
    with pytest.raises(ValueError, match="unknown threshold 'never_used'"):
        values.with_values(never_used=1)
    assert gen.render("${input_bound_share|percent} of ${input_bound_share}", values) == "30% of 0.3"
    assert gen.render("${runbook_url_pattern:x}", values) == values.runbook_url("x")


def test_bad_thresholds_file_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "thresholds.yml"
    bad.write_text("utilization_low_threshold: [0.3]\n")
    with pytest.raises(ValueError, match=r"thresholds.yml:1: utilization_low_threshold must be a number, got \[0.3\]$"):
        read_thresholds_file(bad)


def test_recording_rules_follow_naming_and_contract() -> None:
    names = {rule["record"] for rule in rules("record")}
    assert names >= CONTRACT_RECORDS
    for name in names:
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", name), f"{name} is not level:metric:operation"


def test_levels_and_projections_start_from_the_useful_utilization() -> None:
    """A run's causes are judged at its useful utilization, min(u, 1 - communication share) (an NCCL kernel
    spins while its rank waits, so u alone calls a waiting rank busy), and projected from it."""
    records = {r["record"]: r["expr"] for r in rules("record") if "useful" in r["record"]}
    assert set(records) == {"run:gpu_useful_utilization:avg5m", "gpu:gpu_useful_utilization:avg5m",
                            "run:gpu_useful_utilization:level"}
    assert '(1 - run:gpu_training_phase:share5m{phase="communication"})' in records["run:gpu_useful_utilization:avg5m"]
    level = "run:gpu_useful_utilization:level"
    (levels,) = [r for r in rules("record") if r["record"] == level]  # one rule: a run changes level in one write
    assert "labels" not in levels and levels["expr"] == (
        'label_replace(0 * (run:gpu_useful_utilization:avg5m < 0.3) + 1, "level", "low", "", "")\nor\n'
        'label_replace(0 * (run:gpu_useful_utilization:avg5m >= 0.3 < 0.85) + 1, "level", "target", "", "")\n')
    shares = [r for r in rules("record") if r["record"] == "run:gpu_training_cause:share"]
    assert shares and all("level" not in r["labels"] for r in shares)  # one rule per cause, at the run's level
    assert all(r["expr"].endswith(f"* on (cluster, uuid, run, rank) group_left (level)\n{level}\n") for r in shares)
    projected = [r["expr"] for r in rules("record") if r["record"] == "run:gpu_training_cause:projected_utilization"]
    assert len(projected) == 9  # every cause but M4 (counted, not timed), each in its own group
    assert all(p.count("run:gpu_useful_utilization:avg5m") == 1 and "gpu:gpu_utilization:avg5m" not in p
               for p in projected)


def test_alert_set_and_conventions() -> None:
    found = alerts()
    assert set(found) == EXPECTED_ALERTS
    for name, rule in found.items():
        assert re.fullmatch(r"Gpu[A-Za-z]+", name)
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, name
        ann = rule["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert "{{" not in ann["summary"], f"{name}: summary must be static"
        assert "{{" in ann["description"], f"{name}: description must be templated"
        assert ann["runbook_url"] == RUNBOOK_BASE + name.lower(), name
        if name in CAUSE_REMEDIES:
            # Cause alerts read only the generated cause series, which carry the code and remedy labels.
            # ... held over alert_hold at either level, and the run's useful utilization (its causes' level) low
            # within it (hysteresis, docs/prometheus.md).
            assert "(last_over_time(run:gpu_training_cause:share{cause=" in rule["expr"], name
            assert ("and on (cluster, uuid, run, rank)\n    max by (cluster, uuid, run, rank) (min_over_time("
                    "run:gpu_useful_utilization:avg5m[10m])) < 0.3\n") in rule["expr"], name
            assert rule["labels"]["level"] == "low" and rule["labels"]["severity"] == "warning", name
            assert f"{CAUSE_REMEDIES[name]}:" in ann["description"], f"{name}: description must name the remedy"


def test_device_alerts_name_gpu_node_and_workload() -> None:
    for name, rule in alerts().items():
        desc = rule["annotations"]["description"]
        if "gpu:gpu_workload:info" in rule["expr"]:
            for needle in ("$labels.gpu", "$labels.uuid", "$labels.node", "$labels.pod"):
                assert needle in desc, f"{name}: description lacks {needle}"
            assert "$value" in desc or "| query" in desc, f"{name}: description shows no value"
            assert "$labels.run" in desc or "group_left (gpu," in rule["expr"], name


def test_every_alert_has_a_runbook_section() -> None:
    have = anchors(RUNBOOKS.read_text())
    missing = sorted(name for name in alerts() if name.lower() not in have)
    assert not missing, f"docs/runbooks.md lacks a section for {missing}"


def test_every_alert_has_silent_and_firing_promtool_tests() -> None:
    silent: set[str] = set()
    firing: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                exp = check.get("exp_alerts") or []
                (firing if exp else silent).add(check["alertname"])
                for alert in exp:
                    assert "severity" in alert["exp_labels"], f"{path.name}: {check['alertname']} lacks full labels"
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}
    names = set(alerts())
    assert not names - silent, f"alerts without a not-firing promtool test: {sorted(names - silent)}"
    assert not names - firing, f"alerts without a firing promtool test: {sorted(names - firing)}"


def test_info_alert_carries_every_cause_below_target() -> None:
    below = [rule for rule in rules("alert") if rule["alert"] == "GpuTrainingBelowTarget"]
    from gpu_exporter.verdict.causes import CAUSES
    assert sorted(rule["labels"]["cause"] for rule in below) == sorted(c.cause for c in CAUSES)
    for rule in below:
        assert rule["labels"]["severity"] == "info"
        assert rule["labels"]["level"] == "target" and "(last_over_time(run:gpu_training_cause:share{" in rule["expr"]
        assert ("unless on (cluster, uuid, run, rank)\n    max by (cluster, uuid, run, rank) (min_over_time("
                "run:gpu_useful_utilization:avg5m[10m])) < 0.3\n") in rule["expr"]


def test_below_target_alert_leaves_low_gpus_and_known_causes_to_their_alerts() -> None:
    """GpuUtilizationBelowTarget: the held 5m mean below the target, less the GPUs low within alert_hold
    (GpuUtilizationLow's) and those with a cause within it (the cause alerts'), same for: as GpuUtilizationLow."""
    found = alerts()
    rule, low = found["GpuUtilizationBelowTarget"], found["GpuUtilizationLow"]
    assert rule["labels"] == {"severity": "info"} and rule["for"] == low["for"]
    # Both judge the level at the GPU's useful utilization (its live run's time in collectives does not count).
    assert rule["expr"].startswith("(\n    min_over_time(gpu:gpu_useful_utilization:avg5m[10m]) < 0.85\n")
    assert low["expr"].startswith("(\n    min_over_time(gpu:gpu_useful_utilization:avg5m[10m]) < 0.3\n")
    assert "unless on (cluster, uuid)\n    max by (cluster, uuid) (min_over_time(gpu:gpu_useful_utilization:avg5m" \
        "[10m])) < 0.3\n" in rule["expr"]
    assert "unless on (cluster, uuid)\n    max by (cluster, uuid) (last_over_time(run:gpu_training_cause:share[10m]))" \
        in rule["expr"]


def test_runbook_urls_and_cluster_label_come_from_the_config() -> None:
    from monitoring import build

    gen = load_generator()
    values = read_thresholds_file().with_values(cluster_label="region",
                                               runbook_url_pattern="https://wiki.example.com/gpu/{anchor}")
    text = "".join(gen.generate(build(values)).values())
    assert "runbook_url: https://wiki.example.com/gpu/gpuutilizationlow" in text
    assert "github.com" not in text
    assert "on (region, uuid)" in text and "by (region, uuid)" in text
    assert "on (uuid)" not in text and "by (uuid)" not in text and "by (node)" not in text


def test_anchor_helper_matches_github_style() -> None:
    assert anchors("## GpuUtilizationLow\n### Two words, here\n") == {"gpuutilizationlow", "two-words-here"}


def test_generated_groups_hold_exactly_the_model_rules() -> None:
    """The generated rule groups are written from the model's objects (monitoring.model), in order, and
    each alert that compares keeps its comparison as a part (operator, thresholds.yml key), so the
    Grafana mirror takes the bare query instead of cutting the comparison out of the text."""
    from monitoring import build
    from monitoring.model import Alert

    model = build()
    cfg = model.config
    groups = {g["name"]: g["rules"] for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]}
    generated = {a.group for a in model.alerts} | {r.group for r in model.records}
    from gpu_exporter.verdict.causes import CAUSES
    from gpu_exporter.verdict.efficiency import EFFICIENCY
    assert generated == {"gpu-utilization.alerts", "gpu-utilization.recording", "gpu-process-evidence.alerts",
                         "gpu-process-evidence.recording", "gpu-remedy.recording", "gpu-cost.recording",
                         *(f"gpu-cause-{c.cause}.{kind}" for c in CAUSES for kind in ("recording", "alerts")),
                         "gpu-efficiency.recording", *(f"gpu-efficiency-{c.cause}.alerts" for c in EFFICIENCY),
                         }  # one group per cause: docs/fleet.md
    for name in generated:
        objects = model.group(name)
        names = [r.get("alert") or r["record"] for r in groups[name]]
        start = names.index(objects[0].name)  # the levels sit inside the written gpu-utilization.recording
        assert names[start:start + len(objects)] == [o.name for o in objects], name
        assert (start == 0 and len(names) == len(objects)) or name == "gpu-utilization.recording", name
        for rule, obj in zip(groups[name][start:], objects, strict=False):
            expr = obj.expr() if isinstance(obj, Alert) else obj.expr
            assert rule["expr"].strip() == gen_render(expr, cfg).strip(), obj.name
    compared = [a for a in model.alerts if a.op]
    # the efficiency alerts compare nothing of their own: each fires while its cause held within alert_hold
    assert {a.name for a in compared} == {"GpuUtilizationLow", "GpuUtilizationBelowTarget", "GpuIdleButAllocated"}
    for alert in compared:
        comparison = f" {alert.op} {cfg.text(alert.threshold)}"
        assert comparison in gen_render(alert.expr(), cfg)
        assert gen_render(alert.expr(compared=False), cfg) == gen_render(alert.expr(), cfg).replace(comparison, "", 1)


def gen_render(text: str, cfg: Any) -> str:
    return str(load_generator().render(text, cfg))


def test_runbook_links_come_from_the_alert_names_and_every_group_is_spliced() -> None:
    """One pass gives every alert of a rules file (generated or hand-written) the runbook section named
    after it; a ``${runbook_url}`` outside an alert, and a generated group no template splices, are errors."""
    from dataclasses import replace

    from monitoring import build

    gen = load_generator()
    text = "      - alert: GpuMissing\n        annotations:\n          runbook_url: ${runbook_url}\n"
    assert gen.runbooks(text).endswith("runbook_url: ${runbook_url_pattern:gpumissing}\n")
    with pytest.raises(KeyError, match="outside an alert"):
        gen.runbooks("groups: # ${runbook_url}\n")
    model = build()
    lost = replace(model, records=(*model.records, replace(model.records[0], group="gpu-nowhere.recording")))
    with pytest.raises(ValueError, match=r"gpu-nowhere\.recording"):
        gen.generate(lost)

