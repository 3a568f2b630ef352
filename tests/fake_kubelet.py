"""A fake kubelet for tests: a real gRPC PodResourcesLister (v1 List) on a Unix socket.

Example::

    kubelet = FakeKubelet("/tmp/k/kubelet.sock", answer=api_pb2.ListPodResourcesResponse())
    kubelet.start()
    kubelet.delay = 5.0          # a slow kubelet
    kubelet.hold()               # a kubelet that answers nothing until kubelet.release()
    kubelet.stop()
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc
from gpu_exporter.kubernetes import api_pb2


class FakeKubelet:
    """A PodResourcesLister on a Unix socket; ``answer``, ``delay`` and ``status`` are changeable; :meth:`hold`
    keeps every call waiting until :meth:`release` (``waiting``: the calls held now)."""

    def __init__(self, socket_path: str, answer: Any) -> None:
        self.socket_path = socket_path
        self.answer = answer
        self.delay = 0.0
        self.status: grpc.StatusCode | None = None
        self.calls = 0
        self.waiting = 0
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._server: Any = None

    def hold(self) -> None:
        """Every call from now on waits inside the kubelet until :meth:`release`."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def _list(self, request: Any, context: Any) -> Any:
        self.calls += 1
        with self._lock:
            self.waiting += 1
        try:
            self._open.wait()
        finally:
            with self._lock:
                self.waiting -= 1
        time.sleep(self.delay)
        if self.status is not None:
            context.abort(self.status, "fake kubelet refuses")
        return self.answer

    def start(self) -> None:
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=api_pb2.ListPodResourcesResponse.SerializeToString)})
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port("unix:" + self.socket_path)
        self._server.start()

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
