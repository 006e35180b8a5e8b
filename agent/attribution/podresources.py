"""A client for the kubelet's pod-resources socket: which pod and container each device was given to.

The kubelet serves it on a Unix socket (default /var/lib/kubelet/pod-resources/kubelet.sock); the agent
needs that directory mounted, read-only is enough. With the NVIDIA device plugin the device ids are GPU
UUIDs ("GPU-...") or MIG UUIDs ("MIG-..."). Anything that goes wrong (grpc not installed, no socket, a
slow or failing kubelet) makes `list` answer None, "not available", logged once per outage; nothing
raises into the caller.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpulens.agent.attribution.kubelet_podresources_v1_pb2 import (
        ListPodResourcesRequest,
        ListPodResourcesResponse,
    )

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet's own limit for pod-resources answers; gRPC's client default (4 MiB) is smaller and a
# node with many pods exceeds it (dcgm-exporter uses the same 16 MiB).
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class _Lister(Protocol):
    """The generated PodResourcesListerStub, as far as the client uses it."""

    def List(self, request: ListPodResourcesRequest, timeout: float) -> ListPodResourcesResponse: ...  # noqa: N802 - gRPC's name


@dataclass(frozen=True)
class DeviceAllocation:
    """One device the kubelet allocated to one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", ...
    device_id: str  # as the device plugin reported it


class PodResourcesClient:
    """Calls the kubelet's PodResourcesLister.List over `socket_path`, waiting at most `timeout` seconds."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self.reason = ""  # why the last call was not answered; "" after an answer
        self._messages: Any = None
        self._channel: Any = None
        self._stub: _Lister | None = None

    def list(self) -> list[DeviceAllocation] | None:
        """Return every device allocation on the node, or None when the socket cannot answer."""
        try:
            if not os.path.exists(self.socket_path):
                self._unavailable(
                    f"pod-resources socket {self.socket_path} not found; mount /var/lib/kubelet/pod-resources "
                    "into the agent (read-only) to get pod and container names"
                )
                return None
            stub = self._connect()
            if stub is None:
                return None
            response = stub.List(self._messages.ListPodResourcesRequest(), timeout=self.timeout)
        except Exception as error:  # noqa: BLE001 - whatever the kubelet does wrong is "not available", never the caller's
            self._unavailable(f"pod-resources List on {self.socket_path} failed: {_describe(error)}")
            return None
        if self.reason:
            log.info("pod-resources socket %s answers again", self.socket_path)
            self.reason = ""
        return [
            DeviceAllocation(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
            for pod in response.pod_resources
            for container in pod.containers
            for devices in container.devices
            for device_id in devices.device_ids
        ]

    def _connect(self) -> _Lister | None:
        """Return the stub, opening the channel on first use; None when grpc cannot be loaded."""
        if self._stub is not None:
            return self._stub
        try:
            import grpc

            from gpulens.agent.attribution import kubelet_podresources_v1_pb2 as messages
            from gpulens.agent.attribution import kubelet_podresources_v1_pb2_grpc as services
        # Besides ImportError, the generated stubs raise RuntimeError (grpc) or VersionError (protobuf)
        # when the installed library is older than the one they were generated for.
        except Exception as error:  # noqa: BLE001 - see above
            self._unavailable(f"cannot load grpc for the pod-resources client ({error}); install gpulens[kubernetes]")
            return None
        self._messages = messages
        self._channel = grpc.insecure_channel(
            f"unix://{self.socket_path}",
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
        )
        stub: _Lister = services.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        self._stub = stub
        return stub

    def _unavailable(self, reason: str) -> None:
        # Once per outage: a missing socket would otherwise be logged on every refresh.
        if not self.reason:
            log.warning("%s", reason)
        self.reason = reason

    def close(self) -> None:
        """Close the channel; the next `list` opens a new one."""
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None


def _describe(error: Exception) -> str:
    """Return a one-line description of `error`, with the gRPC status where there is one."""
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if callable(code) and callable(details):
        try:
            return f"{code().name}: {details()}"
        except Exception:  # noqa: BLE001 - a half-built RpcError still deserves a message
            pass
    return str(error) or type(error).__name__
