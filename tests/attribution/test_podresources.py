"""The pod-resources client against a real gRPC server on a Unix socket, as the kubelet serves it."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import threading
from concurrent import futures
from pathlib import Path

import pytest


def require(module: str):
    """Import `module`; skip without it, or fail in CI (GPULENS_REQUIRE_TOOLS=1), which installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        message = f"{module} is not installed; pip install -e '.[dev]' brings it"
        if os.environ.get("GPULENS_REQUIRE_TOOLS") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)


grpc = require("grpc")

from gpulens.agent.attribution import kubelet_podresources_v1_pb2 as api  # noqa: E402
from gpulens.agent.attribution import kubelet_podresources_v1_pb2_grpc as api_grpc  # noqa: E402
from gpulens.agent.attribution.podresources import DeviceAllocation, PodResourcesClient  # noqa: E402

GPU_0 = "GPU-8a7b6c5d-1e2f-4a3b-9c8d-7e6f5a4b3c2d"
GPU_1 = "GPU-1f2e3d4c-5b6a-4978-8a9b-0c1d2e3f4a5b"
MIG_0 = "MIG-2b3c4d5e-6f7a-5b8c-9d0e-1f2a3b4c5d6e"


def two_pods() -> api.ListPodResourcesResponse:
    """What a kubelet with the NVIDIA device plugin answers for a training pod and an inference pod."""
    return api.ListPodResourcesResponse(
        pod_resources=[
            api.PodResources(
                name="trainer-0",
                namespace="ml",
                containers=[
                    api.ContainerResources(
                        name="pytorch",
                        devices=[
                            api.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=[GPU_0, GPU_1],
                                topology=api.TopologyInfo(nodes=[api.NUMANode(ID=0)]),
                            )
                        ],
                        cpu_ids=[2, 3],
                    ),
                    api.ContainerResources(name="log-shipper"),
                ],
            ),
            api.PodResources(
                name="infer-7d9f",
                namespace="serving",
                containers=[
                    api.ContainerResources(
                        name="triton",
                        devices=[api.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=[MIG_0])],
                        memory=[api.ContainerMemory(memory_type="memory", size=8 << 30)],
                    )
                ],
            ),
        ]
    )


class Kubelet(api_grpc.PodResourcesListerServicer):
    """A kubelet's pod-resources service that answers, stalls or fails as the test says."""

    def __init__(self, behaviour: str = "answer"):
        self.behaviour = behaviour
        self.release = threading.Event()
        self.calls = 0

    def List(self, request, context):  # noqa: N802 - the kubelet's gRPC method is named so
        self.calls += 1
        if self.behaviour == "stall":
            self.release.wait(10)
        if self.behaviour == "fail":
            context.abort(grpc.StatusCode.INTERNAL, "pod resources provider is not ready")
        return two_pods()


@pytest.fixture
def serve(tmp_path):
    """Start a real gRPC server for a Kubelet on a Unix socket; return the socket's path."""
    started = []

    def start(kubelet: Kubelet) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
        path = str(tmp_path / "kubelet.sock")
        server.add_insecure_port(f"unix://{path}")
        server.start()
        started.append((server, kubelet))
        return path

    yield start
    for server, kubelet in started:
        kubelet.release.set()
        server.stop(grace=None)


def test_lists_every_gpu_of_every_container(serve):
    client = PodResourcesClient(serve(Kubelet()), timeout=5.0)
    assert client.list() == [
        DeviceAllocation("ml", "trainer-0", "pytorch", "nvidia.com/gpu", GPU_0),
        DeviceAllocation("ml", "trainer-0", "pytorch", "nvidia.com/gpu", GPU_1),
        DeviceAllocation("serving", "infer-7d9f", "triton", "nvidia.com/mig-1g.10gb", MIG_0),
    ]
    assert client.reason == ""
    client.close()


