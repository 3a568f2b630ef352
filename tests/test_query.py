"""``gpu-exporter query``: nvidia-smi's CSV shape and units, interval-mean utilization, errors.

Runs the real command line in a child process, on simulated GPUs in-process (``--simulate``)
and against a running exporter (``--url``).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from gpu_exporter import cli
from gpu_exporter.commands.query import (
    APP_FIELDS,
    DEFAULT_LOOP_SECONDS,
    FIELDS,
    GPU_LOST,
    Field,
    UsageError,
    add_arguments,
    bus_key,
    format_rows,
    parse_fields,
    parse_format,
    run_query,
    select_gpus,
)
from gpu_exporter.verdict.samples import Snapshot

from testbed import exporter_env, free_port, run_exporter

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


def run_cli_closed(*args: str, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``gpu-exporter <args>`` with its output's reader gone before it writes (``| head`` that already quit):
    its exit status and stderr."""
    proc = subprocess.Popen(gpu_exporter_cmd(*args), env=exporter_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


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


@pytest.mark.slow  # end-to-end: real processes, seconds of loops
def test_noheader_nounits_ids_and_loop_count() -> None:
    uuid2 = run_cli("query", "--simulate", "--query-gpu=uuid", "--format=csv,noheader", "-i", "2").stdout.strip()
    assert uuid2.startswith("GPU-")
    result = run_cli("query", "--simulate", "--query-gpu=index,memory.used,power.limit",
                     "--format=csv,noheader,nounits", "--id", f"0,{uuid2}", "-l", "0.3", "--count", "3")
    assert result.returncode == 0, result.stderr
    assert _rows(result.stdout) == [["0", "73216", "700.00"], ["2", "9728", "400.00"]] * 3


@pytest.mark.slow  # end-to-end: real processes, seconds of loops
@pytest.mark.slow  # end-to-end: a real exporter process or a loop of several seconds
def test_loop_rows_are_the_mean_over_the_interval_not_a_sample() -> None:
    # bursty: 3 s at 95% then 7 s at 0% every 10 s. Any instant sample reads 95 or 0; the mean over
    # a 10 s loop interval is 28.5% whatever the phase. (The first row, printed at once, is the
    # mean over what NVML still holds; the second is the 10 s mean.)
    result = run_cli("query", "--simulate", "bursty", "--query-gpu=utilization.gpu,utilization.memory",
                     "--format=csv,noheader,nounits", "-l", "10", "--count", "2", timeout=40)
    assert result.returncode == 0, result.stderr
    gpu, memory = (int(v) for v in result.stdout.splitlines()[1].split(", "))
    assert 26 <= gpu <= 31  # 28.5% give or take sampling at the window edges
    assert 13 <= memory <= 17  # 3 s at 50%


@pytest.mark.slow  # end-to-end: real processes, seconds of loops
@pytest.mark.slow  # end-to-end: a real exporter process or a loop of several seconds
def test_reads_a_running_exporter_like_nvml() -> None:
    with run_exporter(["--simulate", "bursty", "--poll-interval", "0.2"]) as url:
        result = run_cli("query", "--url", url, "--query-gpu=index,name,utilization.gpu,memory.used",
                         "--format=csv", "-l", "5", "--count", "2")
    assert result.returncode == 0, result.stderr
    header, *rows = _rows(result.stdout)
    assert header == ["index", "name", "utilization.gpu [%]", "memory.used [MiB]"]
    assert len(rows) == 2
    for row in rows[1:]:  # the first row is the exporter's last poll interval
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


def test_a_reader_that_went_away_ends_the_loop_quietly_with_a_sigpipe_status() -> None:
    status, err = run_cli_closed("query", "--simulate", "-lms", "50", "--count", "1000")
    assert (status, err) == (141, "")


@pytest.mark.parametrize(("url", "message"), [
    ("http://127.0.0.1:notaport", "is not a valid exporter URL: use http://HOST:PORT"),
    ("ftp://127.0.0.1:21", "is not a valid exporter URL"),
    ("127.0.0.1:{port}", "connection refused (is gpu-exporter running there?)"),
])
def test_bad_or_down_exporter_is_one_sentence_and_exit_2(url: str, message: str) -> None:
    result = run_cli("query", "--url", url.format(port=free_port()))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


@pytest.mark.slow  # end-to-end: a real exporter process or a loop of several seconds
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


def test_a_memory_gauge_that_is_not_a_number_prints_not_available() -> None:
    fields = parse_fields("memory.used,memory.total")
    snap = _snapshot(0.0, 0.0)
    snap.samples["gpu_memory_used_bytes"] = [({"gpu": "0", "uuid": "GPU-a"}, float("nan"))]
    snap.samples["gpu_memory_total_bytes"] = [({"gpu": "0", "uuid": "GPU-a"}, 80.0 * 2 ** 30)]
    assert format_rows(fields, None, snap, [("0", "GPU-a")], True) == ["[N/A], 81920 MiB"]


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


# --- nvidia-smi parity -------------------------------------------------------------------------

NVIDIA_SMI = Path(__file__).resolve().parent / "data" / "nvidia-smi"
DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _nvidia_smi_fields(name: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """field -> (CSV header, aliases), from nvidia-smi's documented field list kept as data."""
    with (NVIDIA_SMI / name).open(newline="") as fh:
        return {row["field"]: (row["header"], tuple(a for a in row["aliases"].split(";") if a))
                for row in csv.DictReader(fh)}


@pytest.mark.parametrize(("data", "ours"), [("query-gpu.csv", FIELDS), ("query-compute-apps.csv", APP_FIELDS)])
def test_field_names_aliases_and_headers_match_nvidia_smi(data: str, ours: tuple[Field, ...]) -> None:
    documented = _nvidia_smi_fields(data)
    for f in ours:
        assert f.name in documented, f"{f.name} is not an nvidia-smi field"
        header, aliases = documented[f.name]
        assert f.header == header, (f.name, f.header, header)
        assert set(f.aliases) <= set(aliases), (f.name, f.aliases, aliases)
        for alias in f.aliases:  # an alias prints the canonical header, as nvidia-smi does
            assert [g.header for g in parse_fields(alias, ours, "--x")] == [header]


def test_docs_parity_table_matches_the_fields() -> None:
    """docs/cli.md's table lists every documented nvidia-smi field, with its header and whether query has it."""
    text = DOC.read_text()
    table = text[text.index("<!-- parity-table -->"):text.index("<!-- /parity-table -->")]
    rows = {m.group(1): (m.group(2), m.group(3)) for m in
            re.finditer(r"^\| `([^`]+)` \| `([^`]+)` \| (yes|no)[^|]*\|$", table, re.M)}
    expected = {}
    for data, ours in (("query-gpu.csv", FIELDS), ("query-compute-apps.csv", APP_FIELDS)):
        names = {n for f in ours for n in (f.name, *f.aliases)}
        for field, (header, _) in _nvidia_smi_fields(data).items():
            key = field if data == "query-gpu.csv" else f"{field} (apps)"
            expected[key] = (header, "yes" if field in names else "no")
    assert rows == expected


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-exporter query", exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_loop_flags_follow_nvidia_smi() -> None:
    assert _parse("-l").loop == DEFAULT_LOOP_SECONDS == 5.0  # bare -l: nvidia-smi's 5 s
    assert _parse("-l", "2").loop == 2.0
    assert _parse("-lms", "250").loop_ms == 250.0
    assert _parse("--loop-ms=250").loop_ms == 250.0
    with pytest.raises(SystemExit):
        _parse("-c", "3")  # nvidia-smi's -c is --compute-mode: no short form here
    assert _parse("--count", "3").count == 3
    with pytest.raises(SystemExit):
        _parse("--simulat")  # no abbreviations (allow_abbrev=False)


def test_lms_prints_rows_every_interval_in_milliseconds() -> None:
    result = run_cli("query", "--simulate", "--query-gpu=index", "--format=csv,noheader", "-i", "0",
                     "-lms", "200", "--count", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["0", "0", "0"]


def test_first_row_comes_at_once_not_after_the_interval() -> None:
    # -l 60 --count 1: nvidia-smi prints its first row at once; waiting for the interval would time out here
    result = run_cli("query", "--simulate", "--query-gpu=index,utilization.gpu", "--format=csv,noheader",
                     "-i", "0", "-l", "60", "--count", "1", timeout=50)
    assert result.returncode == 0, result.stderr
    index, utilization = result.stdout.strip().split(", ")
    assert index == "0" and 70 <= int(utilization.split()[0]) <= 100  # GPU 0 runs at 85% +-5%


def test_query_compute_apps_like_nvidia_smi() -> None:
    result = run_cli("query", "--simulate", "--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_serial",
                     "--format=csv")
    assert result.returncode == 0, result.stderr
    header, *rows = _rows(result.stdout)
    assert header == ["pid", "process_name", "used_gpu_memory [MiB]", "gpu_uuid", "gpu_serial"]
    assert rows[0][:3] == ["41001", "python train.py --model llama-7b", "73216 MiB"]
    assert all(re.fullmatch(r"GPU-[0-9a-f-]{36}", row[3]) and row[4] == "[N/A]" for row in rows)
    assert len(rows) == 5
    only = run_cli("query", "--simulate", "--query-compute-apps=pid", "--format=csv,noheader", "-i", "3")
    assert only.stdout.split() == ["41304", "41305"]
    bad = run_cli("query", "--simulate", "--query-compute-apps=pid,utilization.gpu")
    assert bad.returncode == 2 and 'Field "utilization.gpu" is not a valid field to query' in bad.stderr


def _energy(joules: float, watts: float, at: float) -> Snapshot:
    base = _snapshot(0.0, at)
    samples = dict(base.samples)
    samples["gpu_energy_joules_total"] = [({"gpu": "0", "uuid": "GPU-a"}, joules)]
    samples["gpu_power_watts"] = [({"gpu": "0", "uuid": "GPU-a"}, watts)]
    samples["gpu_power_limit_watts"] = [({"gpu": "0", "uuid": "GPU-a"}, 700.0)]
    return Snapshot(samples, at=at, wall=0.0)


def test_power_draw_average_is_the_energy_delta_over_the_interval() -> None:
    fields = parse_fields("power.draw.average,power.draw.instant,power.draw,enforced.power.limit")
    assert [f.header for f in fields] == ["power.draw.average [W]", "power.draw.instant [W]", "power.draw [W]",
                                          "enforced.power.limit [W]"]
    rows = format_rows(fields, _energy(1000.0, 250.0, 10.0), _energy(1600.0, 420.0, 12.0), [("0", "GPU-a")], True)
    assert rows == ["300.00 W, 420.00 W, 420.00 W, 700.00 W"]
    # the first row has no interval yet: [N/A] rather than an instant reading passed off as a mean
    assert format_rows(fields, None, _energy(1600.0, 420.0, 12.0), [("0", "GPU-a")], True)[0].startswith("[N/A], ")


def test_short_pci_bus_ids_select_gpus() -> None:
    snap = _snapshot(0, 0)
    for wanted in ("00000000:01:00.0", "0000:01:00.0", "01:00.0", "1:0.0"):
        assert select_gpus(snap, wanted) == [("0", "GPU-a")], wanted
    assert bus_key("zz:00.0") is None
    with pytest.raises(UsageError, match=r"no GPU matches --id 02:00\.0"):
        select_gpus(snap, "02:00.0")


def test_a_lost_gpu_keeps_its_row_like_nvidia_smi() -> None:
    fields = parse_fields("index,uuid,utilization.gpu,memory.used")
    first = _snapshot(1.0, 0.0)
    gone = Snapshot({"gpu_info": []}, at=1.0, wall=0.0)
    assert format_rows(fields, first, gone, [("0", "GPU-a")], True, first=first) == [
        f"0, GPU-a, {GPU_LOST}, {GPU_LOST}"]


@pytest.mark.slow  # end-to-end: real processes, seconds of loops
@pytest.mark.slow  # end-to-end: a real exporter process or a loop of several seconds
def test_a_gpu_lost_while_looping_is_shown_lost_not_dropped() -> None:
    # faults: GPU 1 falls off the bus at t=5 s of the simulation; the third row is read at 6 s or later
    result = run_cli("query", "--simulate", "faults", "--query-gpu=index,utilization.gpu,memory.used",
                     "--format=csv,noheader", "-l", "3", "--count", "3", timeout=60)
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    gpus = len(rows) // 3
    assert len(rows) == 3 * gpus and gpus >= 2
    last = {row[0]: row for row in rows[-gpus:]}
    assert last["1"] == ["1", GPU_LOST, GPU_LOST]
    assert last["0"][2].endswith("MiB")


class _RepeatingExporter:
    """An exporter whose scrapes show the same poll, with scrape-time jitter in ``at``."""

    poll_interval = 1.0

    def __init__(self, readings: list[Snapshot]) -> None:
        self.readings = readings

    def read(self) -> Snapshot:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def test_url_accepts_a_reading_only_from_a_new_poll() -> None:
    """Issue 13 item 5: a GPU steady at 100% busy behind an exporter polling every 1 s. One scrape
    repeats the previous poll, its time moved 0.3 s by scrape jitter: counting it would print 0 %
    (no busy seconds in 0.3 s). It prints [N/A], and the next new poll gives the true mean again."""
    fields = parse_fields("utilization.gpu")
    first = _snapshot(97.0, 9.0)
    first.samples["gpu_utilization_ratio"] = [({"gpu": "0", "uuid": "GPU-a"}, 1.0)]
    poll = _snapshot(98.0, 10.0)
    repeat = Snapshot(poll.samples, at=10.3, wall=0.0)
    source = _RepeatingExporter([first, poll, repeat, repeat, _snapshot(99.0, 11.0)])
    out = io.StringIO()
    run_query(source, fields, None, header=False, units=True, interval=0.01, count=4, out=out)
    assert out.getvalue().splitlines() == [
        "100 %",  # at once: the exporter's mean over its last poll interval
        "100 %",  # 9.0 -> 10.0: 1 busy second in 1 s
        "[N/A]",  # 10.3 repeats the poll of 10.0: no reading, never 0 %
        "100 %",  # 10.0 -> 11.0, measured from the last accepted poll
    ]


@pytest.mark.slow  # end-to-end: real processes, seconds of loops
@pytest.mark.slow  # end-to-end: a real exporter process or a loop of several seconds
def test_https_exporter_needs_its_ca_or_insecure(tmp_path: Path) -> None:
    from test_web_config import self_signed

    cert, key = self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n")
    args = ("--query-gpu=index,memory.used", "--format=csv,noheader", "-i", "0")
    with run_exporter(["--simulate", "--web.config.file", str(web)], scheme="https") as url:
        untrusted = run_cli("query", "--url", url, *args)
        trusted = run_cli("query", "--url", url, "--ca-file", str(cert), *args)
        insecure = run_cli("query", "--url", url, "--insecure", *args)
    assert untrusted.returncode == 2 and untrusted.stderr.count("\n") == 1
    assert "certificate this machine does not trust" in untrusted.stderr
    assert "pass --ca-file with its CA, or --insecure" in untrusted.stderr
    assert trusted.returncode == 0 and trusted.stdout == "0, 73216 MiB\n", trusted.stderr
    assert insecure.returncode == 0 and insecure.stdout == "0, 73216 MiB\n", insecure.stderr
    missing = run_cli("query", "--url", "https://127.0.0.1:1", "--ca-file", str(tmp_path / "nope.pem"))
    assert missing.returncode == 2 and "cannot read the CA file" in missing.stderr
    plain = run_cli("query", "--url", "http://127.0.0.1:1", "--insecure")
    assert plain.returncode == 2 and "apply to an https:// --url only" in plain.stderr


@pytest.mark.slow  # end-to-end: a real exporter process or a loop of several seconds
def test_url_faster_than_the_exporter_polls_never_prints_a_repeated_poll() -> None:
    """Rows every 0.3 s from an exporter polling every 1 s: most scrapes repeat a poll. Those rows
    print [N/A]; the others are true means of GPU 0's 85% +-5%, never 0 % or 100 % from jitter."""
    with run_exporter(["--simulate", "--poll-interval", "1"]) as url:
        result = run_cli("query", "--url", url, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                         "-i", "0", "-lms", "300", "--count", "8")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.split()
    assert len(rows) == 8
    numbers = [int(r) for r in rows if r != "[N/A]"]
    assert numbers and all(60 <= n <= 99 for n in numbers), rows


def test_no_driver_is_one_sentence_and_the_same_exit_status_in_serve_and_query(tmp_path: Path) -> None:
    """A simulated node whose driver is missing: serve and query both exit EXIT_NO_DRIVER with one sentence."""
    from gpu_exporter.commands.client_cli import EXIT_NO_DRIVER

    scenario = tmp_path / "no-driver.yaml"
    scenario.write_text("driver_missing: true\ngpus:\n  - {name: T4, architecture: turing, memory_gib: 16}\n")
    for args in (["query", "--simulate", str(scenario)],
                 ["serve", "--simulate", str(scenario), "--web.listen-address", f"127.0.0.1:{free_port()}"]):
        result = run_cli(*args)
        assert result.returncode == EXIT_NO_DRIVER == 1, (args, result.stderr)
        assert result.stderr.startswith("gpu-exporter: error: NVML could not be initialised (library_not_found): "
                                        "the NVIDIA driver was not found"), result.stderr
        assert result.stderr.count("\n") == 1, result.stderr


def _client_args(**flags: Any) -> argparse.Namespace:
    from gpu_exporter.commands.client_cli import CLIENT_FLAGS

    return argparse.Namespace(**{name: flags.get(name) for name in CLIENT_FLAGS})


def test_one_helper_builds_the_connection_of_every_client_command(tmp_path: Path) -> None:
    """client_cli.connection: basic auth from --username/--password-file, a bearer token from a file or the
    environment, TLS flags only for https, and one kind of credentials at a time."""
    from gpu_exporter.commands.client_cli import BEARER_TOKEN_ENV, connection
    from gpu_exporter.commands.client_http import MetricsError

    (tmp_path / "pw").write_text("s3cret\n")
    (tmp_path / "token").write_text("  t0ken\n")
    (tmp_path / "empty").write_text("\n")
    basic = connection(_client_args(username="prom", password_file=str(tmp_path / "pw")), "http://h:1", "--url")
    assert basic.headers == {"Authorization": "Basic cHJvbTpzM2NyZXQ="} and basic.context is None  # prom:s3cret
    bearer = connection(_client_args(bearer_token_file=str(tmp_path / "token")), "h:1", "--url", env={})
    assert bearer.headers == {"Authorization": "Bearer t0ken"}
    assert connection(_client_args(), "h:1", "--url", env={BEARER_TOKEN_ENV: "e"}).headers == {
        "Authorization": "Bearer e"}
    assert connection(_client_args(), "http://u:p@h:1", "--url", env={BEARER_TOKEN_ENV: "e"}).headers == {}
    assert connection(_client_args(insecure=True), "https://h:1", "--url").context is not None
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"insecure": True}, "http://h:1", "--insecure apply to an https:// --prometheus-url only"),
        ({"key_file": "k.pem"}, "https://h:1", "--key-file needs --cert-file"),
        ({"username": "prom"}, "http://h:1", "basic auth needs both --username and --password-file"),
        ({"username": "prom", "password_file": str(tmp_path / "pw"), "bearer_token_file": str(tmp_path / "token")},
         "http://h:1", "--username and --bearer-token-file exclude each other"),
        ({"bearer_token_file": str(tmp_path / "token")}, "http://u:p@h:1",
         "USER:PASSWORD@ in --prometheus-url and --bearer-token-file exclude each other"),
        ({"bearer_token_file": str(tmp_path / "empty")}, "http://h:1", "the bearer token file"),
        ({"username": "prom", "password_file": str(tmp_path / "none")}, "http://h:1", "cannot read the password file"),
        ({"cert_file": str(tmp_path / "pw")}, "https://h:1", "cannot load the client certificate"),
    ]
    for flags, url, message in cases:
        with pytest.raises(MetricsError) as err:
            connection(_client_args(**flags), url, "--prometheus-url", env={})
        assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("command", ["query", "diagnose", "report"])
