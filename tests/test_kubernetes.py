"""Pod attribution against a fake kubelet: a real gRPC PodResourcesLister server on a Unix socket."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_kubelet import FakeKubelet
from gpu_exporter.kubernetes import (
    KubernetesAttributionError,
    PodAttribution,
    PodRef,
    api_pb2,
    device_map,
    normalize_device_id,
)
from prometheus_client import CollectorRegistry, generate_latest

from testbed import wait_until

REPO = Path(__file__).resolve().parents[1]
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
MIG_A = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
INVENTORY = [("0", GPU0, ""), ("1", GPU1, ""), ("1", GPU1, MIG_A)]


def container(name: str, *devices: tuple[str, list[str]]) -> Any:
    return api_pb2.ContainerResources(
        name=name, devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices])


def response(*pods: tuple[str, str, list[Any]]) -> Any:
    return api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(name=name, namespace=ns, containers=cs) for name, ns, cs in pods])


CLUSTER = response(
    ("trainer-0", "ml", [container("main", ("nvidia.com/gpu", [GPU0])),
                         container("sidecar", ("example.com/nic", ["eth9"]))]),
    ("notebook", "research", [container("jupyter", ("nvidia.com/mig-1g.10gb", [MIG_A]))]),
)


@pytest.fixture
def socket_path() -> Iterator[str]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer.
    d = tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")
    yield os.path.join(d, "kubelet.sock")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def kubelet(socket_path: str) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(socket_path, CLUSTER)
    fake.start()
    yield fake
    fake.stop()


def scrape(attribution: PodAttribution) -> str:
    registry = CollectorRegistry()
    registry.register(attribution)
    return generate_latest(registry).decode()


def test_device_map_keeps_gpu_resources_and_folds_time_sliced_replicas() -> None:
    shared = response(
        ("b", "ns", [container("c", ("nvidia.com/gpu", [GPU1 + "::1"]))]),
        ("a", "ns", [container("c", ("nvidia.com/gpu", [GPU1 + "::0"]), ("cpu", ["3"]))]),
    )
    assert device_map(shared) == {GPU1: (PodRef("a", "ns", "c"), PodRef("b", "ns", "c"))}
    assert device_map(CLUSTER) == {GPU0: (PodRef("trainer-0", "ml", "main"),),
                                   MIG_A: (PodRef("notebook", "research", "jupyter"),)}
    assert normalize_device_id(MIG_A) == MIG_A


def test_refresh_maps_gpus_and_mig_devices_to_pods(kubelet: FakeKubelet) -> None:
    attribution = PodAttribution(kubelet.socket_path, devices=lambda: INVENTORY)
    try:
        assert attribution.refresh() is True
        assert attribution.last_success is True and attribution.last_error is None
        assert attribution.lookup() == {GPU0: PodRef("trainer-0", "ml", "main"),
                                        MIG_A: PodRef("notebook", "research", "jupyter")}
        text = scrape(attribution)
    finally:
        attribution.stop()
    assert (f'gpu_pod_info{{container="main",gpu="0",mig_uuid="",namespace="ml",pod="trainer-0",'
            f'uuid="{GPU0}"}} 1.0') in text
    assert (f'gpu_pod_info{{container="jupyter",gpu="1",mig_uuid="{MIG_A}",namespace="research",'
            f'pod="notebook",uuid="{GPU1}"}} 1.0') in text
    assert text.count("gpu_pod_info{") == 2  # GPU1 itself is not allocated as a whole


def test_without_inventory_only_whole_gpus_are_exported(kubelet: FakeKubelet) -> None:
    attribution = PodAttribution(kubelet.socket_path)
    try:
        attribution.refresh()
        text = scrape(attribution)
    finally:
        attribution.stop()
    assert f'gpu="",mig_uuid="",namespace="ml",pod="trainer-0",uuid="{GPU0}"' in text
    assert MIG_A not in text


def test_absent_kubelet_fails_fast_and_recovers_when_it_appears(socket_path: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    # A missing socket fails at once, not at the deadline: 30 s, far beyond what a busy machine adds to a failed
    # connect.
    attribution = PodAttribution(socket_path, timeout_seconds=30.0, devices=lambda: INVENTORY)
    try:
        with caplog.at_level(logging.WARNING, logger="gpu_exporter.kubernetes"):
            for _ in range(3):
                started = time.monotonic()
                assert attribution.refresh() is False
                assert time.monotonic() - started < 10.0
        assert attribution.last_success is False
        assert attribution.last_error is not None and "does not exist" in attribution.last_error
        assert attribution.lookup() == {}
        assert "gpu_pod_info{" not in scrape(attribution)
        assert sum("does not exist" in r.getMessage() for r in caplog.records) == 1  # logged once

        fake = FakeKubelet(socket_path, CLUSTER)
        fake.start()
        try:
            # The first refresh may still meet gRPC's reconnect backoff from the failed connects (its subchannels
            # outlive the closed channel: 1 run in 8 on a busy machine); the refreshes after it recover, as the
            # exporter's, every refresh_seconds, do.
            wait_until(attribution.refresh, 30, interval=0.2, what="a refresh to reach the kubelet that appeared")
            assert attribution.last_success is True and attribution.last_error is None
            assert GPU0 in attribution.lookup()
        finally:
            fake.stop()
    finally:
        attribution.stop()


def test_slow_kubelet_hits_the_deadline_and_keeps_the_last_good_map(kubelet: FakeKubelet) -> None:
    attribution = PodAttribution(kubelet.socket_path, timeout_seconds=0.3, devices=lambda: INVENTORY)
    try:
        assert attribution.refresh() is True
        kubelet.answer = response()
        kubelet.hold()  # the kubelet answers nothing until released: only the deadline can end the refresh
        with ThreadPoolExecutor(max_workers=1) as pool:
            assert pool.submit(attribution.refresh).result(timeout=60) is False
            assert kubelet.waiting == 1  # it returned while its call was still held in the kubelet
            kubelet.release()
        assert attribution.last_error == "kubelet pod-resources List did not answer within 0.3s"
        assert GPU0 in attribution.lookup()  # last good map kept
        assert "trainer-0" in scrape(attribution)
    finally:
        attribution.stop()


def test_kubelet_error_status_is_reported(kubelet: FakeKubelet) -> None:
    kubelet.status = grpc.StatusCode.PERMISSION_DENIED
    attribution = PodAttribution(kubelet.socket_path)
    try:
        assert attribution.refresh() is False
    finally:
        attribution.stop()
    assert attribution.last_error is not None
    assert "PERMISSION_DENIED: fake kubelet refuses" in attribution.last_error


def test_background_refresh_never_blocks_the_scrape(kubelet: FakeKubelet) -> None:
    # The deadline (60 s) outlasts the test's waits: a scrape that waited for the refresh would not return.
    attribution = PodAttribution(kubelet.socket_path, refresh_seconds=0.1, timeout_seconds=60.0,
                                 devices=lambda: INVENTORY)
    attribution.start()
    try:
        deadline = time.monotonic() + 10
        while GPU0 not in attribution.lookup() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert GPU0 in attribution.lookup()
        kubelet.hold()  # the next refresh sits in the kubelet until released
        kubelet.answer = response(("trainer-1", "ml", [container("main", ("nvidia.com/gpu", [GPU1]))]))
        deadline = time.monotonic() + 10
        while not kubelet.waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kubelet.waiting == 1
        with ThreadPoolExecutor(max_workers=1) as pool:
            for _ in range(5):  # each scrape answers, from the last good map, while the refresh is held
                assert "trainer-0" in pool.submit(scrape, attribution).result(timeout=60)
                assert kubelet.waiting == 1
        kubelet.delay = 0.8  # from now on every refresh sits in the kubelet for 0.8 s, stop()'s included
        kubelet.release()
        deadline = time.monotonic() + 10
        while GPU1 not in attribution.lookup() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert attribution.lookup() == {GPU1: PodRef("trainer-1", "ml", "main")}
    finally:
        kubelet.release()
        started = time.monotonic()
        attribution.stop()
    # the thread ends with the call it is in, not at its join's limit (the 60 s deadline + 1 s)
    assert time.monotonic() - started < 10
    calls = kubelet.calls
    time.sleep(0.3)
    assert kubelet.calls == calls  # the thread is gone


def test_broken_inventory_gives_an_empty_family(kubelet: FakeKubelet) -> None:
    def broken() -> list[tuple[str, str, str]]:
        raise RuntimeError("NVML went away")

    attribution = PodAttribution(kubelet.socket_path, devices=broken)
    try:
        attribution.refresh()
        text = scrape(attribution)
    finally:
        attribution.stop()
    assert "# TYPE gpu_pod_info gauge" in text and "gpu_pod_info{" not in text


def test_bad_intervals_are_rejected() -> None:
    with pytest.raises(KubernetesAttributionError, match="must be positive"):
        PodAttribution("/nonexistent.sock", refresh_seconds=0)


def test_without_grpc_import_works_and_enabling_fails_with_one_sentence() -> None:
    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "import gpu_exporter.kubernetes as k\n"
        "try:\n"
        "    k.PodAttribution('/x.sock')\n"
        "except k.KubernetesAttributionError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, timeout=60).stdout.strip()
    assert out.startswith("Kubernetes pod attribution needs grpcio and protobuf")
    assert "gpu-utilization-exporter[kubernetes]" in out and "\n" not in out

