"""tests/data/kube-prometheus-stack-defaults.yaml agrees with a rendered kube-prometheus-stack.

Problem: tests/test_helm.py checks that the chart's monitors and PrometheusRule are discovered by a
default kube-prometheus-stack, using selector facts written down in
tests/data/kube-prometheus-stack-defaults.yaml. Facts typed by hand can be wrong or go stale. Here
the chart's own Prometheus template (vendored in tests/data/kube-prometheus-stack/, chart 88.5.3)
is rendered with its default values, and its selectors must equal those facts. The Grafana sidecar
facts come from the grafana subchart, which is not vendored, and stay unchecked here.
"""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[1]
KPS_CHART = REPO / "tests" / "data" / "kube-prometheus-stack"
FACTS = REPO / "tests" / "data" / "kube-prometheus-stack-defaults.yaml"
RELEASE = "kube-prometheus-stack"

helm.disable_logging()


def test_the_written_down_selectors_are_the_rendered_ones() -> None:
    with helm.Chart.load(KPS_CHART) as chart:
        out = chart.render({}, name=RELEASE, namespace="monitoring", is_install=True)
    (prometheus,) = [doc for text in out.values() for doc in yaml.safe_load_all(text)
                     if doc and doc["kind"] == "Prometheus"]
    facts = yaml.safe_load(FACTS.read_text().replace("{release}", RELEASE))["prometheus"]
    assert facts, FACTS
    for key, value in facts.items():
        assert prometheus["spec"][key] == value, key
    # and they select by the release label, the premise of the chart's monitor.release value
    assert prometheus["spec"]["serviceMonitorSelector"] == {"matchLabels": {"release": RELEASE}}
