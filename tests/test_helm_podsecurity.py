"""The privilege table of docs/deployment.md and the chart's README against the rendered DaemonSet.

Each row of the table names chart values (``--set`` pairs, or "default") and the Pod Security level
the pod needs. The test renders the chart with those values through Helm's SDK and judges the pod with
the Pod Security Standards' rules for the fields this chart sets (host namespaces, hostPath and
other volume types, privileged, added and dropped capabilities, non-root user, privilege escalation,
seccomp): the lowest level the pod passes must be the row's. Not a real admission controller; the
rules are those of https://kubernetes.io/docs/concepts/security/pod-security-standards/.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpu-utilization-exporter"
DOCS = REPO / "docs" / "deployment.md"
README = CHART / "README.md"

helm.disable_logging()

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
"""The capabilities baseline lets a container add."""
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def level(pod: dict[str, Any]) -> str:
    """The lowest Pod Security level ``pod`` (a pod spec) passes: restricted, baseline or privileged."""
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    pod_sc = pod.get("securityContext") or {}
    scs = [c.get("securityContext") or {} for c in containers]
    volume_types = {key for v in pod.get("volumes", []) for key in v if key != "name"}
    baseline = (not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
                and not any(sc.get("privileged") for sc in scs)
                and all(set((sc.get("capabilities") or {}).get("add", [])) <= BASELINE_CAPS for sc in scs)
                and "hostPath" not in volume_types
                and not any(p.get("hostPort") for c in containers for p in c.get("ports", [])))
    if not baseline:
        return "privileged"

    def effective(sc: dict[str, Any], key: str) -> Any:
        return sc.get(key, pod_sc.get(key))

    restricted = (volume_types <= RESTRICTED_VOLUMES
                  and all(sc.get("allowPrivilegeEscalation") is False for sc in scs)
                  and all(effective(sc, "runAsNonRoot") is True for sc in scs)
                  and all(effective(sc, "runAsUser") != 0 for sc in scs) and pod_sc.get("runAsUser") != 0
                  and all((effective(sc, "seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
                          for sc in scs)
                  and all("ALL" in (sc.get("capabilities") or {}).get("drop", []) for sc in scs)
                  and all(set((sc.get("capabilities") or {}).get("add", [])) <= {"NET_BIND_SERVICE"} for sc in scs))
    return "restricted" if restricted else "baseline"


def pod_spec(values: dict[str, Any]) -> dict[str, Any]:
    with helm.Chart.load(CHART) as loaded:
        out = loaded.render(values, name="gpu", namespace="monitoring", is_install=True)
    (ds,) = [d for name, text in out.items() if not name.endswith("NOTES.txt")
             for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet"]
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def table_lines(path: Path) -> list[str]:
    """The lines of the privilege table in ``path``, header included."""
    text = path.read_text()
    lines = text[text.index("| values (`--set`) |"):].splitlines()
    return lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]


def table(path: Path) -> list[tuple[str, str]]:
    """(values cell, level) of each row of the privilege table in ``path``."""
    rows = []
    for line in table_lines(path)[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        found = re.match(r"`(privileged|baseline|restricted)`", cells[-1])
        assert found, f"{path.name}: no level in {line!r}"
        rows.append((cells[0], found.group(1)))
    return rows


def values_of(cell: str) -> dict[str, Any]:
    """``podAttribution.enabled=false`` (backticked, comma-separated) -> nested values; "default" -> {}."""
    values: dict[str, Any] = {}
    if cell == "default":
        return values
    (sets,) = re.fullmatch(r"`([^`]+)`", cell).groups()  # type: ignore[union-attr]
    for pair in sets.split(","):
        key, value = pair.split("=", 1)
        *parents, leaf = key.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return values


def test_the_level_check_can_fail() -> None:
    hardened: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    good: dict[str, Any] = {"containers": [{"securityContext": hardened}], "volumes": [{"name": "tmp", "emptyDir": {}}]}
    assert level(good) == "restricted"
    assert level({**good, "containers": [{"securityContext": {}}]}) == "baseline"
    assert level({**good, "hostPID": True}) == "privileged"
    assert level({**good, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}) == "privileged"
    ptrace = {**hardened, "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]}}
    assert level({**good, "containers": [{"securityContext": ptrace}]}) == "privileged"


def test_docs_and_readme_carry_the_same_table() -> None:
    assert table_lines(DOCS) == table_lines(README)
    docs = table(DOCS)
    assert len(docs) == 4
    assert [cell for cell, _ in docs] == ["`podAttribution.enabled=false`", "default", "`hostPID=true`",
                                          "`hostPID=true,sampling.rate=20`"]


@pytest.mark.parametrize(("cell", "expected"), table(DOCS), ids=lambda v: str(v))
def test_each_row_renders_a_pod_of_its_level(cell: str, expected: str) -> None:
    spec = pod_spec(values_of(cell))
    assert level(spec) == expected, (cell, spec.get("securityContext"), spec["containers"][0]["securityContext"],
                                     spec.get("volumes"))
