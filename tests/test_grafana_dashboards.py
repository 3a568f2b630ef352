"""Grafana dashboards: structure checks, and every query run against a real Prometheus.

The live part starts, once for the module: a fake kubelet (pod attribution), the real exporter on a
simulated node (tests/scenarios/grafana-node.yaml: a Hopper GPU with XID errors, a MIG GPU, a throttled
GPU with a fan), an instrumented training loop pushing phases through gpu_exporter.training, and a real
Prometheus scraping the exporter every second with the shipped recording rules loaded. Each variable
query, each panel query (variables replaced by values found in the data, Grafana's interval macros by
durations) and each Grafana-managed alert query must parse and return data.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
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
from gpu_exporter import training
from gpu_exporter.kubernetes import api_pb2
from gpu_exporter.training import device as training_device
from servers import http_status, promql, run_exporter, run_prometheus, wait_until

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "grafana" / "dashboards"
SCENARIO = REPO / "tests" / "scenarios" / "grafana-node.yaml"
NODE = "sim-node-1"
# Prometheus' own series the dashboards may use besides the exporter's metrics and recording rules.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds"}
BUILTIN_VARIABLES = {"__rate_interval", "__interval", "__range"}
# Grafana's macros as the test's Prometheus (1 s scrapes, a 20 s panel range) makes them.
MACROS = {"__rate_interval": "5s", "__interval": "1s", "__range": "1h"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                "bool", "offset", "inf", "nan"}
UTILIZATION = re.compile(r"gpu_busy_seconds_total|:gpu_utilization:")


class Query(NamedTuple):
    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


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


def thresholds() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "prometheus" / "thresholds.yml").read_text())
    return data


# ------------------------------------------------------------------------------------------ structure

DASHBOARD_NAMES = sorted(load_dashboards())


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_dashboard_is_self_contained_and_current(name: str) -> None:
    dash = load_dashboards()[name]
    text = json.dumps(dash)
    assert "__inputs" not in dash and "${DS_" not in text, "export-for-sharing placeholders"
    assert dash["schemaVersion"] >= 39
    assert re.fullmatch(r"gpu-[a-z-]+", dash["uid"]) and dash.get("id") is None
    assert "gpu-exporter" in dash["tags"]


def test_uids_and_titles_are_unique() -> None:
    dashes = load_dashboards().values()
    assert len({d["uid"] for d in dashes}) == len({d["title"] for d in dashes}) == len(DASHBOARD_NAMES) >= 4


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_panel_ids_unique_and_grid_positions_do_not_overlap(name: str) -> None:
    ps = panels(load_dashboards()[name])
    ids = [p["id"] for p in ps]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in ps:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_every_panel_and_variable_uses_the_datasource_variable(name: str) -> None:
    dash = load_dashboards()[name]
    variables = dash["templating"]["list"]
    (ds,) = [v for v in variables if v["type"] == "datasource"]
    assert ds["name"] == "datasource" and ds["query"] == "prometheus"
    expected = {"type": "prometheus", "uid": "${datasource}"}
    for var in variables:
        if var["type"] == "query":
            assert var["datasource"] == expected, var["name"]
    for p in panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"] == expected, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == expected, p["title"]


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_every_variable_reference_is_defined_earlier_or_builtin(name: str) -> None:
    dash = load_dashboards()[name]
    defined: set[str] = set()
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            used = set(re.findall(r"\$\{?(\w+)", variable_query(var)))
            assert used <= defined, f"variable {var['name']} uses {used - defined}"
        defined.add(var["name"])
    assert "datasource" in defined
    for p in panels(dash):
        for t in p.get("targets", []):
            used = set(re.findall(r"\$\{?(\w+)", t["expr"]))
            assert used <= defined | BUILTIN_VARIABLES, f"{p['title']}: {used - defined - BUILTIN_VARIABLES}"


def test_dashboards_together_offer_node_gpu_namespace_pod_and_run_variables() -> None:
    names = {v["name"] for d in load_dashboards().values() for v in d["templating"]["list"]}
    assert {"datasource", "node", "gpu", "namespace", "pod", "run"} <= names
    pod_filter = [v for d in load_dashboards().values() for v in d["templating"]["list"]
                  if "gpu_pod_info" in json.dumps(v)]
    assert pod_filter, "a variable built from gpu_pod_info (namespace/pod)"


@pytest.mark.parametrize("name", DASHBOARD_NAMES)
def test_every_panel_has_a_unit_and_utilization_shows_the_threshold(name: str) -> None:
    low = thresholds()["utilization_low_threshold"]
    for p in panels(load_dashboards()[name]):
        if p["type"] in ("row", "text"):
            continue
        defaults = p["fieldConfig"]["defaults"]
        assert defaults.get("unit"), f"{p['title']} has no unit"
        exprs = " ".join(t["expr"] for t in p["targets"])
        if UTILIZATION.search(exprs) and defaults["unit"] == "percentunit":
            steps = [s["value"] for s in defaults["thresholds"]["steps"]]
            assert low in steps, f"{p['title']} draws utilization without a {low} threshold"
            if p["type"] == "timeseries":
                assert "line" in defaults["custom"]["thresholdsStyle"]["mode"], p["title"]


def test_numbers_in_queries_are_the_thresholds_of_the_rules() -> None:
    t = thresholds()
    checks = {
        r"gpu:gpu_utilization:avg5m(?:\{[^}]*\})?\s*(?:<|>=)\s*([\d.]+)": t["utilization_low_threshold"],
        r'phase="data"[^}]*\}\)\s*>\s*([\d.]+)': t["input_bound_share"],
        r'phase="metrics"[^}]*\}\)\s*>\s*([\d.]+)': t["metrics_bound_share"],
        r'phase="compute"[^}]*\}\)\s*>\s*([\d.]+)': t["batch_compute_share"],
        r"gpu:gpu_memory_used:ratio\s*<\s*([\d.]+)": t["batch_memory_used_ratio"],
        r"allocator_retries_total[^\]]*\[(\w+)\]\)\)\s*>\s*[\d.]+": t["allocator_window"],
        r"allocator_retries_total[^\]]*\[\w+\]\)\)\s*>\s*([\d.]+)": t["allocator_retries_threshold"],
    }
    exprs = [q.expr for q in panel_queries()]
    for pattern, expected in checks.items():
        found = [m.group(1) for e in exprs for m in re.finditer(pattern, e)]
        assert found, pattern
        for value in found:
            assert (float(value) if isinstance(expected, float | int) else value) == expected, pattern


def test_every_metric_is_documented_or_recorded() -> None:
    known = documented_metrics() | recorded_metrics() | PROMETHEUS_SERIES
    used = {name for q in panel_queries() + alert_queries() for name in metric_names(q.expr)}
    assert used, "no metric names found"
    assert used - known == set(), "not in docs/metrics.md nor a recording rule"


def test_links_point_at_existing_dashboards() -> None:
    dashes = load_dashboards().values()
    uids = {d["uid"] for d in dashes}
    for dash in dashes:
        (link,) = dash["links"]
        assert link["type"] == "dashboards" and set(link["tags"]) <= set(dash["tags"])
        for target in re.findall(r"/d/([\w-]+)", json.dumps(dash)):
            assert target in uids, f"{dash['uid']} links to missing dashboard {target}"
    linked = {t for d in dashes for t in re.findall(r"/d/([\w-]+)", json.dumps(d))}
    assert {"gpu-node", "gpu-training-run"} <= linked


def test_docs_describe_every_panel() -> None:
    doc = (REPO / "docs" / "dashboards.md").read_text()
    for dash in load_dashboards().values():
        assert dash["title"] in doc
        for p in panels(dash):
            assert p["title"] in doc, f"docs/dashboards.md misses {dash['title']} / {p['title']}"


# ----------------------------------------------------------------------------------------- live stack


def cluster(scenario: dict[str, Any]) -> Any:
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
    run = training.start("grafana-demo", url=exporter, rank=rank, uuid=uuid, push_interval=0.5)
    try:
        while not stop.is_set():
            with run.phase("data"):
                time.sleep(0.03)
            with run.phase("compute"):
                time.sleep(0.01)
            with run.phase("metrics"):
                time.sleep(0.004)
            run.step(samples=32)
    finally:
        run.close()


PROMETHEUS_YML = """
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [rules/*.yml]
scrape_configs:
  - job_name: gpu-exporter
    static_configs:
      - targets: ["%s"]
        labels: {node: "%s"}
"""

# Series that appear last (they need rates over several scrapes, a pod refresh or a pushed run);
# once all are there, every panel has had its chance to fill.
READY = [
    "run:gpu_training_phase:share5m",
    "namespace:gpu_utilization:avg5m",
    "node:gpu_idle_hours:increase1h",
    'increase(gpu_training_allocator_retries_total[1m]) > 3',
    "increase(gpu_xid_errors_total[1m])",
    "gpu_sm_active_ratio",
    "gpu_mig_memory_used_bytes",
]


@pytest.fixture(scope="module")
def stack() -> Iterator[str]:
    scenario = yaml.safe_load(SCENARIO.read_text())
    tmp = tempfile.mkdtemp(prefix="grafana-", dir="/tmp")  # a Unix socket path must stay short
    socket_path = os.path.join(tmp, "kubelet.sock")
    kubelet = FakeKubelet(socket_path, cluster(scenario))
    kubelet.start()
    stop = threading.Event()
    env = {"GPU_EXPORTER_KUBERNETES_ENABLED": "true",
           "GPU_EXPORTER_KUBERNETES_POD_RESOURCES_SOCKET": socket_path,
           "GPU_EXPORTER_KUBERNETES_REFRESH_SECONDS": "1"}
    rules = {f"rules/{p.name}": p.read_text() for p in (REPO / "prometheus" / "rules").glob("*.yml")}
    try:
        with pytest.MonkeyPatch.context() as mp, \
                run_exporter(["--simulate", str(SCENARIO), "--poll-interval", "0.2"], env=env) as exporter:
            mp.setattr(training_device, "allocator_stats", AllocatorFigures())
            loops = [threading.Thread(target=train, args=(scenario["gpus"][0]["uuid"], rank, exporter, stop),
                                      daemon=True) for rank in (0, 1)]
            for loop in loops:
                loop.start()
            target = urllib.parse.urlparse(exporter).netloc
            with run_prometheus(PROMETHEUS_YML % (target, NODE), rules) as prom:
                for expr in READY:
                    wait_until(functools.partial(promql, prom, expr), 60, 0.5, what=f"{expr} in Prometheus")
                yield prom
            stop.set()
            for loop in loops:
                loop.join(timeout=5)
    finally:
        stop.set()
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
    """Evaluate a Grafana Prometheus variable query: label_values(selector, label) or query_result(expr)."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", expr.strip(), re.DOTALL)
    if m:
        selector, label = m.groups()
        return sorted({s["metric"][label] for s in promql(prom, selector) if label in s["metric"]})
    m = re.fullmatch(r"query_result\((.+)\)", expr.strip(), re.DOTALL)
    if m:
        return [json.dumps(s["metric"]) for s in promql(prom, m.group(1))]
    raise AssertionError(f"unsupported variable query {expr!r}")


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


_resolved: dict[str, dict[str, str]] = {}


def variables(prom: str, dashboard: str) -> dict[str, str]:
    """Each query variable set from the data: all values for a multi-value variable, else the first one."""
    if dashboard not in _resolved:
        values: dict[str, str] = {}
        for var in load_dashboards()[dashboard]["templating"]["list"]:
            if var["type"] == "query":
                found = label_values(prom, substitute(variable_query(var), values))
                assert found, f"variable {var['name']} of {dashboard} has no values"
                # A multi-value variable opens on "All": Grafana writes every value as (a|b|c).
                chosen = found if var.get("multi") or var.get("includeAll") else found[:1]
                values[var["name"]] = "(" + "|".join(regex_value(v) for v in chosen) + ")"
        _resolved[dashboard] = values
    return _resolved[dashboard]


VARIABLES = [(name, v["name"]) for name, d in load_dashboards().items() for v in d["templating"]["list"]
             if v["type"] == "query"]
QUERIES = panel_queries()
ALERT_QUERIES = alert_queries()


@pytest.mark.parametrize(("dashboard", "variable"), VARIABLES, ids=[f"{d}:{v}" for d, v in VARIABLES])
def test_variable_query_returns_values(stack: str, dashboard: str, variable: str) -> None:
    assert variables(stack, dashboard)[variable]


@pytest.mark.parametrize("q", QUERIES, ids=[f"{q.dashboard}:{q.panel}:{q.ref}" for q in QUERIES])
def test_panel_query_returns_data(stack: str, q: Query) -> None:
    expr = substitute(q.expr, variables(stack, q.dashboard))
    result = query(stack, expr, q.instant)
    assert result, f"no data for {q.dashboard} / {q.panel} / {q.ref}: {expr}"


@pytest.mark.parametrize("q", ALERT_QUERIES, ids=[f"{q.panel}:{q.ref}" for q in ALERT_QUERIES])
def test_grafana_alert_query_returns_the_gpu_with_work(stack: str, q: Query) -> None:
    result = promql(stack, q.expr)
    assert {s["metric"]["pod"] for s in result if "pod" in s["metric"]} >= {"trainer-0"}
    assert all(0 <= float(s["value"][1]) <= 1 for s in result)


def test_underused_gpu_table_names_owner_and_remedy(stack: str) -> None:
    """The fleet table's rows for the trainer's GPU: owner pod and run, and remedy M1 (input-bound)."""
    table = next(p for p in panels(load_dashboards()["gpu-fleet-overview"]) if p["type"] == "table")
    values = variables(stack, "gpu-fleet-overview")
    rows = {t["refId"]: promql(stack, substitute(t["expr"], values)) for t in table["targets"]}
    owners = [s["metric"] for s in rows["D"]]
    assert any(o.get("pod") == "trainer-0" and o.get("run") == "grafana-demo" for o in owners), owners
    remedies = {s["metric"]["remedy"].split()[0] for s in rows["E"]}
    assert "M1" in remedies and "M4" in remedies, remedies
