"""docker-compose.yml: valid per the Compose specification, every mount exists, the parts fit together.

The schema check uses the ``compose-spec`` package (bindings of the Rust ``compose_spec`` parser,
which rejects unknown keys and wrong types) and Debian's docker-compose 1.29 (``config``, which
needs no engine). No Docker engine runs here, so the simulated exporter's command is run as a plain
process; tests/test_container.py runs the services under podman.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_spec import PyCompose
from gpu_exporter.simulate.scenario import load_scenario
from test_docker import stages

from testbed import http_get, run_exporter

REPO = Path(__file__).resolve().parents[1]
COMPOSE_TEXT = (REPO / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, Any] = COMPOSE["services"]


def bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path, container path) of the service's bind mounts (named volumes skipped)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append(((REPO / source).resolve(), target))
    return mounts


def host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """Where a path inside the container comes from on the host, through the bind mounts."""
    for source, target in bind_mounts(service):
        if container_path == target:
            return source
        if container_path.startswith(target.rstrip("/") + "/"):
            return source / container_path[len(target.rstrip("/")) + 1:]
    return None


def test_valid_per_the_compose_specification() -> None:
    compose = PyCompose.from_yaml(COMPOSE_TEXT)
    compose.validate()
    assert set(compose.service_names()) == {"exporter", "exporter-simulated", "training-demo",
                                            "prometheus", "alertmanager", "grafana"}


def test_the_schema_check_rejects_mistakes() -> None:
    bad = COMPOSE_TEXT.replace("pid: host", "pids: host")
    with pytest.raises(ValueError, match="pids"):
        PyCompose.from_yaml(bad).validate()


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_bind_mount_exists(name: str) -> None:
    for source, target in bind_mounts(SERVICES[name]):
        assert source.exists(), f"{name} mounts {source} at {target}, which does not exist"
        if Path(target).suffix in (".yml", ".yaml"):
            assert source.is_file(), f"{name}: {source} should be a file"


def test_gpu_exporter_gets_the_gpus_and_the_host_pids() -> None:
    exporter = SERVICES["exporter"]
    assert exporter["pid"] == "host" and exporter["profiles"] == ["gpu"]
    (device,) = exporter["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and set(device["capabilities"]) == {"gpu", "utility"}
    assert exporter["cap_drop"] == ["ALL"] and exporter["read_only"] is True


def test_prometheus_finds_its_rules_the_exporter_and_alertmanager() -> None:
    prometheus = SERVICES["prometheus"]
    config_path = host_path(prometheus, "/etc/prometheus/prometheus.yml")
    assert config_path is not None
    config = yaml.safe_load(config_path.read_text())
    for rule_file in config["rule_files"]:
        resolved = host_path(prometheus, "/etc/prometheus/" + rule_file)
        assert resolved is not None and resolved.is_file(), f"rule file {rule_file} is not mounted"
    names = set(SERVICES) | {alias for s in SERVICES.values()
                             for net in (s.get("networks") or {}).values() for alias in (net or {}).get("aliases", [])}
    targets = [t for job in config["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]]
    assert "exporter:9445" in targets
    for target in targets:
        assert target.split(":")[0] in names, f"scrape target {target} is no compose service"
    alertmanagers = [t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"]
                     for t in sc["targets"]]
    assert alertmanagers == ["alertmanager:9093"]
    assert host_path(SERVICES["alertmanager"], "/etc/alertmanager/alertmanager.yml") is not None


def test_both_exporters_answer_as_exporter_and_one_profile_each() -> None:
    simulated = SERVICES["exporter-simulated"]
    assert simulated["networks"]["default"]["aliases"] == ["exporter"]
    assert simulated["profiles"] == ["simulate"] and SERVICES["training-demo"]["profiles"] == ["simulate"]
    for always in ("prometheus", "alertmanager", "grafana"):
        assert "profiles" not in SERVICES[always]


def test_grafana_provisioning_matches_the_mounts() -> None:
    grafana = SERVICES["grafana"]
    assert grafana["environment"]["PROMETHEUS_URL"] == "http://prometheus:9090"
    datasources = host_path(grafana, "/etc/grafana/provisioning/datasources")
    assert datasources is not None and any(datasources.glob("*.yml"))
    # Grafana-managed alerts stay unmounted: Prometheus already sends them to Alertmanager.
    assert host_path(grafana, "/etc/grafana/provisioning/alerting") is None
    providers = host_path(grafana, "/etc/grafana/provisioning/dashboards")
    assert providers is not None
    for provider_file in providers.glob("*.yml"):
        for provider in yaml.safe_load(provider_file.read_text())["providers"]:
            dashboards = host_path(grafana, provider["options"]["path"])
            assert dashboards is not None and any(dashboards.glob("*.json"))


def test_training_demo_script_is_mounted() -> None:
    demo = SERVICES["training-demo"]
    script = host_path(demo, demo["command"][1])
    assert script is not None and script.is_file(), f"{demo['command'][1]} is not in examples/"
    assert demo["environment"]["GPU_EXPORTER_URL"] == "http://exporter:9445"
    library = host_path(demo, demo["environment"]["PYTHONPATH"] + "/gpu_exporter/training/__init__.py")
    assert library is not None and library.is_file()


def test_simulated_exporter_command_serves_metrics() -> None:
    simulated = SERVICES["exporter-simulated"]
    args = list(simulated["command"])
    scenario = host_path(simulated, args[1])
    assert scenario is not None and scenario.is_file()
    args[1] = str(scenario)
    with run_exporter(args) as url:
        assert "gpu_info{" in http_get(url + "/metrics")


def test_docker_compose_1_29_accepts_the_file() -> None:
    """Debian's docker-compose 1.29 validates without an engine (it rejected a top-level ``name:``)."""
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail("docker-compose is not installed: bash tests/run.sh installs Debian's docker-compose")
    for profile in ("gpu", "simulate"):
        result = subprocess.run([binary, "--profile", profile, "config", "--quiet"], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    assert "name" not in COMPOSE


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_is_checked_and_waits_for_healthy_services(name: str) -> None:
    service = SERVICES[name]
    check = service["healthcheck"]
    assert check["test"][0] == "CMD" and len(check["test"]) > 1
    for key in ("interval", "timeout", "start_period", "retries"):
        assert key in check, f"{name}: healthcheck has no {key}"
    depends_on = service.get("depends_on", {})
    assert isinstance(depends_on, dict), f"{name}: depends_on must use the long form with a condition"
    for dependency, how in depends_on.items():
        assert how == {"condition": "service_healthy"}, (name, dependency, how)
        assert "healthcheck" in SERVICES[dependency]
        # a service must not wait for one that only runs in another profile
        assert set(SERVICES[dependency].get("profiles", [])) <= set(service.get("profiles", [])), (name, dependency)


def test_exporter_healthchecks_are_the_images() -> None:
    """The compose healthcheck repeats the Dockerfile's HEALTHCHECK: the same command and timings."""
    runtime = dict(stages()[1])
    options, _, command = runtime["HEALTHCHECK"].partition(" CMD ")
    flags = dict(flag.removeprefix("--").split("=") for flag in options.split())
    for name in ("exporter", "exporter-simulated"):
        check = SERVICES[name]["healthcheck"]
        assert check["test"] == ["CMD", *json.loads(command)]
        assert (check["interval"], check["timeout"], check["start_period"], str(check["retries"])) == (
            flags["interval"], flags["timeout"], flags["start-period"], flags["retries"])


def test_training_demo_follows_the_simulated_gpu() -> None:
    """training-demo names the simulated GPU that follows a training job, and its healthcheck its run."""
    scenario_arg = SERVICES["exporter-simulated"]["command"][1]
    scenario = host_path(SERVICES["exporter-simulated"], scenario_arg)
    assert scenario is not None
    followed = [gpu.uuid for gpu in load_scenario(scenario).gpus if gpu.follow_training]
    demo = SERVICES["training-demo"]
    assert demo["environment"]["CUDA_VISIBLE_DEVICES"] == followed[0]
    command = demo["command"]
    run = command[command.index("--run") + 1]
    assert f"b'run=\"{run}\"' in" in demo["healthcheck"]["test"][-1]


def debian_version(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed: bash tests/run.sh installs it")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    match = re.search(r"version (\d+\.\d+\.\d+)", out.stdout + out.stderr)
    assert match is not None, out
    return match.group(1)


def test_prometheus_and_alertmanager_are_the_versions_the_tests_run() -> None:
    assert SERVICES["prometheus"]["image"] == f"prom/prometheus:v{debian_version('prometheus')}"
    assert SERVICES["alertmanager"]["image"] == f"prom/alertmanager:v{debian_version('prometheus-alertmanager')}"