def test_resolver_gets_pod_names_over_the_socket(serve):
    from gpulens.agent.attribution.resolver import PodRef, Resolver

    resolver = Resolver(podresources=PodResourcesClient(serve(Kubelet()), timeout=5.0))
    assert resolver.gpu_allocations() == {
        GPU_0: PodRef("ml", "trainer-0", "pytorch"),
        GPU_1: PodRef("ml", "trainer-0", "pytorch"),
        MIG_0: PodRef("serving", "infer-7d9f", "triton"),
    }


def test_absent_socket_is_not_available_and_said_once(tmp_path, caplog):
    client = PodResourcesClient(str(tmp_path / "kubelet.sock"))
    with caplog.at_level(logging.WARNING, logger="gpulens.agent.attribution.podresources"):
        assert client.list() is None
        assert client.list() is None
    assert "not found" in client.reason and "mount /var/lib/kubelet/pod-resources" in client.reason
    assert len(caplog.records) == 1


def test_socket_with_no_server_is_not_available(tmp_path):
    path = tmp_path / "kubelet.sock"
    path.touch()  # a stale socket file left by a kubelet that is down
    client = PodResourcesClient(str(path), timeout=1.0)
    assert client.list() is None
    assert "UNAVAILABLE" in client.reason


def test_slow_kubelet_times_out(serve):
    kubelet = Kubelet("stall")
    client = PodResourcesClient(serve(kubelet), timeout=0.2)
    assert client.list() is None
    assert "DEADLINE_EXCEEDED" in client.reason
    assert kubelet.calls == 1


def test_failing_kubelet_is_not_available_then_recovers(serve, caplog):
    kubelet = Kubelet("fail")
    client = PodResourcesClient(serve(kubelet), timeout=5.0)
    with caplog.at_level(logging.INFO, logger="gpulens.agent.attribution.podresources"):
        assert client.list() is None
        assert client.list() is None
        assert "INTERNAL: pod resources provider is not ready" in client.reason
        kubelet.behaviour = "answer"
        assert len(client.list()) == 3
    assert client.reason == ""
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_without_grpc_it_is_not_available(serve, monkeypatch):
    path = serve(Kubelet())
    monkeypatch.setitem(sys.modules, "grpc", None)  # what an agent installed without the extra sees
    client = PodResourcesClient(path)
    assert client.list() is None
    assert "install gpulens[kubernetes]" in client.reason


def test_stubs_match_the_proto(tmp_path):
    """The committed stubs were generated from the committed proto (regenerate with generate_stubs.sh)."""
    require("grpc_tools.protoc")
    from google.protobuf import descriptor_pb2

    here = Path(api.__file__).parent
    out = tmp_path / "descriptor.pb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-Igpulens/agent/attribution={here}",
            f"--descriptor_set_out={out}",
            "gpulens/agent/attribution/kubelet_podresources_v1.proto",
        ],
        check=True,
    )
    from_proto = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    for message in from_proto.message_type:
        for field in message.field:
            field.ClearField("json_name")  # a descriptor set spells these out; generated code derives them
    assert descriptor_pb2.FileDescriptorProto.FromString(api.DESCRIPTOR.serialized_pb) == from_proto


def test_field_numbers_are_the_kubelets():
    """The wire format depends on these numbers, as in k8s.io/kubelet/pkg/apis/podresources/v1/api.proto."""

    def numbers(message) -> dict[str, int]:
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(api.ListPodResourcesResponse) == {"pod_resources": 1}
    assert numbers(api.PodResources) == {"name": 1, "namespace": 2, "containers": 3}
    assert numbers(api.ContainerResources) == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert numbers(api.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert numbers(api.ContainerMemory) == {"memory_type": 1, "size": 2, "topology": 3}
    assert numbers(api.TopologyInfo) == {"nodes": 1}
    assert numbers(api.NUMANode) == {"ID": 1}
    assert numbers(api.AllocatableResourcesResponse) == {"devices": 1, "cpu_ids": 2, "memory": 3}
    assert numbers(api.DynamicResource) == {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}
    service = api.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]
