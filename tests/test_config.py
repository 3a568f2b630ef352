"""Config precedence (flag > env > file > default) and one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gpu_exporter.config import DEFAULTS, SETTINGS, ConfigError, load_config

from testbed import exporter_env, free_port


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    cfg = load_config(None, env={}, flags={})
    assert cfg.web_listen_address == ":9445"
    assert cfg.web_telemetry_path == "/metrics"
    assert cfg.poll_interval == 1.0
    assert cfg == DEFAULTS


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, "poll_interval: 3\nweb:\n  listen_address: '127.0.0.1:1111'\n  telemetry_path: /m\n")
    env = {"GPU_EXPORTER_POLL_INTERVAL": "2", "GPU_EXPORTER_WEB_LISTEN_ADDRESS": "127.0.0.1:2222"}
    cfg = load_config(path, env=env, flags={"poll_interval": "0.5"})
    assert cfg.poll_interval == 0.5  # flag beats env and file
    assert cfg.web_listen_address == "127.0.0.1:2222"  # env beats file
    assert cfg.web_telemetry_path == "/m"  # file beats default
    assert cfg.sources["poll_interval"] == "flag --poll-interval"
    assert cfg.sources["web.telemetry_path"].endswith("config.yaml:4")


def test_every_setting_has_flag_env_and_yaml_form(tmp_path: Path) -> None:
    for s in SETTINGS:
        assert s.flag.startswith("--") and s.env.startswith("GPU_EXPORTER_")
        assert hasattr(DEFAULTS, s.attr)
    cfg = load_config(write(tmp_path, "ingest:\n  max_runs: 5\nkubernetes:\n  enabled: true\n"), env={}, flags={})
    assert cfg.section("ingest")["max_runs"] == 5 and cfg.kubernetes_enabled is True


@pytest.mark.parametrize(("text", "expected"), [
    ("poll_intervall: 1\n", "config.yaml:1: unknown key 'poll_intervall'; did you mean 'poll_interval'? known keys"),
    ("web:\n  listen_adress: ':1'\n",
     "config.yaml:2: unknown key 'web.listen_adress'; did you mean 'web.listen_address'? known keys"),
    ("\n\npoll_interval: fast\n", "config.yaml:3: poll_interval: expected a positive duration (1s, 500ms, 1m30s, "
                                 "2h) or seconds, got 'fast'"),
    ("web:\n  listen_address: 'nowhere'\n", "config.yaml:2: web.listen_address: expected HOST:PORT"),
    ("poll_interval: [1\n", "invalid YAML"),
    ("- a\n- b\n", "must be a mapping"),
    ("collectors:\n  disabled: [gpu_temp]\n", "unknown collector(s) gpu_temp"),
])
def test_file_errors_name_key_and_line(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text), env={}, flags={})
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_env_errors() -> None:
    with pytest.raises(ConfigError, match="environment variable GPU_EXPORTER_POLL_INTERVAL: poll_interval"):
        load_config(None, env={"GPU_EXPORTER_POLL_INTERVAL": "-1"}, flags={})
    with pytest.raises(ConfigError, match="unknown environment variable GPU_EXPORTER_POLINTERVAL"):
        load_config(None, env={"GPU_EXPORTER_POLINTERVAL": "1"}, flags={})


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file /nonexistent\.yaml"):
        load_config("/nonexistent.yaml", env={}, flags={})


@pytest.mark.parametrize(("args", "expected"), [
    (["--poll-interval", "zero"], "flag --poll-interval: poll_interval: expected a positive duration"),
    (["--poll-interval", "1s1m"], "flag --poll-interval: poll_interval: expected a positive duration"),
    (["--log.format", "text"], "flag --log.format: log.format: expected one of logfmt, json, got 'text'"),
    (["--web.listen-address", "localhost"], "flag --web.listen-address: web.listen_address"),
    (["--web.telemetry-path", "metrics"], "expected a URL path starting with '/'"),
])
def test_cli_bad_flag_exits_2_with_one_line(args: list[str], expected: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", *args], capture_output=True, text=True,
                          env=exporter_env(), timeout=30)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr


def test_cli_unknown_key_in_file_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, "poll_interval: 1\nbogus: 2\n")
    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", "--config", path], capture_output=True,
                          text=True, env=exporter_env(), timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"gpu-exporter: error: {path}:2: unknown key 'bogus'; known keys: " + ", ".join(
        sorted(s.key for s in SETTINGS))


@pytest.mark.parametrize("args", [["serve", "--simul"], ["serve", "--poll", "1"], ["serve", "--web.listen", ":1"],
                                  ["--vers"]])
def test_abbreviated_flags_are_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A prefix of a flag is an error, never silently that flag (a later flag could change its meaning)."""
    from gpu_exporter.cli import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(args)
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_short_and_long_version_flags(flag: str) -> None:
    from gpu_exporter import __version__

    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", flag], capture_output=True, text=True,
                          env=exporter_env(), timeout=30)
    assert (proc.returncode, proc.stdout) == (0, f"gpu-exporter {__version__}\n"), proc.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["qeury", "-l", "1"], "unknown sub-command 'qeury'; did you mean 'query'?"),
    (["frobnicate"], "unknown sub-command 'frobnicate' (choose from serve, query, diagnose"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_mistyped_sub_command_or_flag_lists_every_sub_command(args: list[str], message: str) -> None:
    from gpu_exporter.cli import command_names

    proc = subprocess.run([sys.executable, "-m", "gpu_exporter", *args], capture_output=True, text=True,
                          env=exporter_env(), timeout=30)
    usage, error = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and message in error, proc.stderr
    assert "{" + ",".join(command_names()) + "}" in usage and {"query", "diagnose"} <= set(command_names())


@pytest.mark.parametrize(("flag", "value", "attr", "expected"), [
    ("--web.max-requests", "7", "web_max_requests", 7), ("--web.max-connections", "9", "web_max_connections", 9),
    ("--web.listen-backlog", "256", "web_listen_backlog", 256), ("--web.read-timeout", "2.5", "web_read_timeout", 2.5),
    ("--web.idle-timeout", "30", "web_idle_timeout", 30.0)])
def test_http_limits_are_settings(flag: str, value: str, attr: str, expected: float) -> None:
    from gpu_exporter.config import SETTINGS_BY_KEY

    setting = next(s for s in SETTINGS_BY_KEY.values() if s.flag == flag)
    assert getattr(load_config(None, env={setting.env: value}, flags={}), attr) == expected
    with pytest.raises(ConfigError, match=f"{setting.key}: expected a positive"):
        load_config(None, env={}, flags={setting.key: "0"})


def test_unknown_scenario_lists_the_packaged_ones_and_help_names_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    """The scenario names come from the scenarios directory, in --help and in the error for a name that is not one."""
    from gpu_exporter.simulate.scenario import DEFAULT_SCENARIO, ScenarioError, load_scenario
    names = sorted(p.stem for p in DEFAULT_SCENARIO.parent.glob("*.yaml"))
    assert "launch-bound" in names
    with pytest.raises(ScenarioError) as err:
        load_scenario("nosuchscenario")
    assert str(err.value).endswith("; packaged scenarios: " + ", ".join(names))
    from gpu_exporter.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # words joined: a wrap may split "demo-training"
    assert all(name in help_text for name in names), help_text


@pytest.mark.parametrize(("text", "seconds"), [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("2m", 120.0),
                                               ("1.5h", 5400.0), ("0.25", 0.25), ("3", 3.0), (" 10s ", 10.0)])
def test_every_duration_setting_takes_go_durations_and_plain_seconds(tmp_path: Path, text: str,
                                                                      seconds: float) -> None:
    """Each setting that is a time reads 1s, 500ms, 1m30s or plain seconds: from a flag, the environment and YAML."""
    durations = [s for s in SETTINGS if s.is_duration]
    assert {"poll_interval", "discovery_interval", "stale_after", "web.read_timeout", "ingest.stale_after_seconds",
            "kubernetes.refresh_seconds"} <= {s.key for s in durations}
    for s in durations:
        assert s.metavar == "DURATION"
        assert getattr(load_config(None, env={}, flags={s.key: text}), s.attr) == seconds
        assert getattr(load_config(None, env={s.env: text}, flags={}), s.attr) == seconds
        section, _, name = s.key.rpartition(".")
        yaml_text = f"{section}:\n  {name}: '{text}'\n" if section else f"{s.key}: '{text}'\n"
        assert getattr(load_config(write(tmp_path, yaml_text), env={}, flags={}), s.attr) == seconds
    assert load_config(write(tmp_path, "poll_interval: 2\n"), env={}, flags={}).poll_interval == 2.0  # a YAML number


@pytest.mark.parametrize("text", ["fast", "1s1m", "1m1m", "-1s", "0s", "0", "1 s", "s", "", "inf"])
def test_a_bad_duration_is_one_line_naming_the_setting(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, env={"GPU_EXPORTER_STALE_AFTER": text}, flags={})
    assert str(err.value) == (f"environment variable GPU_EXPORTER_STALE_AFTER: stale_after: expected a positive "
                              f"duration (1s, 500ms, 1m30s, 2h) or seconds, got {text!r}")


def test_serve_help_shows_duration_defaults_with_units(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_exporter.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--poll-interval DURATION" in help_text and "GPU_EXPORTER_POLL_INTERVAL; default 1s]" in help_text
    assert "GPU_EXPORTER_WEB_IDLE_TIMEOUT; default 2m]" in help_text


def test_log_level_and_format_flags_with_the_old_spelling_still_working(tmp_path: Path) -> None:
    from gpu_exporter.cli import build_parser

    for flag in ("--log.level", "--log-level"):
        args = build_parser("serve").parse_args(["serve", flag, "debug", "--log.format", "json"])
        assert (args.log_level, args.log_format) == ("debug", "json")
    assert load_config(write(tmp_path, "log_level: warning\n"), env={}, flags={}).log_level == "warning"
    cfg = load_config(write(tmp_path, "log:\n  level: error\n  format: json\n"), env={}, flags={})
    assert (cfg.log_level, cfg.log_format) == ("error", "json")
    cfg = load_config(None, env={"GPU_EXPORTER_LOG_LEVEL": "debug", "GPU_EXPORTER_LOG_FORMAT": "JSON"}, flags={})
    assert (cfg.log_level, cfg.log_format) == ("debug", "json")
    assert (DEFAULTS.log_level, DEFAULTS.log_format) == ("info", "logfmt")


@pytest.mark.parametrize("style", ["logfmt", "json"])
def test_serve_logs_in_the_chosen_format(style: str) -> None:
    """A real serve start on simulated GPUs: every stderr line is logfmt or JSON with ts, level, logger and msg."""
    import json
    import re
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "gpu_exporter", "--simulate", "--web.listen-address",
                             f"127.0.0.1:{free_port()}", "--log.format", style, "--poll-interval", "250ms"],
                            stderr=subprocess.PIPE, text=True, env=exporter_env())
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "serving http" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert lines and "serving http" in lines[-1], lines
    for line in lines:
        if style == "json":
            record = json.loads(line)
            assert set(record) >= {"ts", "level", "logger", "msg"} and record["level"] in ("debug", "info", "warn")
        else:
            assert re.fullmatch(r'ts=\S+Z level=(debug|info|warn|error) logger=\S+ msg=("(?:[^"\\]|\\.)*"|\S+)',
                                line), line


