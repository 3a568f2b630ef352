"""Pod attribution: which Kubernetes pod, namespace and container holds each GPU or MIG device.

A background thread asks the kubelet's pod-resources API (gRPC ``v1.PodResourcesLister/List``
over a Unix socket) every few seconds and keeps the newest successful answer. Scrapes only read
that answer, so a slow or absent kubelet never delays ``/metrics``. Example::

    attribution = PodAttribution("/var/lib/kubelet/pod-resources/kubelet.sock",
                                 devices=lambda: [("0", "GPU-8a1c...", "")])
    attribution.start()
    registry.register(attribution)      # emits gpu_pod_info{gpu,uuid,mig_uuid,pod,namespace,container} 1
    attribution.lookup()                # {"GPU-8a1c...": PodRef("trainer-0", "ml", "main")}
    attribution.stop()
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpu_exporter import catalog

if TYPE_CHECKING:
    from gpu_exporter.collectors.base import Assembly

try:
    import grpc

    # Generated code has no type stubs: use it as Any.
    api_pb2: Any = importlib.import_module("gpu_exporter.podresources.api_pb2")
except Exception as exc:  # ImportError, or protobuf's VersionError for a too old runtime
    _IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = None

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_LIST_METHOD = "/v1.PodResourcesLister/List"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

DeviceInventory = Callable[[], list[tuple[str, str, str]]]


class KubernetesAttributionError(RuntimeError):
    """Pod attribution cannot run (for example grpcio is not installed)."""


class PodRef(NamedTuple):
    """The container a device is allocated to, e.g. ``PodRef("trainer-0", "ml", "main")``."""

    pod: str
    namespace: str
    container: str


def is_gpu_resource(resource_name: str) -> bool:
    """True for resources of the NVIDIA device plugin: ``nvidia.com/gpu`` and ``nvidia.com/mig-<profile>``.

    >>> is_gpu_resource("nvidia.com/mig-1g.10gb"), is_gpu_resource("cpu")
    (True, False)
    """
    return resource_name == GPU_RESOURCE or resource_name.startswith(MIG_RESOURCE_PREFIX)


def normalize_device_id(device_id: str) -> str:
    """Strip the replica suffix the device plugin adds when a GPU is time-sliced.

    >>> normalize_device_id("GPU-1f2e::3")
    'GPU-1f2e'
    """
    return device_id.split("::", 1)[0]


def device_map(response: Any) -> dict[str, tuple[PodRef, ...]]:
    """Map device IDs in a ``ListPodResourcesResponse`` to the containers holding them.

    A time-sliced GPU can be held by several containers; they are listed sorted.
    """
    found: dict[str, set[PodRef]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(pod.name, pod.namespace, container.name)
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    found.setdefault(normalize_device_id(device_id), set()).add(ref)
    return {device: tuple(sorted(refs)) for device, refs in found.items()}


class PodAttribution(Collector):
    """Keeps the kubelet's device-to-pod map fresh in a background thread and exports ``gpu_pod_info``.

    ``devices`` returns the exporter's inventory as ``(gpu index, gpu uuid, mig uuid or "")``; it
    fills the ``gpu`` and ``uuid`` labels of MIG devices. Without it only whole GPUs allocated by
    UUID are exported, with an empty ``gpu`` label. ``last_success`` and ``last_error`` describe
    the newest refresh, for ``gpu_exporter_collector_success{collector="kubernetes"}`` (``healthy``).
    """

    name = "kubernetes"

    @classmethod
    def build(cls, assembly: Assembly) -> PodAttribution:
        """The exporter's (gpu_exporter.collectors): its inventory is the GPUs and MIG instances the poller found."""
        def devices() -> list[tuple[str, str, str]]:  # each GPU, then its MIG instances
            return [(str(gpu.index), gpu.uuid, mig) for gpu in assembly.poller.discovery.gpus
                    for mig in ("", *(m.uuid for m in gpu.mig_instances))]

        config = assembly.config
        return cls(config.kubernetes_pod_resources_socket, config.kubernetes_refresh_seconds, devices=devices)

    @property
    def healthy(self) -> bool:
        """Whether the newest refresh succeeded."""
        return self.last_success

    def __init__(self, socket_path: str = DEFAULT_SOCKET, refresh_seconds: float = 10.0,
                 timeout_seconds: float = 2.0, *, devices: DeviceInventory | None = None) -> None:
        if _IMPORT_ERROR is not None:
            raise KubernetesAttributionError(
                "Kubernetes pod attribution needs grpcio and protobuf>=7.35 "
                f"({_IMPORT_ERROR}): install 'gpu-utilization-exporter[kubernetes]' "
                "or set kubernetes.enabled to false.")
        if refresh_seconds <= 0 or timeout_seconds <= 0:
            raise KubernetesAttributionError(
                f"kubernetes refresh_seconds ({refresh_seconds}) and timeout ({timeout_seconds}) "
                "must be positive numbers of seconds.")
        self.socket_path = socket_path
        self.refresh_seconds = refresh_seconds
        self.timeout_seconds = timeout_seconds
        self.last_success = False
        self.last_error: str | None = "no refresh yet"
        self._devices = devices
        self._map: dict[str, tuple[PodRef, ...]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: Any = None
        self._state = "starting"

    def start(self) -> None:
        """Start the refresher thread; the first refresh runs at once, in that thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kubelet-pod-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the refresher (waits at most one call timeout) and close the gRPC channel."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_seconds + 1.0)
            self._thread = None
        self._close_channel()

    def lookup(self) -> dict[str, PodRef]:
        """Device ID -> the container holding it, from the newest successful refresh (a copy).

        For a time-sliced GPU held by several containers, the first in sorted order.
        """
        with self._lock:
            current = self._map
        return {device: refs[0] for device, refs in current.items()}

    def refresh(self) -> bool:
        """Ask the kubelet once (bounded by the timeout); keep the old map on failure. True on success."""
        try:
            response = self._list()(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_seconds)
            new_map = device_map(response)
        except grpc.RpcError as err:
            self._close_channel()
            state, message = self._describe(err)
            self.last_success, self.last_error = False, message
            if self._state != state:
                log.warning("%s (keeping the last known map of %d devices; retrying every %gs)",
                            message, len(self._map), self.refresh_seconds)
                self._state = state
            return False
        with self._lock:
            self._map = new_map
        self.last_success, self.last_error = True, None
        if self._state != "ok":
            log.info("kubelet pod-resources API at %s answered: %d GPU devices allocated to pods",
                     self.socket_path, len(new_map))
            self._state = "ok"
        return True

    def collect(self) -> Iterator[Metric]:
        """Yield ``gpu_pod_info`` for every device of the inventory that a container holds."""
        family = catalog.GPU_POD_INFO.new()
        with self._lock:
            current = self._map
        for gpu, uuid, mig_uuid in self._inventory(current):
            for ref in current.get(mig_uuid or uuid, ()):
                family.add_metric([gpu, uuid, mig_uuid, ref.pod, ref.namespace, ref.container], 1.0)
        yield family

    def _inventory(self, current: dict[str, tuple[PodRef, ...]]) -> list[tuple[str, str, str]]:
        if self._devices is None:
            return [("", device, "") for device in sorted(current) if device.startswith("GPU-")]
        try:
            return self._devices()
        except Exception as err:  # a broken inventory must not fail the scrape
            log.warning("pod attribution: the device inventory failed (%s); %s is empty", err,
                        catalog.GPU_POD_INFO.name)
            return []

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_seconds)

    def _list(self) -> Any:
        if self._channel is None:
            self._channel = grpc.insecure_channel("unix://" + os.path.abspath(self.socket_path),
                                                  options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)])
        return self._channel.unary_unary(
            _LIST_METHOD,
            request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
            response_deserializer=api_pb2.ListPodResourcesResponse.FromString)

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _describe(self, err: Any) -> tuple[str, str]:
        """(state key for log-once, one-line message) for a failed call."""
        if not os.path.exists(self.socket_path):
            return "absent", (f"kubelet pod-resources socket {self.socket_path} does not exist: mount the "
                              "host's /var/lib/kubelet/pod-resources into the container")
        code = err.code() if hasattr(err, "code") else None
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "slow", f"kubelet pod-resources List did not answer within {self.timeout_seconds:g}s"
        name = code.name if code is not None else type(err).__name__
        details = err.details() if hasattr(err, "details") else str(err)
        return name, f"kubelet pod-resources List at {self.socket_path} failed: {name}: {details}"
