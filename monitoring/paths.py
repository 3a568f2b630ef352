"""Where the generators read and write: the repository's monitoring files (a leaf: imports nothing of monitoring/)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "prometheus"
THRESHOLDS = PROMETHEUS / "thresholds.yml"
TEMPLATES = PROMETHEUS / "templates"
RULES = PROMETHEUS / "rules"
DASHBOARD_DIR = ROOT / "grafana" / "dashboards"
GRAFANA_ALERTS = ROOT / "grafana" / "provisioning" / "alerting" / "gpu-utilization.yml"