def test_serve_help_gives_each_default_once_as_the_settings_take_it(capsys: pytest.CaptureFixture[str]) -> None:
    """One default per flag, a switch's as true/false (what YAML and the environment take), and the exit statuses."""
    import re

    from gpu_exporter.cli import build_parser
    from gpu_exporter.commands.client_cli import EXIT_NO_DRIVER

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for s in SETTINGS:
        if s.key.startswith("simulate."):
            continue
        entry = help_text.split(f" {s.flag} ", 1)[1].split(f"[env {s.env}", 1)[1].split("]", 1)[0]
        assert entry == (f"; default {s.default_text}" if s.default_text else ""), (s.key, entry)
    assert help_text.count("default :9445") == 1 and "True" not in help_text and "False" not in help_text
    assert "GPU_EXPORTER_INGEST_ENABLED; default true]" in help_text
    assert "GPU_EXPORTER_KUBERNETES_ENABLED; default false]" in help_text
    for s in SETTINGS:  # the default shown is one the setting itself reads back
        if s.default_text:
            assert s.parse(s.default_text) == s.default, s.key
    assert re.search(rf"exit status: 0 stopped by SIGTERM or SIGINT, {EXIT_NO_DRIVER} no NVIDIA driver .* 2 a bad "
                     "flag, setting, config file", help_text), help_text


