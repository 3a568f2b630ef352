"""docs/metrics.md lists exactly the metrics the exporter emits, with the right type and labels."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from gpu_exporter.catalog import GPU_XID_ERRORS_TOTAL as XID
from harness import scenario_path
from prometheus_client.parser import text_string_to_metric_families

from testbed import http_get, http_status, run_exporter, wait_until

pytestmark = pytest.mark.slow  # end-to-end: real processes

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
ROW = re.compile(r"^\| ((?:gpu|process)_[a-z0-9_]+) \| (gauge|counter) \|[^|]*\|([^|]*)\|")

# Families that need something this test cannot provide, each with the reason.
CONDITIONAL = {
    "gpu_pod_info": "needs a kubelet; tests/test_kubernetes*.py cover it",
    "gpu_process_read_bytes_total": "needs /proc/1/io, which even root may not read in a container; "
                                    "tests/test_evidence.py covers it",
}


def documented() -> dict[str, tuple[str, set[str]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            labels = {part.strip() for part in m.group(3).split(",") if part.strip()}
            rows[m.group(1)] = (m.group(2), labels)
    return rows


def push_training_snapshot(url: str) -> None:
    snapshot = {
        "version": 1, "run": "doc-run", "rank": "0", "uuid": "", "started_at": time.time() - 60,
        "phases": {"data": 10.0, "compute": 40.0, "metrics": 5.0, "checkpoint": 0.0, "other": 5.0},
        "current_phase": "compute", "steps": 100, "samples": 3200, "batch_size": 32,
        "run_id": "launch-0123456789ab",
        "allocator": {"allocated_bytes": 1e9, "reserved_bytes": 2e9, "retries": 0, "ooms": 0},
        "context": {"num_workers": 4, "pin_memory": True, "prefetch_factor": 2, "persistent_workers": False,
                    "loader_batch_size": 32, "cpu_cores": 16, "gpu_memory_used_bytes": 3e9,
                    "gpu_memory_total_bytes": 8e10, "allocator_peak_bytes": 2.5e9},
        "callbacks": [{"name": "SaveEvery.on_train_batch_end", "seconds": 3.0, "phase": "checkpoint"}],
        "code": {"torch": 30.0, "framework": 4.0, "host": 6.0, "functions": [{"name": "train.py:88:augment",
                                                                               "seconds": 5.0}]},
    }
    status, body = http_status(url + "/api/v1/training", data=json.dumps(snapshot).encode(),
                               headers={"Content-Type": "application/json"})
    assert status in (200, 202), body


def scrape_text() -> str:
    """/metrics of a simulated node that serves every family it can (tests/test_catalog.py uses it too)."""
    with run_exporter(["--simulate", str(scenario_path("doc-coverage.yaml")), "--poll-interval", "0.2"]) as url:
        push_training_snapshot(url)

        def scrape_with_xid() -> str | None:
            text = http_get(url + "/metrics")
            return text if XID.name in text else None

        text: str = wait_until(scrape_with_xid, 15, what="an XID event")
    return text


def emitted() -> dict[str, tuple[str, set[str]]]:
    text = scrape_text()
    out: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name if family.type != "counter" else family.name + "_total"
            if sample.name.endswith("_created"):
                continue
            _kind, labels = out.setdefault(name, (family.type, set()))
            labels.update(sample.labels)
    return out


def test_metrics_doc_matches_scrape() -> None:
    doc = documented()
    seen = emitted()
    assert set(CONDITIONAL) <= set(doc)
    missing_from_doc = sorted(set(seen) - set(doc))
    never_emitted = sorted(set(doc) - set(seen) - set(CONDITIONAL))
    assert not missing_from_doc, f"emitted but not in docs/metrics.md: {missing_from_doc}"
    assert not never_emitted, f"in docs/metrics.md but not emitted: {never_emitted}"
    for name, (kind, labels) in seen.items():
        doc_kind, doc_labels = doc[name]
        assert kind == doc_kind, f"{name}: emitted as {kind}, documented as {doc_kind}"
        assert labels == doc_labels, f"{name}: emitted labels {sorted(labels)}, documented {sorted(doc_labels)}"
