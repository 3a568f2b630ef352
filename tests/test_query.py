"""``gpu-exporter query``: nvidia-smi's CSV shape and units, interval-mean utilization, errors.

Runs the real command line in a child process, on simulated GPUs in-process (``--simulate``)
and against a running exporter (``--url``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from gpu_exporter import cli
from gpu_exporter.commands.metrics_client import Snapshot
from gpu_exporter.commands.query import FIELDS, UsageError, format_rows, parse_fields, parse_format, select_gpus
from servers import exporter_env, free_port, run_exporter

# cli.py registers query and diagnose through their register() functions; until it does, the
# child process registers them exactly that way before calling cli.main().
_REGISTER_THEN_MAIN = (
    "import sys\n"
    "from gpu_exporter import cli\n"
    "from gpu_exporter.commands import diagnose, query\n"
    "query.register(cli.SUBCOMMANDS); diagnose.register(cli.SUBCOMMANDS)\n"
    "sys.exit(cli.main(sys.argv[1:]))\n"
)


def gpu_exporter_cmd(*args: str) -> list[str]:
    """argv running ``gpu-exporter <args>`` in a child Python with this checkout's sources."""
    if "query" in cli.SUBCOMMANDS and "diagnose" in cli.SUBCOMMANDS:
        return [sys.executable, "-m", "gpu_exporter", *args]
    return [sys.executable, "-c", _REGISTER_THEN_MAIN, *args]


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``gpu-exporter <args>`` and capture its output."""
    return subprocess.run(gpu_exporter_cmd(*args), env=exporter_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


ALL_FIELDS = ("timestamp,count,index,name,uuid,pci.bus_id,driver_version,utilization.gpu,utilization.memory,"
              "memory.total,memory.reserved,memory.used,memory.free,power.draw,power.limit,temperature.gpu,"
              "clocks.sm,clocks.mem,fan.speed")
ROW_RE = {
    "timestamp": r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}",
    "count": r"4",
    "index": r"[0-3]",
    "name": r"NVIDIA (H100 80GB HBM3|A100-SXM4-80GB)",
    "uuid": r"GPU-[0-9a-f-]{36}",
    "pci.bus_id": r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.0",
    "driver_version": r"550\.54\.15",
    "utilization.gpu": r"(\d{1,3} %|\[N/A\])",
    "utilization.memory": r"(\d{1,3} %|\[N/A\])",
    "memory.total": r"81920 MiB",
    "memory.reserved": r"\d+ MiB",
    "memory.used": r"\d+ MiB",
    "memory.free": r"\d+ MiB",
    "power.draw": r"\d+\.\d\d W",
    "power.limit": r"(700|400)\.00 W",
    "temperature.gpu": r"\d+",
    "clocks.sm": r"\d+ MHz",
    "clocks.mem": r"\d+ MHz",
    "fan.speed": r"\[N/A\]",
}


def _rows(stdout: str) -> list[list[str]]:
    return [line.split(", ") for line in stdout.splitlines()]


def test_every_field_in_nvidia_smi_shape_on_the_default_simulated_node() -> None:
    result = run_cli("query", "--simulate", f"--query-gpu={ALL_FIELDS}")
    assert result.returncode == 0, result.stderr
    header, *rows = _rows(result.stdout)
    assert header == ["timestamp", "count", "index", "name", "uuid", "pci.bus_id", "driver_version",
                      "utilization.gpu [%]", "utilization.memory [%]", "memory.total [MiB]", "memory.reserved [MiB]",
                      "memory.used [MiB]", "memory.free [MiB]", "power.draw [W]", "power.limit [W]",
                      "temperature.gpu", "clocks.current.sm [MHz]", "clocks.current.memory [MHz]", "fan.speed [%]"]
    assert [row[2] for row in rows] == ["0", "1", "2", "3"]
    for row in rows:
        for name, cell in zip(ALL_FIELDS.split(","), row, strict=True):
            assert re.fullmatch(ROW_RE[name], cell), (name, cell)
    by_index = {row[2]: row for row in rows}
    # GPU 0 runs at 85% +-5% noise, GPU 2 at 25% +-8%: a one-second mean lands near both.
    assert 75 <= int(by_index["0"][7].split()[0]) <= 95
    assert 15 <= int(by_index["2"][7].split()[0]) <= 35
    # GPU 3 is in MIG mode: NVML has no utilization, nvidia-smi prints [N/A] too.
    assert by_index["3"][7] == "[N/A]"
    # 71.5 GiB used by its process, as MiB.
    assert by_index["0"][11] == "73216 MiB"
    stamp = datetime.strptime(by_index["0"][0], "%Y/%m/%d %H:%M:%S.%f")
    assert abs((datetime.now() - stamp).total_seconds()) < 30


def test_noheader_nounits_ids_and_loop_count() -> None:
    uuid2 = run_cli("query", "--simulate", "--query-gpu=uuid", "--format=csv,noheader", "-i", "2").stdout.strip()
    assert uuid2.startswith("GPU-")
    result = run_cli("query", "--simulate", "--query-gpu=index,memory.used,power.limit",
                     "--format=csv,noheader,nounits", "--id", f"0,{uuid2}", "-l", "0.3", "-c", "3")
    assert result.returncode == 0, result.stderr
    assert _rows(result.stdout) == [["0", "73216", "700.00"], ["2", "9728", "400.00"]] * 3


def test_loop_rows_are_the_mean_over_the_interval_not_a_sample() -> None:
    # bursty: 3 s at 95% then 7 s at 0% every 10 s. Any instant sample reads 95 or 0; the mean over
    # a 10 s loop interval is 28.5% whatever the phase.
    result = run_cli("query", "--simulate", "bursty", "--query-gpu=utilization.gpu,utilization.memory",
                     "--format=csv,noheader,nounits", "-l", "10", "-c", "1", timeout=40)
    assert result.returncode == 0, result.stderr
    gpu, memory = (int(v) for v in result.stdout.split(", "))
    assert 26 <= gpu <= 31  # 28.5% give or take sampling at the window edges
    assert 13 <= memory <= 17  # 3 s at 50%


def test_reads_a_running_exporter_like_nvml() -> None:
    with run_exporter(["--simulate", "bursty", "--poll-interval", "0.2"]) as url:
        result = run_cli("query", "--url", url, "--query-gpu=index,name,utilization.gpu,memory.used",
                         "--format=csv", "-l", "5", "-c", "2")
    assert result.returncode == 0, result.stderr
    header, *rows = _rows(result.stdout)
    assert header == ["index", "name", "utilization.gpu [%]", "memory.used [MiB]"]
    assert len(rows) == 2
    for row in rows:
        assert row[:2] == ["0", "NVIDIA A100-SXM4-80GB"] and row[3] == "24576 MiB"
        # 5 s windows of a 10 s cycle: between 0% (5 s idle) and 57% (3 s at 95%), never a raw 95.
        assert 0 <= int(row[2].split()[0]) <= 60


@pytest.mark.parametrize(("args", "message"), [
    (["--query-gpu=name,foo"], 'Field "foo" is not a valid field to query'),
    (["--format=json"], '"--format=json" is not valid: use csv'),
    (["-l", "0"], "-l must be a number of seconds > 0"),
    (["-i", "7"], "no GPU matches --id 7 (GPU indexes here: 0, 1, 2, 3)"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run_cli("query", "--simulate", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.parametrize(("url", "message"), [
    ("http://127.0.0.1:notaport", "is not a valid exporter URL: use http://HOST:PORT"),
    ("ftp://127.0.0.1:21", "is not a valid exporter URL"),
    ("127.0.0.1:{port}", "connection refused (is gpu-exporter running there?)"),
])
def test_bad_or_down_exporter_is_one_sentence_and_exit_2(url: str, message: str) -> None:
    result = run_cli("query", "--url", url.format(port=free_port()))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_a_page_that_is_not_an_exporter_is_refused() -> None:
    with run_exporter(["--simulate", "bursty"]) as url:
        result = run_cli("query", "--url", url + "/healthz")
    assert result.returncode == 2
    assert result.stderr == (f"gpu-exporter: error: {url}/healthz does not serve Prometheus metrics: "
                             "is it a gpu-exporter?\n")


def _snapshot(busy: float, at: float) -> Snapshot:
    info = {"gpu": "0", "uuid": "GPU-a", "name": "T", "pci_bus_id": "00000000:01:00.0", "driver_version": "1"}
    return Snapshot({"gpu_info": [(info, 1.0)],
                     "gpu_busy_seconds_total": [({"gpu": "0", "uuid": "GPU-a"}, busy)]}, at=at, wall=0.0)


def test_utilization_is_the_busy_delta_over_the_time_nvml_covered() -> None:
    fields = parse_fields("utilization.gpu,fan.speed")
    rows = format_rows(fields, _snapshot(10.0, 100.0), _snapshot(13.0, 104.0), [("0", "GPU-a")], units=True)
    assert rows == ["75 %, [N/A]"]
    # A counter that went down (exporter restarted) gives no number rather than a wrong one.
    assert format_rows(fields, _snapshot(10.0, 100.0), _snapshot(1.0, 104.0), [("0", "GPU-a")], True) == [
        "[N/A], [N/A]"]


def test_field_table_and_parsers() -> None:
    assert {f.name for f in FIELDS} >= {"timestamp", "index", "name", "uuid", "pci.bus_id", "driver_version",
                                        "utilization.gpu", "utilization.memory", "memory.total", "memory.used",
                                        "memory.free", "power.draw", "power.limit", "temperature.gpu",
                                        "clocks.current.sm", "clocks.current.memory", "fan.speed"}
    assert [f.name for f in parse_fields("gpu_name, clocks.sm")] == ["name", "clocks.current.sm"]
    assert parse_format("csv") == (True, True)
    with pytest.raises(UsageError, match="needs at least one field"):
        parse_fields(" , ")
    assert select_gpus(_snapshot(0, 0), "00000000:01:00.0") == [("0", "GPU-a")]


def test_help_query_gpu_lists_every_field() -> None:
    result = run_cli("query", "--help-query-gpu")
    assert result.returncode == 0
    for f in FIELDS:
        assert f.name in result.stdout


def test_no_driver_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    scenario = tmp_path / "no-driver.yaml"
    scenario.write_text("driver_missing: true\ngpus:\n  - {name: T4, architecture: turing, memory_gib: 16}\n")
    result = run_cli("query", "--simulate", str(scenario))
    assert result.returncode == 2
    assert result.stderr.startswith("gpu-exporter: error: NVML could not be initialised (library_not_found): "
                                    "the NVIDIA driver was not found")
    assert result.stderr.count("\n") == 1