@pytest.mark.parametrize(("key", "text", "seconds"), [("ingest.stale_after_seconds", "90s", 90.0),
                                                      ("ingest.stale_after_seconds", "5m", 300.0),
                                                      ("kubernetes.refresh_seconds", "90s", 90.0),
                                                      ("kubernetes.refresh_seconds", "45", 45.0)])
def test_the_seconds_settings_take_prometheus_durations(tmp_path: Path, key: str, text: str, seconds: float) -> None:
    """``*_seconds`` keys read a duration like every other time (flag, environment, YAML), and refuse a bad one."""
    from gpu_exporter.config import SETTINGS_BY_KEY

    s = SETTINGS_BY_KEY[key]
    section, name = key.split(".")
    assert getattr(load_config(None, env={}, flags={key: text}), s.attr) == seconds
    assert getattr(load_config(None, env={s.env: text}, flags={}), s.attr) == seconds
    assert getattr(load_config(write(tmp_path, f"{section}:\n  {name}: {text}\n"), env={}, flags={}), s.attr) == seconds
    with pytest.raises(ConfigError) as err:
        load_config(None, env={}, flags={key: "5 minutes"})
    assert str(err.value) == (f"flag {s.flag}: {key}: expected a positive duration (1s, 500ms, 1m30s, 2h) or seconds, "
                              "got '5 minutes'")
