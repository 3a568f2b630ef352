#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs everything the tests need into
# ./.venv (plus the Debian packages prometheus and prometheus-alertmanager), then runs ruff,
# mypy --strict and pytest. Extra arguments go to pytest, e.g. `bash tests/run.sh -k config`.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v vmalert >/dev/null || missing+=(victoria-metrics)  # tests/test_fleet.py: VictoriaMetrics + vmalert tier
command -v chromium >/dev/null || missing+=(chromium fonts-liberation)  # tests/test_status_page.py: a real browser
command -v ss >/dev/null || missing+=(iproute2)  # tests/test_http_server.py reads the listen backlog
# The container tests (tests/test_container.py): podman builds and runs the image on a Debian base
# that scripts/container-base.sh makes with debootstrap (about 1-2 min, once per machine: podman keeps it).
command -v podman >/dev/null || missing+=(podman netavark)
[ -x /usr/sbin/runc ] || command -v runc >/dev/null || missing+=(runc)
[ -x /usr/sbin/debootstrap ] || command -v debootstrap >/dev/null || missing+=(debootstrap)
# Debian's docker-compose 1.29 validates docker-compose.yml (`config` needs no engine)
command -v docker-compose >/dev/null || missing+=(docker-compose)
# busybox's wget runs compose's Prometheus/Alertmanager healthchecks in the podman compose test
[ -x /bin/busybox ] || missing+=(busybox-static)
# a user-defined podman network (tests/test_user_job.py): netavark's firewall rules and aardvark's names
[ -x /usr/sbin/iptables ] || missing+=(iptables)
[ -x /usr/lib/podman/aardvark-dns ] || missing+=(aardvark-dns)
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  echo "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# @grafana/schema 12.x and 13.x plus typescript for the dashboard schema check
# (tests/test_grafana_dashboards.py), into tests/schema/node_modules; again only when the lock changes.
if ! command -v npm >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  echo "installing Debian package: npm"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
if ! cmp -s tests/schema/package-lock.json tests/schema/node_modules/.installed-lock.json; then
  (cd tests/schema && npm ci --no-audit --no-fund --loglevel=error >/dev/null \
    && cp package-lock.json node_modules/.installed-lock.json)
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# (pip's notes about optional local package indexes are noise on most machines)
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | { grep -v "is ignored: it is neither" || true; }

.venv/bin/ruff check exporter tests bench examples prometheus monitoring scripts
.venv/bin/mypy --strict
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=40 "$@"
