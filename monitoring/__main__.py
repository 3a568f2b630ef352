"""``python -m monitoring``: rewrite every generated monitoring file; ``--check``: exit 1 on drift."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from monitoring import GENERATORS, build
from monitoring.paths import ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring", allow_abbrev=False,
                                     description="Generate rules, dashboards and Grafana alerts from one config.")
    parser.add_argument("--check", action="store_true", help="only report files that are out of date (exit 1)")
    args = parser.parse_args(argv)
    outputs: dict[Path, str] = {}
    try:
        model = build()
        for generate in GENERATORS:
            outputs.update(generate(model))
    except (KeyError, ValueError) as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
    for path in stale:
        if args.check:
            print(f"out of date: {path.relative_to(ROOT)} (run python -m monitoring)")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(outputs[path])
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
