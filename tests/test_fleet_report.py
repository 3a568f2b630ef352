"""``report --list`` / ``report --fleet`` without servers: how GPU time is shared, the prices file, bad input.

The end-to-end test against real jobs, a real exporter and a real Prometheus is
tests/test_report.py::test_fleet_report_and_list_of_runs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from gpu_exporter.commands.client_http import MetricsError
from gpu_exporter.commands.fleet_render import (
    fleet_json,
    render_html,
    render_list_json,
    render_list_markdown,
    render_list_text,
    render_markdown,
    render_text,
)
from gpu_exporter.commands.fleet_sources import load_prices
from gpu_exporter.thresholds import load_thresholds
from gpu_exporter.verdict.fleet import NONE, UNJUDGED, LaunchRow, Point, Range, fleet, keep_launches, shares
from gpu_exporter.verdict.views import GpuKey
from test_query import run_cli

T = load_thresholds(None)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def _point(ts: float, uuid: str, verdict: str, below: bool, util: float, launch: tuple[str, str] | None,
           model: str = H100, pods: tuple[str, ...] = (), starting: bool = False) -> Point:
    return Point(ts, uuid, uuid, "node-a", model, pods, verdict, verdict, "", below, util, f"fix {verdict}. More.",
                 launch, 2.0, starting)


def _range() -> Range:
    """Two GPUs, 10 points of 2 s: GPU-1 ran ``train`` (run id a, team vision) for 9 s of its timers at 4 points
    (input-bound, 10% busy) after its first scrape (a starting point, which weighs nothing), idle with memory
    held at the others; GPU-2 (an A100 in namespace ml) is not instrumented at 40%; ``short`` (team nlp) ran 1 s
    on GPU-2 between two points."""
    points = [_point(2.0 * k, "GPU-1", "input_bound" if k < 6 else "idle_but_allocated", True, 0.1 if k < 6 else 0.0,
                     ("train", "a") if 1 < k < 6 else None, starting=k == 1) for k in range(1, 11)]
    points += [_point(2.0 * k, "GPU-2", "not_instrumented", True, 0.4, None, A100, ("ml/serve-0",))
               for k in range(1, 11)]
    rows = [LaunchRow("train", ["a"], 1.0, 10.0, {"team": "vision"}, {("0", GpuKey("", "GPU-1")): 9.0}),
            LaunchRow("short", ["b"], 12.5, 13.5, {"team": "nlp"}, {("0", GpuKey("", "GPU-2")): 1.0})]
    by_id = {("train", "a"): rows[0]}
    for p in points:
        if p.launch in by_id:
            by_id[p.launch].points.append(p)
    return Range("http://prometheus:9090", 0.0, 20.0, 2.0, 8.0, points, rows, T.utilization_target,
                 T.utilization_low_threshold)


def test_a_gpus_time_adds_up_to_the_range_and_a_runs_to_its_timers() -> None:
    items = shares(_range())
    by_gpu: dict[str, float] = {}
    for s in items:
        by_gpu[s.point.uuid] = by_gpu.get(s.point.uuid, 0.0) + s.seconds
    assert by_gpu == {"GPU-1": pytest.approx(20.0), "GPU-2": pytest.approx(20.0)}
    assert not [s for s in items if s.point.starting]
    run = [s for s in items if s.offender == "run train (a)"]
    assert sum(s.seconds for s in run) == pytest.approx(9.0) and {s.team for s in run} == {"vision"}
    short = [s for s in items if s.offender == "run short (b)"]  # live at no point: counted, not judged
    assert [(s.seconds, s.point.verdict, s.team) for s in short] == [(1.0, UNJUDGED, "nlp")]
    f = fleet(_range(), None)
    causes = {k: v for k, v in f.by_cause.items()}
    assert causes["input_bound"].below_target * 3600 == pytest.approx(9.0)
    assert causes["input_bound"].idle * 3600 == pytest.approx(0.9 * 9.0)
    assert causes["idle_but_allocated"].gpu_hours * 3600 == pytest.approx(11.0)
    assert causes["not_instrumented"].gpu_hours * 3600 == pytest.approx(19.0)
    assert causes[UNJUDGED].below_target == 0.0
    assert f.by_team["vision"].gpu_hours * 3600 == pytest.approx(9.0)
    assert f.by_namespace["ml"].gpu_hours * 3600 == pytest.approx(20.0)
    assert f.by_namespace[NONE].gpu_hours * 3600 == pytest.approx(20.0)
    assert f.total.gpu_hours * 3600 == pytest.approx(40.0)
    # Offenders by idle time: GPU-2 (0.6 x 19 s) before GPU-1's idle time (11 s) before the run (8.1 s).
    assert [o["who"] for o in f.offenders] == ["GPU GPU-2 on node-a", "GPU GPU-1 on node-a", "run train (a)"]
    assert f.offenders[2]["remedy"] == "fix input_bound. More." and f.offenders[2]["team"] == "vision"
    only = fleet(_range(), None, team="vision")
    assert only.total.gpu_hours * 3600 == pytest.approx(9.0)
    ml = fleet(_range(), None, namespace="ml")
    assert ml.total.gpu_hours * 3600 == pytest.approx(20.0) and ml.filters == {"namespace": "ml"}
    text = render_text(f)
    assert "input_bound" in text and "remedy: fix input_bound." in text and "More." not in text
    assert render_markdown(f).startswith("### GPU fleet report\n")
    page = render_html(f)
    assert page.count("<svg") == 3 and page.count("<polyline") == 2  # over time: all GPUs, the GPUs a run had


def test_the_list_of_runs() -> None:
    r = _range()
    text = render_list_text(r.launches, r)
    lines = text.splitlines()
    assert lines[0].split() == ["RUN", "ID", "RUN", "TAGS", "OWNER", "RANKS", "GPUS", "START", "WALL", "UTIL", "MAIN",
                                "CAUSE"]
    assert lines[1].split()[:3] == ["a", "train", "team=vision"] and lines[1].endswith("input-bound (M1)")
    assert lines[2].split()[:3] == ["b", "short", "team=nlp"] and lines[2].endswith("-")  # live at no point
    assert lines[-1] == "2 run(s) between 1970-01-01T00:00:00Z and 1970-01-01T00:00:20Z at http://prometheus:9090"
    doc = json.loads(render_list_json(r.launches, r))["runs"][0]
    assert (doc["run_id"], doc["tags"], doc["wall_seconds"], doc["main_cause"]) == ("a", {"team": "vision"}, 9.0,
                                                                                      "input_bound")
    assert doc["seconds_by_verdict"] == {"input_bound": 9.0} and doc["gpus"] == ["GPU-1"]
    assert "| a | train | team=vision |" in render_list_markdown(r.launches, r)
    assert [row.run for row in keep_launches(r.launches, None, "nlp", None)] == ["short"]
    assert [row.run for row in keep_launches(r.launches, None, None, "node-a")] == ["train"]


def test_the_kubernetes_owner_of_the_pods_groups_gpu_time_and_names_a_run() -> None:
    """kube-state-metrics' kube_pod_owner (fleet_sources.pod_owners) names the Job or PyTorchJob behind a pod;
    without it, the report has no owner table and the list shows the pods."""
    from dataclasses import replace

    from gpu_exporter.commands.fleet_sources import owner_map
    from gpu_exporter.verdict.fleet import owners_of

    bare = _range()
    assert fleet(bare, None).by_owner == {} and "Kubernetes owner" not in render_text(fleet(bare, None))
    points = [replace(p, pods=("vision/train-0",)) if p.uuid == "GPU-1" else p for p in bare.points]
    owners = owner_map([({"namespace": "vision", "pod": "train-0", "owner_kind": "PyTorchJob", "owner_name": "train"},
                         1.0),
                        ({"namespace": "ml", "pod": "serve-0", "owner_kind": "ReplicaSet", "owner_name": "serve-7f"},
                         1.0)])
    r = replace(bare, points=points, pod_owners=owners)
    for row in r.launches:
        row.points = [p for p in points if p.launch == (row.run, row.run_ids[0])]
        row.kube_owners = list(owners_of(row.owners(), owners))
    f = fleet(r, None)
    assert {k: round(v.gpu_hours * 3600, 6) for k, v in f.by_owner.items()} == {
        "PyTorchJob/train": 20.0, "ReplicaSet/serve-7f": 20.0}
    assert "Kubernetes owner" in render_text(f)
    assert {row["owner"] for row in fleet_json(f)["by_owner"]} == {"PyTorchJob/train", "ReplicaSet/serve-7f"}
    lines = render_list_text(r.launches, r).splitlines()
    assert lines[1].split()[:4] == ["a", "train", "team=vision", "PyTorchJob/train"]
    doc = json.loads(render_list_json(r.launches, r))["runs"][0]
    assert doc["owner"] == ["vision/train-0"] and doc["kubernetes_owner"] == ["PyTorchJob/train"]


def test_money_is_idle_gpu_hours_times_the_models_price(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(f"currency: EUR\ngpu_hour:\n  {H100}: 4.0\n")
    f = fleet(_range(), load_prices(str(path)))
    h100_idle = (0.9 * 9.0 + 11.0) / 3600
    assert f.total.money == pytest.approx(4.0 * h100_idle)
    assert f.total.unpriced == pytest.approx(0.6 * 19.0 / 3600)  # the A100 has no price, and no default
    assert "money lost" in render_text(f) and fleet_json(f)["prices"]["currency"] == "EUR"
    path.write_text(f"gpu_hour:\n  {H100}: 4.0\n  default: 1.5\n")
    prices = load_prices(str(path))
    assert (prices.currency, prices.of(A100), prices.of(H100)) == ("USD", 1.5, 4.0)


def test_the_text_report_fits_100_columns_and_cuts_no_remedy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The longest cause title (the unjudged one) and the money column fit; a remedy's "e.g." ends no sentence."""
    from gpu_exporter.commands.fleet_render import TEXT_WIDTH
    from gpu_exporter.verdict.hints import HINTS

    advice = next(h.advice for h in HINTS if "e.g. " in h.advice)  # the workers-saturated hint's
    r = _range()
    r.points[:] = [replace(p, title="likely input-bound, workers saturated", remedy=advice)
                   if p.verdict == "not_instrumented" else p for p in r.points]
    monkeypatch.chdir(tmp_path)  # a short path: the headline names the prices file, and a path is not cut
    Path("prices.yaml").write_text("currency: EUR\ngpu_hour:\n  default: 123456.0\n")
    for prices in (None, load_prices("prices.yaml")):
        text = render_text(fleet(r, prices))
        assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH == 100, text
        assert "not judged (the run was live at no point" in text and ("money lost" in text) == bool(prices)
        flat = " ".join(text.split())
        assert f"remedy: {advice}" in flat, text  # one sentence, whole: "(on the GPU, e.g. DALI)" is not cut
    assert f"| {advice} |" in render_markdown(fleet(r, None))


