"""``python -m monitoring``: rewrite every generated monitoring file; ``--check``: exit 1 on drift."""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_exporter.config_doc import check_flag, write_or_check

from monitoring import GENERATORS, build
from monitoring.paths import ROOT


def main(argv: list[str] | None = None) -> int:
    check = check_flag("python -m monitoring", "Generate rules, dashboards and Grafana alerts from one config.", argv)
    outputs: dict[Path, str] = {}
    try:
        model = build()
        for generate in GENERATORS:
            outputs.update(generate(model))
    except (KeyError, ValueError) as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    return write_or_check(outputs, ROOT, "python -m monitoring", check)


if __name__ == "__main__":
    sys.exit(main())
