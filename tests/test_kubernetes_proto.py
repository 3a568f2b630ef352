"""The committed protobuf module for the kubelet pod-resources API matches its .proto file."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROTO = "gpu_exporter/podresources/api.proto"
GENERATED = REPO / "exporter" / "gpu_exporter" / "podresources" / "api_pb2.py"


def serialized_descriptor(source: str) -> bytes:
    """The file descriptor embedded in generated code: what the .proto means, without tool versions."""
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", source)
    assert match is not None, "no serialized descriptor in the generated module"
    value = ast.literal_eval(match.group(1))
    assert isinstance(value, bytes)
    return value


def test_committed_module_is_generated_from_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'exporter'}",
                    f"--python_out={tmp_path}", str(REPO / "exporter" / PROTO)], check=True, timeout=60)
    fresh = (tmp_path / "gpu_exporter" / "podresources" / "api_pb2.py").read_text()
    assert serialized_descriptor(fresh) == serialized_descriptor(GENERATED.read_text())


def test_field_numbers_the_exporter_reads_match_the_kubelet() -> None:
    from gpu_exporter.kubernetes import api_pb2

    # Field numbers of k8s.io/kubelet/pkg/apis/podresources/v1/api.proto.
    assert api_pb2.ListPodResourcesResponse.DESCRIPTOR.fields_by_name["pod_resources"].number == 1
    pod = api_pb2.PodResources.DESCRIPTOR.fields_by_name
    assert (pod["name"].number, pod["namespace"].number, pod["containers"].number) == (1, 2, 3)
    ctr = api_pb2.ContainerResources.DESCRIPTOR.fields_by_name
    assert (ctr["name"].number, ctr["devices"].number) == (1, 2)
    dev = api_pb2.ContainerDevices.DESCRIPTOR.fields_by_name
    assert (dev["resource_name"].number, dev["device_ids"].number) == (1, 2)
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert service.methods_by_name["List"].input_type.full_name == "v1.ListPodResourcesRequest"
