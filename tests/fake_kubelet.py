"""A fake kubelet for tests: a real gRPC PodResourcesLister (v1 List) on a Unix socket.

Example::

    kubelet = FakeKubelet("/tmp/k/kubelet.sock", answer=api_pb2.ListPodResourcesResponse())
    kubelet.start()
    kubelet.delay = 5.0          # a slow kubelet
    kubelet.stop()
"""

from __future__ import annotations

import time
from concurrent import futures
from typing import Any

import grpc
from gpu_exporter.kubernetes import api_pb2


class FakeKubelet:
    """A PodResourcesLister on a Unix socket; ``answer``, ``delay`` and ``status`` are changeable."""

    def __init__(self, socket_path: str, answer: Any) -> None:
        self.socket_path = socket_path
        self.answer = answer
        self.delay = 0.0
        self.status: grpc.StatusCode | None = None
        self.calls = 0
        self._server: Any = None

    def _list(self, request: Any, context: Any) -> Any:
        self.calls += 1
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
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
