#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs everything the tests need into
# ./.venv (plus the Debian packages prometheus and prometheus-alertmanager), then runs ruff,
# mypy --strict and pytest. Extra arguments go to pytest, e.g. `bash tests/run.sh -k config`.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  echo "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# (pip's notes about optional local package indexes are noise on most machines)
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | { grep -v "is ignored: it is neither" || true; }

.venv/bin/ruff check exporter tests bench examples prometheus monitoring
.venv/bin/mypy --strict
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