@pytest.mark.parametrize(("text", "error"), [
    ("gpu_hour: [1, 2]\n", "{p}:1: gpu_hour must map GPU models"),
    ("currency: EUR\ngpu_hour:\n  default: cheap\n", "{p}:3: the price of 'default' must be a number of EUR per "
                                                      "GPU-hour (0 or more), not 'cheap'"),
    ("gpu_hour:\n  default: -1\n", "{p}:2: the price of 'default' must be a number of USD per GPU-hour (0 or more), "
                                   "not -1"),
    ("gpu_hour: {default: 1}\nprice: 2\n", "{p}:2: unknown key 'price' (currency, gpu_hour)"),
    ("gpu_hour: {default: 1\n", "{p}:2: invalid YAML"),
    ("- 1\n", "{p}: expected a mapping with currency and gpu_hour"),
])
def test_a_bad_prices_file_is_one_line(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(MetricsError) as err:
        load_prices(str(path))
    message = str(err.value)
    assert message.startswith("--prices: " + error.format(p=path)) and "\n" not in message, message


def test_bad_flags_are_one_line_before_any_query(tmp_path: Path) -> None:
    url = "http://127.0.0.1:9"  # nothing listens: each error comes before a query
    for args, error in (
        (["--list", "--run", "x"], "--list and --fleet cover every run of the range: drop --run/--run-id"),
        (["--list", "--output", "html"], "--list writes text, markdown or json (--output html is for a report)"),
        (["--fleet", "--top", "-1"], "--top: -1 is not a count of offenders (0 or more)"),
        (["--fleet", "--prices", str(tmp_path / "none.yaml")],
         f"--prices: cannot read {tmp_path / 'none.yaml'}: No such file or directory"),
    ):
        result = run_cli("report", "--prometheus-url", url, *args)
        assert (result.returncode, result.stderr) == (2, f"gpu-exporter: error: {error}\n"), args
    both = run_cli("report", "--prometheus-url", url, "--list", "--fleet")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_two_clusters_with_one_gpu_uuid_keep_their_runs_and_time_apart() -> None:
    """GPU-twin in cluster a ran ``train`` (9 s of its timers, input-bound at 4 points); GPU-twin in cluster b is not
    instrumented, and ``short`` ran 1 s on it, live at no point. A launch's walls are keyed by (rank, GPU key), as
    the points are: keyed by UUID alone, a's run time would also be b's (and b's unjudged run a's)."""
    def point(k: int, cluster: str) -> Point:
        run = cluster == "a" and 1 < k < 6
        return Point(2.0 * k, f"{cluster}/GPU-twin", "GPU-twin", f"node-{cluster}", H100, (),
                     "input_bound" if run else "not_instrumented", "", "", True, 0.1, "fix it.",
                     ("train", "a") if run else None, 2.0)

    points = [point(k, c) for c in ("a", "b") for k in range(1, 11)]
    rows = [LaunchRow("train", ["a"], 1.0, 10.0, {"team": "vision"}, {("0", GpuKey("a", "GPU-twin")): 9.0}),
            LaunchRow("short", ["b"], 12.5, 13.5, {"team": "nlp"}, {("0", GpuKey("b", "GPU-twin")): 1.0})]
    rows[0].points = [p for p in points if p.launch == ("train", "a")]
    r = Range("http://prometheus:9090", 0.0, 20.0, 2.0, 8.0, points, rows, T.utilization_target,
              T.utilization_low_threshold)
    assert (rows[0].wall_on("a/GPU-twin"), rows[0].wall_on("b/GPU-twin"), rows[0].wall_on("GPU-twin")) == (9.0, 0, 0)
    items = shares(r)
    by_gpu: dict[tuple[str, str], float] = {}
    for s in items:
        by_gpu[(s.point.gpu, s.offender)] = by_gpu.get((s.point.gpu, s.offender), 0.0) + s.seconds
    assert by_gpu == pytest.approx({
        ("a/GPU-twin", "run train (a)"): 9.0, ("a/GPU-twin", "GPU GPU-twin on node-a"): 11.0,
        ("b/GPU-twin", "run short (b)"): 1.0, ("b/GPU-twin", "GPU GPU-twin on node-b"): 19.0})
    f = fleet(r, None)
    assert f.by_team["vision"].gpu_hours * 3600 == pytest.approx(9.0)
    assert f.by_node["node-b"].gpu_hours * 3600 == pytest.approx(20.0)
    docs = json.loads(render_list_json(r.launches, r))["runs"]
    assert [(d["run"], d["gpus"], d["wall_seconds"]) for d in docs] == [("train", ["a/GPU-twin"], 9.0),
                                                                        ("short", ["b/GPU-twin"], 1.0)]
    assert docs[0]["seconds_by_verdict"] == {"input_bound": 9.0}
