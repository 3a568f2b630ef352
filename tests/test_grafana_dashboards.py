"""Grafana dashboards: generated from the one config, valid for Grafana 12 and 13, and every query
returns data from a real Prometheus scraping real exporters, with and without a cluster label.

The live part starts, once for the module: a fake kubelet (pod attribution), the real exporter on a
simulated node (tests/scenarios/grafana-node.yaml: a Hopper GPU with XID errors, a MIG GPU, a throttled
GPU with a fan) whose targets carry ``cluster="east"``, a second exporter on the packaged default
scenario with no cluster label, a stand-in kubelet target (not an exporter job), an instrumented
training loop pushing phases through gpu_exporter.training (input-bound, with allocator retries), and a
real Prometheus scraping all of them every second with the generated recording rules. Each variable
query, each panel query (variables set as Grafana would, ``$__rate_interval``, ``$__interval``,
``$__interval_ms`` and ``$__range`` replaced by durations, a textbox variable by its default) and each
Grafana-managed alert query must parse and return data, both with every variable on All and with the
cluster variable on ``east``.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from fake_kubelet import FakeKubelet
from gpu_exporter import catalog, training
from gpu_exporter.kubernetes import api_pb2
from gpu_exporter.simulate import dcgm_exporter
from gpu_exporter.simulate.scenario import parse_scenario
from gpu_exporter.thresholds import ThresholdsError, read_thresholds_file
from gpu_exporter.training import device as training_device
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from monitoring import build, dashboards, grafana_alerts
from monitoring.panels import Config
from testbed import free_port, http_status, promql, run_exporter, run_prometheus, wait_until

REPO = Path(__file__).resolve().parents[1]
THRESHOLDS = REPO / "exporter" / "gpu_exporter" / "thresholds.yml"
DASHBOARDS = REPO / "grafana" / "dashboards"
SCHEMA = REPO / "tests" / "schema"
SCENARIO = REPO / "tests" / "scenarios" / "grafana-node.yaml"
UNLABELLED = REPO / "exporter" / "gpu_exporter" / "simulate" / "scenarios" / "default.yaml"
NODE, OTHER_NODE, CLUSTER = "sim-node-1", "sim-node-2", "east"
# Prometheus' own series the dashboards may use besides the exporter's metrics and recording rules, and
# dcgm-exporter's profiling fields (catalog.DCGM: the effective-utilization panels read them where GPM is absent).
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", *(series.name for series in catalog.DCGM)}
# Grafana's macros as the test's Prometheus (1 s scrapes, a 20 s panel range) makes them.
MACROS = {"__rate_interval": "5s", "__interval": "1s", "__interval_ms": "1000", "__range": "1h"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                "bool", "offset", "inf", "nan"}


class Query(NamedTuple):
    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for panel in dash["panels"] for p in (panel, *panel.get("panels", []))]


def panel_queries() -> list[Query]:
    return [Query(name, p["title"], t["refId"], t["expr"], bool(t.get("instant")) and not t.get("range"))
            for name, dash in load_dashboards().items() for p in panels(dash) for t in p.get("targets", [])]


def variable_query(var: dict[str, Any]) -> str:
    query = var["query"]
    return str(query["query"] if isinstance(query, dict) else query)


def alert_queries() -> list[Query]:
    out: list[Query] = []
    for path in sorted((REPO / "grafana" / "provisioning" / "alerting").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out.extend(Query("alerting", rule["title"], q["refId"], q["model"]["expr"], True)
                           for q in rule["data"] if "expr" in q["model"])
    return out


def documented_metrics() -> set[str]:
    text = (REPO / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\|\s*`?([a-z_:][a-z0-9_:]*)`?\s*\|", text, re.MULTILINE))


def recorded_metrics() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(r["record"] for r in group["rules"] if "record" in r)
    return names


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects: identifiers left after dropping strings, matchers, ranges,
    grouping clauses, function calls and keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        if match.group(2) is None and match.group(1).lower() not in PROMQL_WORDS:
            names.add(match.group(1))
    return names


# --------------------------------------------------------------------------------- generated, offline


def test_config_reaches_every_query_and_colour() -> None:
    """Another threshold, target, cluster label, exporter job and runbook URL pattern in the config
    change every dashboard and alert: nothing the config holds is typed into the generator."""
    model = build(read_thresholds_file().with_values(
        utilization_low_threshold=0.42, utilization_target=0.77, cluster_label="k8s_cluster",
        dashboard_temperature_warn_celsius=71, exporter_job_regex="gpux.*", dashboard_time_below_warn=0.33,
        runbook_url_pattern="https://runbooks.example/gpu#{anchor}"))
    text = "".join(dashboards.generate(model).values())
    boards = [json.loads(t) for t in dashboards.generate(model).values()]
    exprs = [t["expr"] for d in boards for p in panels(d) for t in p.get("targets", [])]
    assert all('k8s_cluster=~"$cluster"' in e for e in exprs), [e for e in exprs if "k8s_cluster" not in e]
    assert not any(re.search(r"\bcluster\b", e.replace("$cluster", "")) for e in exprs)
    assert "< 0.42" in text and "< 0.3)" not in text and "below 42%" in text
    steps = [s["value"] for d in boards for p in panels(d) if p["type"] != "row"
             for s in p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])]
    assert 0.42 in steps and 0.77 in steps and 71 in steps and 0.3 not in steps and 0.85 not in steps
    assert any('up{job=~"gpux.*", k8s_cluster=~"$cluster"' in e for e in exprs)
    alerts = "".join(grafana_alerts.generate(model).values())
    assert "- 0.42" in alerts and "k8s_cluster" in alerts
    for generated in (text, alerts):
        assert "https://runbooks.example/gpu#gputraininginputbound" in generated and "github.com" not in generated


@pytest.mark.parametrize(("change", "message"), [
    (("dashboard_memory_warn_ratio: 0.8\n", ""), "lacks the key dashboard_memory_warn_ratio"),
    (("utilization_target: 0.85", "utilization_target: high"), "utilization_target must be a number, got 'high'"),
    (("dashboard_time_below_warn: 0.3", "dashboard_time_below_warn: 3"),
     "dashboard_time_below_warn must be a ratio between 0 and 1, got 3"),
    (("dashboard_temperature_critical_celsius: 90", "dashboard_temperature_critical_celsius: 70"),
     "dashboard_temperature_critical_celsius must be at least dashboard_temperature_warn_celsius"),
    (("cluster_label: cluster", "cluster_label: k8s-cluster"), "cluster_label must be a Prometheus label name"),
    (("idle_for: 30m", "idle_for: half an hour"), "idle_for: 'half an hour' is not a duration"),
    (("xid_window: 10m", "xid_windw: 10m"), "unknown threshold 'xid_windw'"),
])
def test_bad_config_is_one_clear_error(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    """A missing, mistyped, out-of-range or unknown key stops the generators (one typed loader,
    gpu_exporter.thresholds) with one line naming the file, the line and the key."""
    text = THRESHOLDS.read_text()
    assert change[0] in text
    bad = tmp_path / "thresholds.yml"
    bad.write_text(text.replace(change[0], change[1]))
    with pytest.raises(ThresholdsError) as err:
        build(read_thresholds_file(bad))
    line = text[:text.index(change[0])].count("\n") + 1  # the changed key's line, or the next key's
    where = f"{bad} " if message.startswith("lacks") else f"{bad}:{line}: "
    assert str(err.value).startswith(where) and message in str(err.value) and "\n" not in str(err.value)


def kept(original: Any, decoded: Any, path: str = "") -> list[str]:
    """Paths of ``original`` that ``decoded`` lost or changed (the SDK may add its defaults)."""
    if isinstance(original, dict) and isinstance(decoded, dict):
        return [lost for key, value in original.items()
                for lost in ([f"{path}/{key}"] if key not in decoded else kept(value, decoded[key], f"{path}/{key}"))]
    if isinstance(original, list) and isinstance(decoded, list) and len(original) == len(decoded):
        return [lost for i, (a, b) in enumerate(zip(original, decoded, strict=True))
                for lost in kept(a, b, f"{path}[{i}]")]
    return [] if original == decoded else [path]


def test_dashboards_load_back_in_the_sdk() -> None:
    """Each committed JSON decodes into the SDK's Dashboard model (panel options and queries typed by
    their plugins) and encodes back with nothing lost or changed."""
    plugins.register_default_plugins()
    for name, data in load_dashboards().items():
        model = dm.Dashboard.from_json(data)
        assert model.uid == data["uid"] and model.panels and len(model.panels) == len(data["panels"]), name
        assert kept(data, json.loads(json.dumps(model, cls=JSONEncoder))) == [], name
    assert kept({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}], "c": 0}) == ["/a[1]/b"]


def test_no_table_footer_and_exporter_panels_filter_on_the_exporter_job() -> None:
    """Grafana 13's table options have no footer; "Exporters up" and scrape duration count only exporter
    targets (a kubelet target carries ``up`` and ``scrape_duration_seconds`` too)."""
    boards = load_dashboards()
    for dash in boards.values():
        for p in panels(dash):
            assert "footer" not in p.get("options", {}), p["title"]
    job = Config.load().exporter_job
    health = {p["title"]: p for p in panels(boards["gpu-exporter-health"])}
    for title in ("Exporters up", "Sample age and scrape duration"):
        for t in health[title]["targets"]:
            if re.search(r"\b(up|scrape_duration_seconds)\{", t["expr"]):
                assert f'job=~"{job}"' in t["expr"], (title, t["expr"])


def test_every_metric_is_documented_or_recorded() -> None:
    known = documented_metrics() | recorded_metrics() | PROMETHEUS_SERIES
    used = {name for q in panel_queries() + alert_queries() for name in metric_names(q.expr)}
    assert used, "no metric names found"
    assert used - known == set(), "not in docs/metrics.md nor a recording rule"


def test_docs_describe_every_panel() -> None:
    doc = (REPO / "docs" / "dashboards.md").read_text()
    for dash in load_dashboards().values():
        assert dash["title"] in doc
        for p in panels(dash):
            assert p["title"] in doc, f"docs/dashboards.md misses {dash['title']} / {p['title']}"


# ----------------------------------------------------------------------------- Grafana 12 and 13 schema

SCHEMA_VERSIONS = ("12", "13")
TYPED_PANELS = {"timeseries": "timeseries", "stat": "stat", "bargauge": "bargauge",
                "state-timeline": "state-timeline", "table": "table"}


def typescript(dash: dict[str, Any], version: str) -> str:
    """A module typing the dashboard as @grafana/schema's Dashboard, and each panel's options as its
    panel plugin's Options (object literals: an unknown key such as a table footer is an error)."""
    root = SCHEMA / "node_modules" / f"grafana-schema-{version}" / "dist" / "types"
    lines = ["import type { Dashboard } from '@grafana/schema';",
             # JSON holds an enum's value ("list"), TypeScript wants the enum member: compare by value.
             "type Json<T> = T extends string ? `${T}` : T extends readonly (infer U)[] ? Json<U>[]",
             "  : T extends object ? { [K in keyof T]: Json<T[K]> } : T;"]
    for n, folder in enumerate(TYPED_PANELS.values()):
        lines.append(f"import type {{ Options as O{n} }} from "
                     f"'{root}/raw/composable/{folder.replace('-', '')}/panelcfg/x/types.gen';")
    lines.append(f"export const dashboard: Json<Dashboard> = {json.dumps(dash, indent=1)};")
    kinds = list(TYPED_PANELS)
    for p in panels(dash):
        if p["type"] in TYPED_PANELS:
            lines.append(f"export const options{p['id']}: Json<O{kinds.index(p['type'])}> = "
                         f"{json.dumps(p.get('options', {}))};")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.skipif(not (SCHEMA / "node_modules" / "typescript").is_dir(),
                    reason="tests/schema/node_modules missing: bash tests/run.sh installs it (npm ci)")
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_dashboards_pass_the_grafana_schema(version: str, tmp_path: Path) -> None:
    """``tsc --noEmit`` over the committed dashboards typed with @grafana/schema of Grafana 12 and 13."""
    schema = SCHEMA / "node_modules" / f"grafana-schema-{version}"
    assert json.loads((schema / "package.json").read_text())["version"].startswith(version + ".")
    for name, dash in load_dashboards().items():
        (tmp_path / f"{name}.ts").write_text(typescript(dash, version))
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "skipLibCheck": True, "module": "esnext",
                            "moduleResolution": "bundler", "target": "es2022", "types": [],
                            "baseUrl": str(tmp_path),
                            "paths": {"@grafana/schema": [str(schema / "dist" / "types" / "index.d.ts")]}},
        "include": [str(tmp_path / "*.ts")]}))
    proc = subprocess.run([str(SCHEMA / "node_modules" / ".bin" / "tsc"), "-p", str(tmp_path / "tsconfig.json")],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(not (SCHEMA / "node_modules" / "typescript").is_dir(),
                    reason="tests/schema/node_modules missing: bash tests/run.sh installs it (npm ci)")
def test_schema_check_rejects_a_table_footer(tmp_path: Path) -> None:
    """The check can fail: a table panel with Grafana 12's footer option does not type-check as Grafana 13."""
    dash = load_dashboards()["gpu-exporter-health"]
    (table,) = [p for p in panels(dash) if p["type"] == "table"]
    table["options"]["footer"] = {"show": False, "reducer": ["sum"]}
    schema = SCHEMA / "node_modules" / "grafana-schema-13"
    (tmp_path / "bad.ts").write_text(typescript(dash, "13"))
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "skipLibCheck": True, "module": "esnext",
                            "moduleResolution": "bundler", "target": "es2022", "types": [],
                            "paths": {"@grafana/schema": [str(schema / "dist" / "types" / "index.d.ts")]}},
        "include": [str(tmp_path / "*.ts")]}))
    proc = subprocess.run([str(SCHEMA / "node_modules" / ".bin" / "tsc"), "-p", str(tmp_path / "tsconfig.json")],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode != 0 and "footer" in proc.stdout, proc.stdout[-2000:]


# ----------------------------------------------------------------------------------------- live stack


def pod_resources(scenario: dict[str, Any]) -> Any:
    """Pods holding the scenario's GPUs: a trainer on GPU 0, a notebook on GPU 2, servers on MIG slices."""

    def pod(name: str, namespace: str, resource: str, device: str) -> Any:
        container = api_pb2.ContainerResources(
            name="main", devices=[api_pb2.ContainerDevices(resource_name=resource, device_ids=[device])])
        return api_pb2.PodResources(name=name, namespace=namespace, containers=[container])

    gpus = scenario["gpus"]
    migs = [(i["profile"], i["uuid"]) for g in gpus for i in g.get("mig", {}).get("instances", [])]
    return api_pb2.ListPodResourcesResponse(pod_resources=[
        pod("trainer-0", "ml", "nvidia.com/gpu", gpus[0]["uuid"]),
        pod("notebook-7", "research", "nvidia.com/gpu", gpus[2]["uuid"]),
        *[pod(f"infer-{n}", "serving", f"nvidia.com/mig-{profile}", uuid) for n, (profile, uuid) in enumerate(migs)],
    ])


class AllocatorFigures:
    """What torch.cuda.memory_stats reports for a job whose caching allocator keeps retrying (M4)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, device: int) -> dict[str, int]:
        self.calls += 1
        return {"allocated_bytes": 18 << 30, "reserved_bytes": 30 << 30, "retries": 2 * self.calls, "ooms": 0}


def train(uuid: str, rank: int, exporter: str, stop: threading.Event) -> None:
    """An input-bound training loop (M1): most of each step waits for the next batch."""
    run = training.start("grafana-demo", url=exporter, rank=rank, uuid=uuid, push_interval=0.5,
                         tags={"team": "vision"})  # the cost dashboard's hours lost by team

    class Batches:
        """DataLoader-like (run.data() reports its settings): each batch takes 30 ms to load."""

        num_workers, pin_memory, persistent_workers, batch_size = 0, False, False, 32

        def __iter__(self) -> Iterator[None]:
            while not stop.is_set():
                time.sleep(0.03)
                yield None

    try:
        for _ in run.data(Batches()):
            with run.phase("compute"):
                time.sleep(0.025)  # compute ~40% of the step on a GPU ~15% busy: M3's batch remedy has a factor >= 2
            with run.phase("metrics"):
                time.sleep(0.004)
            run.step(samples=32)
    finally:
        run.close()


class KubeletStandIn(http.server.BaseHTTPRequestHandler):
    """Another scrape target on the node (as a kubelet is): it has ``up`` but is no exporter."""

    def do_GET(self) -> None:
        body = b"kubelet_running_pods 3\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


PROMETHEUS_YML = """
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [rules/*.yml]
scrape_configs:
  - job_name: gpu-exporter
    static_configs:
      - targets: ["{east}"]
        labels: {{node: "{node}", {label}: "{cluster}"}}
      - targets: ["{plain}"]
        labels: {{node: "{other}"}}
  - job_name: kubelet
    static_configs:
      - targets: ["{kubelet}"]
        labels: {{node: "{node}", {label}: "{cluster}"}}
  - job_name: dcgm-exporter
    static_configs:
      - targets: ["{dcgm}"]
        labels: {{{label}: "{cluster}"}}
"""

# Series that appear last (they need rates over several scrapes, a pod refresh or a pushed run);
# once all are there, every panel has had its chance to fill.
READY = [
    "run:gpu_training_phase:share5m",
    "namespace:gpu_utilization:avg5m",
    "node:gpu_idle_hours:increase1h",
    'run:gpu_training_cause:share{code="M1"}',
    'run:gpu_training_cause:share{code="M4"}',
    "run:gpu_training_cause:projected_utilization",
    "run:gpu_training_remedy:num_workers",
    "run:gpu_training_remedy:batch_size",  # its factor needs the compute share settled at 2x the utilization or more
    "gpu:gpu_has_work:bool",
    "increase(gpu_xid_errors_total[1m])",
    "gpu_sm_active_ratio",
    "gpu:gpu_sm_active:avg5m",  # effective utilization (the Hopper GPU's GPM) beside busy
    'gpu:gpu_sm_active:avg5m{source="dcgm"}',  # the Ada GPU's, from the stand-in dcgm-exporter
    # the cost dashboard's funnel reads the node sums of each step; its recorded causes
    # (gpu:gpu_busy_not_effective:ratio) exist only where an efficiency cause holds, on no GPU here: the by-cause
    # panel shows (none), the total less the causes' (tests/test_fleet_funnel.py checks the causes)
    'node:gpu_funnel:sum{step="busy_not_effective"}',
    "gpu_mig_memory_used_bytes",
    'up{job="kubelet"}',
    # the cost dashboard's subqueries step through whole seconds: the trainer's GPU below target with its main
    # cause (M4, the allocator, comes first) at one of them at least
    'count_over_time(gpu:gpu_idle_below_target:ratio{code="M4"}[1m:1s])',
]


@pytest.fixture(scope="module")
def stack() -> Iterator[str]:
    scenario = yaml.safe_load(SCENARIO.read_text())
    tmp = tempfile.mkdtemp(prefix="grafana-", dir="/tmp")  # a Unix socket path must stay short
    socket_path = os.path.join(tmp, "kubelet.sock")
    kubelet = FakeKubelet(socket_path, pod_resources(scenario))
    kubelet.start()
    stand_in = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), KubeletStandIn)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    stop = threading.Event()
    env = {"GPU_EXPORTER_KUBERNETES_ENABLED": "true",
           "GPU_EXPORTER_KUBERNETES_POD_RESOURCES_SOCKET": socket_path,
           "GPU_EXPORTER_KUBERNETES_REFRESH_SECONDS": "1"}
    rules = {f"rules/{p.name}": p.read_text() for p in (REPO / "prometheus" / "rules").glob("*.yml")}
    try:
        # dcgm-exporter's profiling fields for the Ada GPU only (no GPM): its SM activity comes from DCGM, the
        # Hopper GPU's from GPM, and the MIG A100 has none (source unknown)
        ada = parse_scenario({"gpus": [scenario["gpus"][2]]}, "the Ada GPU")
        with pytest.MonkeyPatch.context() as mp, \
                dcgm_exporter.serve(ada, hostname=NODE, interval=1.0) as dcgm, \
                run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.2"], env=env) as exporter, \
                run_exporter(["--simulate", str(UNLABELLED), "--poll-interval", "0.5"]) as plain:
            mp.setattr(training_device, "allocator_stats", AllocatorFigures())
            loops = [threading.Thread(target=train, args=(scenario["gpus"][0]["uuid"], rank, exporter, stop),
                                      daemon=True) for rank in (0, 1)]
            for loop in loops:
                loop.start()
            config = PROMETHEUS_YML.format(
                east=urllib.parse.urlparse(exporter).netloc, plain=urllib.parse.urlparse(plain).netloc,
                kubelet=f"127.0.0.1:{stand_in.server_address[1]}", node=NODE, other=OTHER_NODE,
                label=Config.load().cluster, cluster=CLUSTER, dcgm=urllib.parse.urlparse(dcgm.url).netloc)
            with run_prometheus(config, rules) as prom:
                for expr in READY:
                    wait_until(functools.partial(promql, prom, expr), 90, 0.5, what=f"{expr} in Prometheus")
                yield prom
            stop.set()
            for loop in loops:
                loop.join(timeout=5)
    finally:
        stop.set()
        stand_in.shutdown()
        kubelet.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def query(prom: str, expr: str, instant: bool) -> list[dict[str, Any]]:
    """Run ``expr`` as Grafana would (instant, or a range over the last 20 s); fail with Prometheus' error."""
    params: dict[str, Any] = {"query": expr}
    if not instant:
        end = time.time()
        params.update(start=end - 20, end=end, step=1)
    url = f"{prom}/api/v1/{'query' if instant else 'query_range'}?{urllib.parse.urlencode(params)}"
    status, text = http_status(url)
    body = json.loads(text)
    assert status == 200 and body.get("status") == "success", f"{expr!r}: {body.get('error', text)}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def label_values(prom: str, expr: str) -> list[str]:
    """Evaluate a Grafana Prometheus variable query ``label_values(selector, label)``."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", expr.strip(), re.DOTALL)
    assert m, f"unsupported variable query {expr!r}"
    selector, label = m.groups()
    return sorted({s["metric"][label] for s in promql(prom, selector) if label in s["metric"]})


def regex_value(value: str) -> str:
    """A label value as Grafana writes it into a PromQL regex matcher: metacharacters escaped, and the
    backslashes doubled for the PromQL string."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in {**MACROS, **values}.items():
        pattern = re.compile(r"\$\{" + name + r"(?::\w+)?\}|\$" + name + r"\b")
        expr = pattern.sub(value.replace("\\", "\\\\"), expr)
    assert "$" not in expr, f"unresolved variable in {expr!r}"
    return expr


MODES = ("all", CLUSTER)
_resolved: dict[tuple[str, str], dict[str, str]] = {}


def variables(prom: str, dashboard: str, mode: str) -> dict[str, str]:
    """Each query variable as Grafana sets it. Mode ``all``: multi-value variables on All (their
    allValue, ``.*``, which also matches series without the label); mode ``east``: the cluster variable
    on that one cluster, the others on every value found within it. Single-value ones: the first value.
    A textbox variable (the cost dashboard's price) keeps its default text."""
    if (dashboard, mode) not in _resolved:
        values: dict[str, str] = {}
        for var in load_dashboards()[dashboard]["templating"]["list"]:
            if var["type"] == "textbox":
                values[var["name"]] = str(var["current"]["value"])
                continue
            if var["type"] != "query":
                continue
            found = label_values(prom, substitute(variable_query(var), values))
            assert found, f"variable {var['name']} of {dashboard} has no values ({mode})"
            if var["name"] == "cluster" and mode != "all":
                assert mode in found, found
                values["cluster"] = f"({regex_value(mode)})"
            elif var.get("includeAll") and mode == "all":
                values[var["name"]] = var["allValue"]
            else:
                chosen = found if var.get("multi") else found[:1]
                values[var["name"]] = "(" + "|".join(regex_value(v) for v in chosen) + ")"
        _resolved[(dashboard, mode)] = values
    return _resolved[(dashboard, mode)]


VARIABLES = [(name, v["name"]) for name, d in load_dashboards().items() for v in d["templating"]["list"]
             if v["type"] == "query"]
QUERIES = panel_queries()
ALERT_QUERIES = alert_queries()
# The training loop is input-bound (M1) with allocator retries (M4) on a GPU below the low threshold;
# the other causes' alerts must parse but find nothing here (their conditions do not hold).
ALERTS_WITH_DATA = {"GpuUtilizationLow", "GpuTrainingInputBound", "GpuMemoryAllocatorThrashing"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("dashboard", "variable"), VARIABLES, ids=[f"{d}:{v}" for d, v in VARIABLES])
def test_variable_query_returns_values(stack: str, dashboard: str, variable: str, mode: str) -> None:
    assert variables(stack, dashboard, mode)[variable]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("q", QUERIES, ids=[f"{q.dashboard}:{q.panel}:{q.ref}" for q in QUERIES])
def test_panel_query_returns_data(stack: str, q: Query, mode: str) -> None:
    expr = substitute(q.expr, variables(stack, q.dashboard, mode))
    result = query(stack, expr, q.instant)
    assert result, f"no data for {q.dashboard} / {q.panel} / {q.ref} ({mode}): {expr}"


@pytest.mark.slow
def test_cluster_variable_separates_labelled_and_unlabelled_series(stack: str) -> None:
    """All counts both exporters (one without a cluster label), ``east`` only its own; the kubelet target
    on the same node is never an exporter."""
    fleet = {p["title"]: p for p in panels(load_dashboards()["gpu-fleet-overview"])}
    health = {p["title"]: p for p in panels(load_dashboards()["gpu-exporter-health"])}
    scenario_gpus = len(yaml.safe_load(SCENARIO.read_text())["gpus"])
    plain_gpus = len(yaml.safe_load(UNLABELLED.read_text())["gpus"])

    def value(dash: str, panel: dict[str, Any], mode: str) -> float:
        (series,) = promql(stack, substitute(panel["targets"][0]["expr"], variables(stack, dash, mode)))
        return float(series["value"][1])

    assert value("gpu-fleet-overview", fleet["GPUs monitored"], "all") == scenario_gpus + plain_gpus
    assert value("gpu-fleet-overview", fleet["GPUs monitored"], CLUSTER) == scenario_gpus
    assert value("gpu-exporter-health", health["Exporters up"], "all") == 2
    assert value("gpu-exporter-health", health["Exporters up"], CLUSTER) == 1
    assert len(promql(stack, f'up{{node="{NODE}"}}')) == 2, "the kubelet stand-in shares the exporter's node"


@pytest.mark.slow
@pytest.mark.parametrize("q", ALERT_QUERIES, ids=[f"{q.panel}:{q.ref}" for q in ALERT_QUERIES])
def test_grafana_alert_query_runs(stack: str, q: Query) -> None:
    result = query(stack, q.expr, True)
    if q.panel in ALERTS_WITH_DATA:
        assert {s["metric"].get("pod") for s in result} >= {"trainer-0"}, result
        trainer = [s["metric"] for s in result if s["metric"].get("pod") == "trainer-0"]
        assert {m.get(Config.load().cluster) for m in trainer} == {CLUSTER}, "the cluster label survives the joins"


@pytest.mark.slow
def test_underused_gpu_table_names_owner_cause_and_projection(stack: str) -> None:
    """The fleet table's rows for the trainer's GPU: owner pod and run, causes M1 (input-bound) and M4
    from the cause engine, and a projected utilization above today's."""
    table = next(p for p in panels(load_dashboards()["gpu-fleet-overview"]) if p["type"] == "table")
    values = variables(stack, "gpu-fleet-overview", CLUSTER)
    rows = {t["refId"]: promql(stack, substitute(t["expr"], values)) for t in table["targets"]}
    owners = [s["metric"] for s in rows["D"]]
    assert any(o.get("pod") == "trainer-0" and o.get("run") == "grafana-demo" for o in owners), owners
    assert {s["metric"]["code"] for s in rows["E"]} >= {"M1", "M4"}, rows["E"]
    now = {s["metric"]["uuid"]: float(s["value"][1]) for s in rows["A"]}
    projected = [(s["metric"]["uuid"], float(s["value"][1])) for s in rows["F"]]
    assert projected and all(now[uuid] < value <= 1 for uuid, value in projected), (now, projected)


@pytest.mark.slow
def test_sm_activity_sources_gpm_dcgm_and_unknown(stack: str) -> None:
    """The node detail's source table names each GPU's SM activity source: GPM for the Hopper GPU, the stand-in
    dcgm-exporter for the Ada GPU (its UUID label joined to uuid), unknown for the MIG A100; the tensor and DRAM
    panel draws the Ada GPU from dcgm-exporter's fields."""
    board = {p["title"]: p for p in panels(load_dashboards()["gpu-node-detail"])}
    values = variables(stack, "gpu-node-detail", CLUSTER)
    (source,) = board["SM activity source"]["targets"]
    rows = {s["metric"]["gpu"]: s["metric"]["source"] for s in promql(stack, substitute(source["expr"], values))}
    assert rows == {"0": "gpm", "1": "unknown", "2": "dcgm"}, rows
    tensor, dram = board["Tensor and DRAM activity"]["targets"]
    for target in (tensor, dram):
        gpus = {s["metric"]["gpu"] for s in promql(stack, substitute(target["expr"], values))}
        assert gpus == {"0", "2"}, (target["legendFormat"], gpus)
