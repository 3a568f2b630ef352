"""The serve path loads nothing it does not use: query, diagnose, TLS, gRPC and the training timers stay out."""

from __future__ import annotations

import subprocess
import sys

from testbed import exporter_env

# What only a sub-command, a TLS/basic-auth web config, Kubernetes attribution or a training job needs.
NOT_ON_THE_SERVE_PATH = (
    "gpu_exporter.commands.query", "gpu_exporter.commands.diagnose", "gpu_exporter.commands.client_",
    "gpu_exporter.commands.promql_text",
    "gpu_exporter.web_config", "gpu_exporter.kubernetes", "gpu_exporter.podresources", "grpc", "bcrypt",
    "gpu_exporter.training.run", "gpu_exporter.training.pusher", "gpu_exporter.simulate",
)

PROBE = """
import sys
from gpu_exporter import cli
from gpu_exporter.app import Exporter
from gpu_exporter.config import load_config

cli.build_parser("serve").parse_args(["serve"])
exporter = Exporter(load_config(None, env={}, flags={}))
print(" ".join(sorted(sys.modules)))
"""


def test_serving_imports_only_what_it_uses() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=exporter_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert "gpu_exporter.server" in loaded and "gpu_exporter.ingest" in loaded  # the probe did build the exporter
    unexpected = sorted(m for m in loaded if m.startswith(NOT_ON_THE_SERVE_PATH))
    assert not unexpected, f"the serve path imports {unexpected}"


def test_a_sub_command_still_loads_its_module() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", "diagnose", "--help"], env=exporter_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--window" in proc.stdout, proc.stderr