def test_every_client_command_has_the_same_connection_flags(command: str) -> None:
    from gpu_exporter.cli import build_parser
    from gpu_exporter.commands.client_cli import CLIENT_FLAGS

    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    dests = {a.dest for a in sub._actions}
    assert set(CLIENT_FLAGS) <= dests


def test_client_times_take_the_settings_duration_grammar() -> None:
    """-l, diagnose --window, report --step and --at/--from offsets read 500ms, 1m30s, 1.5h as serve's settings do."""
    from gpu_exporter.commands.client_cli import parse_seconds, parse_time
    from gpu_exporter.commands.client_http import MetricsError
    from gpu_exporter.commands.diagnose import _window

    assert _parse("-l", "500ms").loop == 0.5 and _parse("-l", "1m").loop == 60.0 and _parse("-l", "2").loop == 2.0
    with pytest.raises(argparse.ArgumentError, match="'1m1m' is not a duration"):
        _parse("-l", "1m1m")
    assert _window("1m30s") == (90.0, "1m30s") and _window("3") == (3.0, "3s")
    assert parse_seconds("1.5h", "--step") == 5400.0
    assert parse_time("-1h30m", "--at", now=10000.0) == 4600.0
    for text, message in (("0s", "--step must be longer than 0 s, not '0s'"),
                          ("fast", "--step: 'fast' is not a duration like 1s, 500ms, 1m30s, 2h, or seconds")):
        with pytest.raises(MetricsError, match=re.escape(message)):
            parse_seconds(text, "--step")


def test_help_states_the_exit_statuses() -> None:
    from gpu_exporter.commands.client_cli import EXIT_NO_DRIVER

    result = run_cli("query", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps the epilog
    assert f"exit status: 0 rows printed (or stopped by Ctrl-C), {EXIT_NO_DRIVER} no NVIDIA driver" in text, text
    assert "2 an error (bad flag or field, unreadable exporter or scenario)" in text, text
