"""End to end: real CPU PyTorch loops (tests/cause_loops.py) report their DataLoader and cores -> real exporter
(--simulate) -> real Prometheus with the shipped rules -> the concrete remedy, with the loops' own numbers, in
the cause alerts' descriptions and in both diagnose paths.

Each loop runs on an ops-mode simulated GPU (``device: true``): busy exactly while the loop is inside torch
operators, whatever it reports. ``mixed`` waits for data 54% of each step with ``num_workers=0`` on this
machine's cores: M1, and the suggestion is the formula of gpu_exporter.verdict.remedies for those numbers. ``batch2``
computes batches of 2, a step mostly Python around small operators (its GPU is busy about a third of its compute
time), with 4 of 80 GiB used: M3, and the suggestion is a larger batch.
REMEDIES_E2E_OUTPUT=DIR keeps the outputs (docs/runbooks.md shows them).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e import keep_output, run_clis, running_jobs, shipped_fast_rules
from gpu_exporter.training.context import cpu_cores
from gpu_exporter.verdict.causes import CONTEXT_CAUSES
from gpu_exporter.verdict.remedies import suggested_workers

from testbed import http_get, promql, run_exporter, run_prometheus, scrape_config, wait_until

pytestmark = pytest.mark.slow

LOOPS = Path(__file__).with_name("cause_loops.py")
SCENARIO = """gpus:
  - {name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: "GPU-e2e-mixed", device: true,
     processes: [{pid: 74101, name: "python train.py", memory_gib: 30}]}
  - {name: "NVIDIA H100 80GB HBM3", architecture: hopper, memory_gib: 80, uuid: "GPU-e2e-batch2", device: true,
     processes: [{pid: 74103, name: "python train.py --batch-size 2", memory_gib: 4}]}
"""


def _keep(name: str, text: str) -> None:
    keep_output("REMEDIES_E2E_OUTPUT", name, text)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str]]:
    files = shipped_fast_rules()
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "remedies.yaml"
        scenario.write_text(SCENARIO)
        channel = {"GPU_SIM_DEVICE_DIR": tmp}  # the loops' devices write their busy intervals here
        with run_exporter(["--simulate", str(scenario), "--poll-interval", "0.2"], env=channel) as exporter, \
                run_prometheus(scrape_config(exporter, "e2e-node"), files) as prom, \
                running_jobs([[sys.executable, str(LOOPS), name, exporter, f"{tmp}/{name}.pt", "300"]
                              for name in ("mixed", "batch2")], env=channel):
            yield exporter, prom


def _descriptions(prom: str) -> dict[str, str]:
    return {r["labels"]["alertname"]: r["annotations"]["description"]
            for r in json.loads(http_get(prom + "/api/v1/alerts"))["data"]["alerts"]
            if r["state"] == "firing" and r["labels"]["alertname"] in ("GpuTrainingInputBound", "GpuBatchTooSmall")}


def test_verdicts_carry_the_runs_own_numbers(stack: tuple[str, str]) -> None:
    exporter, prom = stack
    described = wait_until(lambda: (d := _descriptions(prom)) and len(d) == 2 and d, 120, interval=1.0,
                           what="GpuTrainingInputBound and GpuBatchTooSmall to fire")
    _keep("alerts.json", http_get(prom + "/api/v1/alerts"))
    cores = cpu_cores()
    # The loops report num_workers=0 and this machine's cores; the rule computed the formula from them.
    (workers,) = promql(prom, 'run:gpu_training_remedy:num_workers{run="mixed"}')
    (share,) = promql(prom, 'run:gpu_training_phase:share5m{run="mixed", phase="data"}')
    assert float(workers["value"][1]) == suggested_workers(0, float(share["value"][1]), cores)
    m1 = described["GpuTrainingInputBound"]
    assert f"With its cores the run can use DataLoader(num_workers={workers['value'][1]}, pin_memory=True, " \
           "persistent_workers=True)." in m1, m1
    m3 = re.search(r"Its memory allows batch (\d+) \(scale the learning rate by (\d+)\)",
                   described["GpuBatchTooSmall"])
    assert m3 is not None and int(m3.group(1)) == 2 * int(m3.group(2)) >= 4, described["GpuBatchTooSmall"]

    # Every call at once (run_clis): each --url one still judges its own 5 s window.
    sources: tuple[tuple[str, str, list[str]], ...] = (("url", exporter, ["--window", "5s"]), ("prometheus", prom, []))
    calls = [["diagnose", "--url" if flag == "url" else "--prometheus-url", source, *extra, *tail]
             for flag, source, extra in sources
             for tail in (["--output", "json"], ["--run", "mixed"], ["--run", "batch2"])]
    results = iter(run_clis(calls))
    for flag, _, _ in sources:
        result = next(results)
        gpus = {g["uuid"]: g for g in json.loads(result.stdout)["gpus"]}
        mixed, batch2 = gpus["GPU-e2e-mixed"]["verdict"], gpus["GPU-e2e-batch2"]["verdict"]
        assert mixed["code"] == "M1", mixed
        assert mixed["suggestion"].startswith(f"num_workers=0 with {cores:g} cores available: try num_workers="), mixed
        assert mixed["remedy"].startswith(mixed["suggestion"]) and mixed["suggestion"] not in mixed["reason"]
        assert batch2["code"] == "M3" and re.match(r"batch 2 uses 4\.0 of 80 GiB: try batch \d+ and scale the "
                                                   r"learning rate by \d+$", batch2["suggestion"]), batch2
        # A run gets a remedy for the causes found in it only (the Prometheus path reads no other run's context).
        runs = [r for g in gpus.values() for r in g["runs"] if r["run"] in ("mixed", "batch2")]
        assert len(runs) == 2 and all(set(r["suggestions"]) == {c["cause"] for c in r["causes"]} & set(CONTEXT_CAUSES)
                                      for r in runs), runs
        for loop in ("mixed", "batch2"):
            _keep(f"diagnose-{flag}-{loop}.txt", next(results).stdout)
