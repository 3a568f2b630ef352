"""The image, built for real with podman from the Dockerfile, and run: alone, beside a training job,
scraped by a real Prometheus, and as docker-compose.yml's stack.

The image is built once per run of this module (podman caches the layers) on a Debian bookworm
base made with debootstrap (``scripts/container-base.sh``; no registry is reachable here) with the
build command of ``scripts/release.py``. The containers run with host networking on a free
127.0.0.1 port (the compose stack: in a network namespace of its own), with the hardening the docs
recommend: read-only root filesystem, all capabilities dropped, no new privileges. GPUs are
simulated (``--simulate``). The tests skip only where podman cannot run at all.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import release
import torch
import yaml
from containers import (
    STAND_INS,
    Container,
    Image,
    compose_order,
    compose_run_options,
    container,
    podman,
    stand_in_options,
    wait_healthy,
)
from gpu_exporter.simulate.scenario import load_scenario
from gpu_exporter.thresholds import load_thresholds

from testbed import free_port, http_get, http_status, promql, run_prometheus, wait_until

REPO = Path(__file__).resolve().parents[1]
PROM = REPO / "prometheus"
HARDENING = ["--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
VENV = "/opt/gpu-exporter"

pytestmark = [pytest.mark.slow, pytest.mark.container]


@pytest.fixture(scope="module")
def image(container_image: Image) -> Image:
    """The image (built once per session: conftest.py)."""
    return container_image


def exporter(image: Image, *args: str) -> tuple[str, contextlib.AbstractContextManager[Container]]:
    """(URL, context manager) for the exporter image serving on a free loopback port."""
    port = free_port()
    options = [*HARDENING, "--env", f"HEALTHCHECK_URL=http://127.0.0.1:{port}/readyz",
               # podman runs HEALTHCHECKs from systemd timers; without systemd the test runs it by hand
               "--health-interval", "disable"]
    return f"http://127.0.0.1:{port}", container(image.tag, [*args, "--web.listen-address", f"127.0.0.1:{port}"],
                                                  options)


def wait_ready(url: str, box: Container) -> None:
    def ready() -> bool:
        if not box.running():
            raise RuntimeError(f"exporter container exited: {box.logs()}")
        return http_status(url + "/readyz")[0] == 200
    try:
        wait_until(ready, 60, what="the exporter container's /readyz")
    except TimeoutError as err:
        raise AssertionError(f"{err}\n{box.logs()}") from err


@pytest.mark.usefixtures("compose_stack")  # started first: its minute-long rule rounds run during the other tests
def test_image_labels_size_and_no_pip(image: Image) -> None:
    meta = image.inspect()
    labels = meta["Labels"]
    assert labels["org.opencontainers.image.version"] == release.package_version()
    assert labels["org.opencontainers.image.base.name"] == image.base
    assert labels["org.opencontainers.image.title"] == "gpu-utilization-exporter"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    # --format docker keeps the HEALTHCHECK (podman's default OCI format drops it)
    assert meta["Healthcheck"]["Test"][:3] == ["CMD", "python", "-c"]
    assert meta["Config"]["User"] == "10001:10001"
    listing = podman("run", "--rm", "--network", "none", "--workdir", VENV, *release.run_limits(),
                     "--entrypoint", "python", image.tag, "-c",
                     "import importlib.util as u, os, sys, sysconfig; "
                     "print(sys.prefix); print([m for m in ('pip', 'setuptools') if u.find_spec(m)]); "
                     "print(sorted(os.listdir('bin'))); print(sorted(os.listdir(sysconfig.get_paths()['purelib'])))")
    prefix, importable, bin_names, site = listing.stdout.strip().splitlines()
    assert prefix == VENV
    assert importable == "[]", f"the runtime venv still has {importable}"
    assert not re.search(r"'(pip|easy_install)", bin_names), bin_names
    assert not re.search(r"'(pip|setuptools)[-_.]", site), site
    # what the Dockerfile adds to its base (the venv, the user): the rest is the base's own size
    base_size = int(json.loads(podman("image", "inspect", image.base).stdout)[0]["Size"])
    added = int(meta["Size"]) - base_size
    print(f"\nimage {image.tag}: {int(meta['Size']) / 1e6:.0f} MB on {image.base} ({base_size / 1e6:.0f} MB), "
          f"the Dockerfile adds {added / 1e6:.0f} MB; build {image.build_seconds:.0f} s")
    # about 29 MB of Python packages plus py-spy's 8 MB binary (the sampling extra)
    assert added < 48e6, f"the Dockerfile adds {added / 1e6:.0f} MB to its base"


@pytest.fixture(scope="module")
def simulated(image: Image) -> Iterator[tuple[str, Container]]:
    """One hardened exporter container on the default simulated node, ready; (URL, container). Its tests
    only read it."""
    url, running = exporter(image, "--simulate")
    with running as box:
        wait_ready(url, box)
        yield url, box


def test_exporter_container_simulated_hardened_and_healthy(simulated: tuple[str, Container]) -> None:
    url, box = simulated
    metrics = http_get(url + "/metrics")
    assert metrics.count("gpu_info{") >= 1 and "gpu_utilization_ratio{" in metrics
    state = box.inspect()
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    status = Path(f"/proc/{state['State']['Pid']}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Uid"].split() == ["10001"] * 4, fields["Uid"]
    for capabilities in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[capabilities], 16) == 0, (capabilities, fields[capabilities])
    write = box.exec("sh", "-c", "touch /opt/gpu-exporter/x")
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    check = podman("healthcheck", "run", box.name, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    health = box.inspect()["State"]["Health"]
    assert health["Status"] == "healthy" and health["Log"][-1]["ExitCode"] == 0, health


def followed_gpu(scenario: str) -> tuple[str, float]:
    """UUID and idle utilization of the scenario's GPU that follows a training job's phases."""
    (gpu,) = [gpu for gpu in load_scenario(scenario).gpus if gpu.follow_training]
    return gpu.uuid, gpu.idle_utilization


@pytest.fixture
def training_options() -> list[str]:
    """A training container: the Debian base's Python with this repository's library and examples,
    and the CPU torch of the test environment, all mounted read-only."""
    site_packages = Path(torch.__file__).resolve().parents[1]
    return ["--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--volume", f"{REPO / 'exporter'}:/src/exporter:ro", "--volume", f"{REPO / 'examples'}:/examples:ro",
            "--volume", f"{site_packages}:/opt/torch-site:ro", "--env", "PYTHONPATH=/src/exporter:/opt/torch-site"]


def test_exporter_beside_a_training_job(image: Image, training_options: list[str]) -> None:
    uuid, idle = followed_gpu("demo-training")
    url, running = exporter(image, "--simulate", "demo-training", "--poll-interval", "0.5")
    with running as box:
        wait_ready(url, box)
        assert f'uuid="{uuid}"' in http_get(url + "/metrics")
        # as docs/deployment.md tells users: the exporter's URL and the GPU's UUID in the job's environment
        job_env = ["--env", f"GPU_EXPORTER_URL={url}", "--env", f"CUDA_VISIBLE_DEVICES={uuid}"]
        job = ["python", "/examples/train_resnet_like.py", "--loader", "slow", "--seconds", "120",
               "--decode-ms", "40", "--width", "16", "--push-interval", "0.5"]
        with container(image.base, job, [*training_options, *job_env], prefix="gpu-exporter-test-job") as trainer:
            window = 8

            def trained_seconds() -> float:
                if not trainer.running():
                    raise RuntimeError(f"training container exited: {trainer.logs()}")
                text = http_get(url + "/metrics")
                return sum(float(v) for v in re.findall(
                    rf'gpu_training_phase_seconds_total{{phase="(?:data|compute)",[^}}]*uuid="{uuid}"}} (\S+)', text))
            # the run's own clock: enough data + compute time reported to fill a diagnosis window
            wait_until(lambda: trained_seconds() > window, 120, interval=1, what="the job's phase metrics")
            result = box.exec("gpu-exporter", "diagnose", "--url", url, "--window", str(window), "--output", "json")
            metrics = http_get(url + "/metrics")
            assert trainer.running(), trainer.logs()
    assert result.returncode == 1, result.stdout + result.stderr  # 1: a GPU is below the target
    gpus = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
    gpu = gpus[uuid]
    assert gpu["verdict"]["verdict"] == "input_bound", gpu
    (run,) = gpu["runs"]
    assert run["run"] == "resnet-like-slow" and run["shares"]["data"] > 0.5, run
    for phase in ("data", "compute"):
        assert re.search(rf'gpu_training_phase_seconds_total{{phase="{phase}",[^}}]*run="resnet-like-slow"', metrics)
    # the simulated GPU follows the job: above its idle level while the job computes, below the low threshold
    assert idle < gpu["utilization"] < load_thresholds().utilization_low_threshold, gpu


def prometheus_config(target: str) -> str:
    """prometheus/prometheus.yml with the exporter container as the target and 1 s intervals."""
    config: dict[str, Any] = yaml.safe_load((PROM / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config.pop("alerting")
    (job,) = config["scrape_configs"]
    job["static_configs"][0]["targets"] = [target]
    return str(yaml.safe_dump(config))


def test_prometheus_scrapes_the_container_and_the_rules_evaluate(simulated: tuple[str, Container]) -> None:
    config = prometheus_config("placeholder")
    rules = {p: (PROM / p).read_text() for p in yaml.safe_load(config)["rule_files"]}
    url, _ = simulated
    target = url.removeprefix("http://")
    with run_prometheus(prometheus_config(target), rules) as prom:
        def evaluated() -> list[dict[str, Any]] | None:
            groups = json.loads(http_get(prom + "/api/v1/rules"))["data"]["groups"]
            found = [rule for group in groups for rule in group["rules"]]
            if promql(prom, "gpu:gpu_utilization:avg5m") and all(
                    rule.get("lastEvaluation", "0001").startswith("20") for rule in found):
                return found
            return None
        evaluated_rules = wait_until(evaluated, 90, interval=1, what="every rule to be evaluated")
        up = promql(prom, "up")
        utilization = promql(prom, "gpu:gpu_utilization:avg5m")
        measured = promql(prom, "gpu_utilization_ratio")
    assert [s["metric"]["instance"] for s in up] == [target] and up[0]["value"][1] == "1"
    # one interval mean per GPU with a utilization reading (a GPU in MIG mode has none)
    assert {s["metric"]["uuid"] for s in utilization} == {s["metric"]["uuid"] for s in measured} != set()
    bad = [(r["name"], r.get("lastError")) for r in evaluated_rules if r["health"] != "ok"]
    assert not bad, bad
    assert len(evaluated_rules) == sum(len(g["rules"]) for text in rules.values()
                                       for g in yaml.safe_load(text)["groups"])



ComposeServices = dict[str, dict[str, Any]]


def start_compose(stack: contextlib.ExitStack, image: Image, tmp: Path) -> tuple[ComposeServices, dict[str, Container]]:
    """Start docker-compose.yml's simulate profile (less Grafana, which cannot be fetched here) under podman.

    Each service runs with its compose command, environment, mounts, hardening and healthcheck, in
    depends_on order, each started once the services it depends on pass their healthchecks. They
    share one network namespace that has only a loopback interface, where the compose service names
    resolve to 127.0.0.1: prometheus/prometheus.yml's targets (exporter:9445, alertmanager:9093) are
    used unchanged. Prometheus and Alertmanager are Debian's builds on the Debian base (STAND_INS).
    """
    compose: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = {name: s for name, s in compose["services"].items()
                if "simulate" in s.get("profiles", ["simulate"]) and name != "grafana"}
    assert set(services) == {"exporter-simulated", "training-demo", "prometheus", "alertmanager"}
    hosts = tmp / "hosts"
    hosts.write_text("127.0.0.1 localhost " + " ".join(sorted({*services, "exporter"})) + "\n")
    holder = stack.enter_context(container(image.base, ["sleep", "infinity"], ["--read-only"],
                                           prefix="gpu-exporter-test-net", network="none"))
    running: dict[str, Container] = {}
    for name in compose_order(services):
        service = services[name]
        for dependency in service.get("depends_on", {}):
            wait_healthy(running[dependency], 180)
        options = [*compose_run_options(service, REPO), "--volume", f"{hosts}:/etc/hosts:ro"]
        repository = service["image"].split(":")[0]
        if "build" in service:
            assert service["image"] == f"{release.IMAGE_NAME}:{release.package_version()}"
            box_image = image.tag
        elif repository in STAND_INS:
            options += stand_in_options(repository)
            box_image = image.base
        else:  # training-demo: the Debian base's Python stands in for python:3.12-slim
            # the exporter image's own base (docs/deployment.md: the demo downloads no second base)
            base_arg = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), flags=re.M)
            assert base_arg is not None and service["image"] == base_arg.group(1), service["image"]
            box_image = image.base
        running[name] = stack.enter_context(container(
            box_image, [str(a) for a in service.get("command", [])], options,
            prefix=f"gpu-exporter-test-{name}", network=f"container:{holder.name}"))
    for box in running.values():
        wait_healthy(box, 180)
    return services, running


@pytest.fixture(scope="module")
def compose_stack(image: Image, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[tuple[ComposeServices, dict[str, Container]] | Exception]:
    """The compose stack (:func:`start_compose`), started once per module. The first test of the module asks for it
    (usefixtures), so that Prometheus' first scrapes and minute-long rule rounds run while the other tests do; a
    failure to start it is yielded, and raised by the compose test alone."""
    with contextlib.ExitStack() as stack:
        started: tuple[ComposeServices, dict[str, Container]] | Exception
        try:
            started = start_compose(stack, image, tmp_path_factory.mktemp("compose"))
        except Exception as err:
            started = err
        yield started


def test_compose_stack_runs_under_podman(
        compose_stack: tuple[ComposeServices, dict[str, Container]] | Exception) -> None:
    """docker-compose.yml's simulate profile under podman (:func:`start_compose`): the exporter scraped, the cause
    recording rules judging the demo run, Alertmanager connected, every rule group evaluated without error."""
    if isinstance(compose_stack, Exception):
        raise compose_stack
    services, running = compose_stack
    exporter_box = running["exporter-simulated"]

    def ask(url: str) -> Any:
        result = exporter_box.exec("python", "-c", "import sys, urllib.request; "
                                   "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())", url)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def diagnosed() -> dict[str, Any] | None:
        """diagnose from Prometheus, once the cause recording rules have judged the demo run."""
        series = ask("http://prometheus:9090/api/v1/query?query=run%3Agpu_training_cause%3Ashare")
        if not series["data"]["result"]:
            return None
        result = exporter_box.exec("gpu-exporter", "diagnose", "--prometheus-url", "http://prometheus:9090",
                                   "--output", "json")
        assert result.returncode in (0, 1), result.stderr
        gpus: dict[str, Any] = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
        return gpus
    # scrape and rule evaluation every 15 s (prometheus.yml as shipped): a few rounds
    gpus = wait_until(diagnosed, 240, interval=2, what="a cause from Prometheus' recording rules")
    up = ask("http://prometheus:9090/api/v1/query?query=up")["data"]["result"]
    managers = ask("http://prometheus:9090/api/v1/alertmanagers")["data"]["activeAlertmanagers"]

    def evaluated() -> list[Any] | None:
        """The rule groups once each has run (every rule_interval, thresholds.yml: the shipped rules as-is)."""
        groups: list[Any] = ask("http://prometheus:9090/api/v1/rules")["data"]["groups"]
        return groups if all(rule["health"] != "unknown" for g in groups for rule in g["rules"]) else None
    rules = wait_until(evaluated, 150, interval=5, what="every rule group's first evaluation")
    assert [(s["metric"]["instance"], s["value"][1]) for s in up] == [("exporter:9445", "1")]
    assert [m["url"] for m in managers] == ["http://alertmanager:9093/api/v2/alerts"]
    assert all(rule["health"] == "ok" for group in rules for rule in group["rules"]), rules
    uuid = services["training-demo"]["environment"]["CUDA_VISIBLE_DEVICES"]
    assert gpus[uuid]["verdict"]["verdict"] == "input_bound", gpus[uuid]
