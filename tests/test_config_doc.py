"""docs/configuration.md and examples/gpu-exporter.yaml are what ``python -m gpu_exporter.config_doc`` makes of
config.SETTINGS: every setting documented once, every flag one serve takes, the sample loads to the defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpu_exporter import config_doc
from gpu_exporter.cli import build_parser
from gpu_exporter.config import DEFAULTS, OTHER_ENV, SETTINGS, load_config

ROW = re.compile(r"^\| `([a-z_.]+)` \| (.+?) \| `(GPU_EXPORTER_[A-Z_]+)` \| (`[^`]*`|none) \| .+ \|$")


def documented() -> dict[str, tuple[list[str], str, str]]:
    """key -> (flags, environment variable, default) of each row of docs/configuration.md's setting tables."""
    rows = {}
    for line in config_doc.DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is documented twice"
            rows[m.group(1)] = (re.findall(r"`([^`]+)`", m.group(2)), m.group(3), m.group(4).strip("`"))
    return rows


def test_the_files_are_current() -> None:
    assert config_doc.main(["--check"]) == 0, "docs/configuration.md or the sample drifted: run " + config_doc.COMMAND


def test_check_reports_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "examples").mkdir()
    monkeypatch.setattr(config_doc, "ROOT", tmp_path)
    monkeypatch.setattr(config_doc, "DOC", tmp_path / "docs" / "configuration.md")
    monkeypatch.setattr(config_doc, "SAMPLE", tmp_path / "examples" / "gpu-exporter.yaml")
    config_doc.DOC.write_text(config_doc.markdown().replace("`40`", "`41`"))
    config_doc.SAMPLE.write_text(config_doc.sample_yaml())
    assert config_doc.main(["--check"]) == 1
    assert capsys.readouterr().out == f"out of date: docs/configuration.md (run {config_doc.COMMAND})\n"
    assert config_doc.main([]) == 0 and config_doc.main(["--check"]) == 0
    assert config_doc.DOC.read_text() == config_doc.markdown()


def test_every_setting_has_one_row_with_its_flag_variable_and_default() -> None:
    rows = documented()
    assert list(rows) == [s.key for s in SETTINGS]
    serve = build_parser("serve")
    for s in SETTINGS:
        flags, env, default = rows[s.key]
        assert env == s.env and default == (s.default_text or "none"), s.key
        # the documented default, given as the variable, is the setting's default
        if s.default_text:
            assert getattr(load_config(None, env={env: default}, flags={}), s.attr) == s.default, s.key
        for flag in flags:  # each documented flag is one serve takes, with a value when it needs one
            words = flag.split()
            value = [] if len(words) > 1 or s.key == "simulate.enabled" else [s.default_text or "x"]
            words = [w if w != "SCENARIO" else "demo-training" for w in words]
            args = serve.parse_args(["serve", *words, *value])
            assert getattr(args, s.attr, None) is not None or getattr(args, "simulate", None) is not None, flag
    text = config_doc.DOC.read_text()
    assert all(f"`{name}`" in text for name in OTHER_ENV)
    for name in ("ingest.stale_after_seconds", "kubernetes.refresh_seconds", "ingest.token_file"):
        assert name in rows  # were only in serve --help before


def test_the_sample_loads_to_the_defaults_and_its_commented_keys_load_too(tmp_path: Path) -> None:
    sample = config_doc.SAMPLE.read_text()
    assert f"```yaml\n{sample}```" in config_doc.DOC.read_text()  # the page shows the same file
    assert load_config(str(config_doc.SAMPLE), env={}, flags={}) == DEFAULTS
    for s in SETTINGS:
        name = s.key.rpartition(".")[2]
        assert re.search(rf"^(  )?(# )?{name}: ", sample, re.M), s.key
    uncommented = tmp_path / "all.yaml"
    uncommented.write_text(re.sub(r"^(\s*)# ([a-z_]+: )", r"\1\2", sample, flags=re.M))
    cfg = load_config(str(uncommented), env={}, flags={})
    assert {key: getattr(cfg, key.replace(".", "_")) for key in config_doc.EXAMPLES} == config_doc.EXAMPLES


def test_the_readme_settings_table_agrees_with_the_settings() -> None:
    """The README's short table (a row per key, or per section: ``ingest.*``) names each key's flag, variable and
    default as SETTINGS does, and every setting has a row."""
    readme = (config_doc.ROOT / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("| `") and len(cells) == 4:
            rows.update({key: cells[1:] for key in re.findall(r"`([a-z_.*]+)`", cells[0])})
    covered = set()
    for s in SETTINGS:
        row = rows.get(s.key)
        if row is None:
            assert f"{config_doc.section_of(s)}.*" in rows, f"{s.key} is in no row of the README's settings table"
            continue
        covered.add(s.key)
        flag, env, default = row
        assert f"`{config_doc.flags_of(s)[0].split()[0]}" in flag, (s.key, flag)
        assert f"`{s.env}`" in env or f"`_{s.key.rpartition('.')[2].upper()}`" in env, (s.key, env)
        if isinstance(s.default, bool):
            assert default.startswith(f"`{s.default_text}`" if "`" in default else ("on" if s.default else "off"))
        elif s.default_text:
            names = s.default_text.split(", ") if isinstance(s.default, tuple) else [s.default_text]
            assert all(f"`{name}`" in default for name in names), (s.key, default)
        else:
            assert default.startswith(("none", "off")), (s.key, default)
    assert len(covered) >= 15
