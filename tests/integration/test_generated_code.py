"""The committed wire code in nstance/rpc/: no drift, honest version floors, upstream field numbers.

A renumbered field, a changed type or a changed streaming shape breaks interoperability with the
Go implementation of Nstance silently, so every message, field and RPC of the nstance.v1 API is
pinned here from the upstream reference (docs: reference/upstream-nstance.md §2.2-2.4).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as pb_descriptor
from google.protobuf import empty_pb2, timestamp_pb2
from packaging.requirements import Requirement
from packaging.version import Version

from nstance.rpc import (
    agent_pb2,
    agent_pb2_grpc,
    operator_pb2,
    operator_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
RPC_DIR = REPO_ROOT / "nstance" / "rpc"
GEN_SCRIPT = REPO_ROOT / "scripts" / "gen_proto.py"
PB2_MODULES = {"registration": registration_pb2, "agent": agent_pb2, "operator": operator_pb2}
GRPC_MODULES = {
    "registration": registration_pb2_grpc,
    "agent": agent_pb2_grpc,
    "operator": operator_pb2_grpc,
}


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nstance_gen_proto", GEN_SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return _load_generator()


# --------------------------------------------------------------------------------------------
# Drift
# --------------------------------------------------------------------------------------------


def test_committed_code_equals_fresh_generation(gen: ModuleType, tmp_path: Path) -> None:
    gen.generate(tmp_path)
    fresh = {p.name: p.read_bytes() for p in gen.generated_files(tmp_path)}
    committed = {p.name: p.read_bytes() for p in gen.generated_files(RPC_DIR)}
    assert sorted(fresh) == sorted(committed), "run `make proto` (python scripts/gen_proto.py)"
    changed = sorted(name for name in fresh if fresh[name] != committed[name])
    assert changed == [], f"nstance/rpc/ drifted from protos/ in {changed}; run `make proto`"
    assert gen.main(["--check"]) == 0


def test_check_reports_changed_missing_and_stale_files(gen: ModuleType, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    gen.generate(fresh)
    copy = tmp_path / "copy"
    shutil.copytree(fresh, copy)
    assert gen.diff(fresh, copy) == []

    (copy / "agent_pb2.py").write_bytes(b"# hand-edited\n")
    (copy / "operator_pb2.pyi").unlink()
    (copy / "old_pb2.py").write_text("")
    assert gen.diff(fresh, copy) == [
        "agent_pb2.py (differs)",
        "old_pb2.py (stale, not generated from protos/)",
        "operator_pb2.pyi (missing)",
    ]

    # Regenerating over the copy repairs it, drops the stale module and keeps other files.
    (copy / "__init__.py").write_text('"""kept"""\n')
    gen.generate(copy)
    assert gen.diff(fresh, copy) == []
    assert (copy / "__init__.py").read_text() == '"""kept"""\n'


def test_grpc_modules_import_messages_from_the_package() -> None:
    for name, module in GRPC_MODULES.items():
        source = Path(module.__file__ or "").read_text()
        assert f"from nstance.rpc import {name}_pb2 as " in source
        assert f"\nimport {name}_pb2" not in source
        assert "nstance.v1" not in source.split("class ", 1)[0]


# --------------------------------------------------------------------------------------------
# Version floors in pyproject.toml
# --------------------------------------------------------------------------------------------


def _declared_floor(distribution: str) -> Version:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if requirement.name.lower() == distribution:
            floors = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==")]
            assert floors, f"{line!r} declares no lower bound"
            return max(floors)
    raise AssertionError(f"{distribution} is not a declared dependency")


_VALIDATE_CALL = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.(\w+),\s*(\d+),\s*(\d+),\s*(\d+),"
    r"\s*'([^']*)'"
)


def _protobuf_gencode_version(module: ModuleType) -> Version:
    source = Path(module.__file__ or "").read_text()
    match = _VALIDATE_CALL.search(source)
    assert match is not None, f"{module.__name__} has no runtime version check"
    domain, major, minor, patch, suffix = match.groups()
    assert domain == "PUBLIC"
    return Version(f"{major}.{minor}.{patch}{suffix}")


def test_grpcio_floor_covers_generated_code() -> None:
    floor = _declared_floor("grpcio")
    for module in GRPC_MODULES.values():
        generated = Version(module.GRPC_GENERATED_VERSION)
        assert floor >= generated, f"pyproject declares grpcio>={floor}; generated code needs >={generated}"


def test_protobuf_floor_covers_generated_code() -> None:
    floor = _declared_floor("protobuf")
    for module in PB2_MODULES.values():
        generated = _protobuf_gencode_version(module)
        assert floor >= generated, (
            f"pyproject declares protobuf>={floor}; {module.__name__} validates runtime >={generated}"
        )


# --------------------------------------------------------------------------------------------
# Wire compatibility with upstream (field numbers, types, streaming shapes)
# --------------------------------------------------------------------------------------------

TS = "google.protobuf.Timestamp"
EMPTY = "google.protobuf.Empty"

# message -> [(field, number, type)]; "optional" marks proto3 explicit presence.
MESSAGES: dict[str, dict[str, list[tuple[str, int, str]]]] = {
    "registration": {
        "RegisterClientRequest": [
            ("registration_nonce_jwt", 1, "string"),
            ("public_key_pem", 2, "bytes"),
            ("private_ipv4", 3, "string"),
            ("private_ipv6", 4, "string"),
            ("hostname", 5, "string"),
        ],
        "RegisterClientResponse": [
            ("client_certificate_pem", 1, "bytes"),
            ("expires_at", 2, TS),
        ],
    },
    "agent": {
        "KeyGenerationRequest": [("key_names", 1, "repeated string")],
        "PublicKeysRequest": [
            ("instance_id", 1, "string"),
            ("keys", 2, "repeated nstance.v1.PublicKeySubmission"),
        ],
        "PublicKeySubmission": [("filename", 1, "string"), ("public_key_pem", 2, "bytes")],
        "RenewAgentCertificateRequest": [("public_key_pem", 1, "bytes")],
        "RenewAgentCertificateResponse": [
            ("client_certificate_pem", 1, "bytes"),
            ("expires_at", 2, TS),
        ],
        "HealthReportRequest": [
            ("version", 1, "string"),
            ("instance_id", 2, "string"),
            ("timestamp", 3, TS),
            ("count", 4, "int64"),
            ("uptime", 5, "string"),
            ("metrics", 6, "nstance.v1.Metrics"),
            ("files", 7, "map<string, nstance.v1.FileStatus>"),
            ("termination_notice", 8, "nstance.v1.TerminationNotice"),
            ("config_hash", 9, "string"),
        ],
        "Metrics": [
            ("cpu_usage", 1, "optional double"),
            ("cpu_core_usage", 2, "repeated double"),
            ("memory_usage", 3, "optional double"),
            ("network_interface", 4, "optional nstance.v1.InterfaceMetrics"),
            ("network_interface_error", 5, "optional string"),
            ("ebpf_counters", 6, "map<uint32, uint64>"),
            ("ebpf_error", 7, "optional string"),
            ("conntrack_count", 8, "optional uint64"),
            ("conntrack_max", 9, "optional uint64"),
            ("conntrack_error", 10, "optional string"),
        ],
        "InterfaceMetrics": [
            ("interface_name", 1, "string"),
            ("rx_bytes", 2, "uint64"),
            ("tx_bytes", 3, "uint64"),
            ("rx_packets", 4, "uint64"),
            ("tx_packets", 5, "uint64"),
            ("rx_drops", 6, "uint64"),
            ("tx_drops", 7, "uint64"),
        ],
        "FileStatus": [("last_modified", 1, f"oneof status {TS}"), ("error", 2, "oneof status string")],
        "TerminationNotice": [("action", 1, "string"), ("deadline", 2, TS)],
        "FileTransfer": [
            ("filename", 1, "string"),
            ("content", 2, "bytes"),
            ("last_modified", 3, TS),
            ("config_hash", 4, "string"),
        ],
    },
    "operator": {
        "RenewCertificateRequest": [("public_key_pem", 1, "bytes")],
        "RenewCertificateResponse": [("client_certificate_pem", 1, "bytes"), ("expires_at", 2, TS)],
        "ConfigStatusResponse": [("etag", 1, "string"), ("last_modified", 2, TS), ("size", 3, "int64")],
        "RefreshConfigResponse": [("updated", 1, "bool"), ("prev_etag", 2, "string"), ("etag", 3, "string")],
        "UpsertGroupRequest": [("key", 1, "string"), ("config", 2, "nstance.v1.GroupConfig")],
        "GroupConfig": [
            ("template", 1, "string"),
            ("size", 2, "int32"),
            ("instance_type", 3, "string"),
            ("subnet_pool", 4, "string"),
            ("vars", 5, "map<string, string>"),
            ("args", 6, "map<string, string>"),
        ],
        "DeleteGroupRequest": [("key", 1, "string")],
        "ListGroupsResponse": [("groups", 1, "repeated nstance.v1.GroupStatus")],
        "GroupStatus": [
            ("key", 1, "string"),
            ("tenant", 2, "string"),
            ("template", 3, "string"),
            ("size", 4, "int32"),
            ("instance_type", 5, "string"),
            ("subnet_pool", 6, "string"),
            ("vars", 7, "map<string, string>"),
            ("is_static", 8, "bool"),
            ("etag", 9, "string"),
            ("actual_size", 10, "int32"),
            ("provider_ids", 11, "repeated string"),
        ],
        "CreateInstanceRequest": [("instance_id", 1, "string"), ("config", 2, "nstance.v1.InstanceConfig")],
        "InstanceConfig": [
            ("group", 1, "string"),
            ("template", 2, "string"),
            ("instance_type", 3, "string"),
            ("subnet_pool", 4, "string"),
            ("vars", 5, "map<string, string>"),
        ],
        "CreateInstanceResponse": [("instance_id", 1, "string"), ("status", 2, "string")],
        "DeleteInstanceRequest": [("instance_id", 1, "string")],
        "DeleteInstanceResponse": [("status", 1, "string")],
        "GetInstanceStatusRequest": [("instance_id", 1, "string")],
        "InstanceStatusResponse": [
            ("instance_id", 1, "string"),
            ("tenant", 2, "string"),
            ("status", 3, "string"),
            ("created_at", 4, TS),
            ("last_seen", 5, TS),
            ("provider_instance_id", 6, "string"),
        ],
        "GroupEvent": [("type", 1, "nstance.v1.GroupEvent.Type"), ("group", 2, "nstance.v1.GroupStatus")],
        "InstanceEvent": [
            ("instance_id", 1, "string"),
            ("tenant", 2, "string"),
            ("provider_instance_id", 3, "string"),
            ("group", 4, "string"),
            ("status", 5, "string"),
            ("reason", 6, "string"),
            ("unhealthy_at", 7, TS),
            ("delete_at", 8, TS),
        ],
        "DrainAckRequest": [("instance_id", 1, "string")],
        # Our addition (not in the Go API): ListInstances, in pages.
        "ListInstancesRequest": [
            ("group", 1, "string"),
            ("page_size", 2, "int32"),
            ("page_token", 3, "string"),
        ],
        "ListInstancesResponse": [
            ("instances", 1, "repeated nstance.v1.InstanceSummary"),
            ("next_page_token", 2, "string"),
        ],
        "InstanceSummary": [
            ("instance_id", 1, "string"),
            ("group", 2, "string"),
            ("on_demand", 3, "bool"),
            ("status", 4, "string"),
            ("provider_instance_id", 5, "string"),
            ("created_at", 6, TS),
            ("last_seen", 7, TS),
            ("draining", 8, "bool"),
        ],
        "ErrorEvent": [
            ("group", 1, "string"),
            ("instance_id", 2, "string"),
            ("error", 3, "string"),
            ("timestamp", 4, TS),
        ],
    },
}

# service -> [(rpc, input, output, client_streaming, server_streaming)]
SERVICES: dict[str, dict[str, list[tuple[str, str, str, bool, bool]]]] = {
    "registration": {
        "RegistrationService": [
            ("RegisterAgent", "RegisterClientRequest", "RegisterClientResponse", False, False),
            ("RegisterOperator", "RegisterClientRequest", "RegisterClientResponse", False, False),
        ]
    },
    "agent": {
        "AgentService": [
            ("ReceiveKeyRequests", EMPTY, "KeyGenerationRequest", False, True),
            ("SubmitPublicKeys", "PublicKeysRequest", EMPTY, False, False),
            ("SubmitHealthReport", "HealthReportRequest", EMPTY, True, False),
            ("ReceiveFiles", EMPTY, "FileTransfer", False, True),
            # Our addition (not in the Go API): agents renew their certificate over mTLS.
            (
                "RenewAgentCertificate",
                "RenewAgentCertificateRequest",
                "RenewAgentCertificateResponse",
                False,
                False,
            ),
        ]
    },
    "operator": {
        "OperatorService": [
            ("RenewCertificate", "RenewCertificateRequest", "RenewCertificateResponse", False, False),
            ("GetConfigStatus", EMPTY, "ConfigStatusResponse", False, False),
            ("RefreshConfig", EMPTY, "RefreshConfigResponse", False, False),
            ("ListGroups", EMPTY, "ListGroupsResponse", False, False),
            ("UpsertGroup", "UpsertGroupRequest", "GroupStatus", False, False),
            ("DeleteGroup", "DeleteGroupRequest", EMPTY, False, False),
            ("CreateInstance", "CreateInstanceRequest", "CreateInstanceResponse", False, False),
            ("DeleteInstance", "DeleteInstanceRequest", "DeleteInstanceResponse", False, False),
            ("GetInstanceStatus", "GetInstanceStatusRequest", "InstanceStatusResponse", False, False),
            ("AcknowledgeDrained", "DrainAckRequest", EMPTY, False, False),
            # Our addition (not in the Go API): instances by ID, on-demand ones included.
            ("ListInstances", "ListInstancesRequest", "ListInstancesResponse", False, False),
            ("WatchGroups", EMPTY, "GroupEvent", False, True),
            ("WatchInstances", EMPTY, "InstanceEvent", False, True),
            ("WatchErrors", EMPTY, "ErrorEvent", False, True),
        ]
    },
}

_SCALARS = {
    pb_descriptor.FieldDescriptor.TYPE_DOUBLE: "double",
    pb_descriptor.FieldDescriptor.TYPE_INT64: "int64",
    pb_descriptor.FieldDescriptor.TYPE_UINT64: "uint64",
    pb_descriptor.FieldDescriptor.TYPE_INT32: "int32",
    pb_descriptor.FieldDescriptor.TYPE_UINT32: "uint32",
    pb_descriptor.FieldDescriptor.TYPE_BOOL: "bool",
    pb_descriptor.FieldDescriptor.TYPE_STRING: "string",
    pb_descriptor.FieldDescriptor.TYPE_BYTES: "bytes",
}


def _base_type(field: pb_descriptor.FieldDescriptor) -> str:
    if field.type == pb_descriptor.FieldDescriptor.TYPE_MESSAGE:
        return str(field.message_type.full_name)
    if field.type == pb_descriptor.FieldDescriptor.TYPE_ENUM:
        return str(field.enum_type.full_name)
    return _SCALARS[field.type]


def _type_of(field: pb_descriptor.FieldDescriptor) -> str:
    """Render a field's wire-relevant declaration the way the tables above spell it."""
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"map<{_base_type(key)}, {_base_type(value)}>"
    if field.is_repeated:
        return f"repeated {_base_type(field)}"
    oneof = field.containing_oneof
    if oneof is not None:
        if oneof.name == f"_{field.name}":  # synthetic oneof of a proto3 `optional` field
            return f"optional {_base_type(field)}"
        return f"oneof {oneof.name} {_base_type(field)}"
    return _base_type(field)


def _top_level_messages(module: ModuleType) -> set[str]:
    return set(module.DESCRIPTOR.message_types_by_name)


@pytest.mark.parametrize("name", sorted(PB2_MODULES))
def test_file_options(name: str) -> None:
    file = PB2_MODULES[name].DESCRIPTOR
    assert file.package == "nstance.v1"
    assert file.GetOptions().go_package == "github.com/nstance-dev/nstance/v2/internal/proto"
    assert set(file.enum_types_by_name) == set()  # the only enum, GroupEvent.Type, is nested


@pytest.mark.parametrize("name", sorted(PB2_MODULES))
def test_exact_message_set(name: str) -> None:
    assert _top_level_messages(PB2_MODULES[name]) == set(MESSAGES[name])


@pytest.mark.parametrize(
    ("module_name", "message", "fields"),
    [(module, message, fields) for module, table in MESSAGES.items() for message, fields in table.items()],
)
def test_message_fields(module_name: str, message: str, fields: list[tuple[str, int, str]]) -> None:
    descriptor = PB2_MODULES[module_name].DESCRIPTOR.message_types_by_name[message]
    assert descriptor.full_name == f"nstance.v1.{message}"
    actual = sorted((f.name, f.number, _type_of(f)) for f in descriptor.fields)
    assert actual == sorted(fields)


def test_group_event_type_enum() -> None:
    enum = operator_pb2.GroupEvent.DESCRIPTOR.enum_types_by_name["Type"]
    assert enum.full_name == "nstance.v1.GroupEvent.Type"
    assert {v.name: v.number for v in enum.values} == {
        "TYPE_UNSPECIFIED": 0,
        "TYPE_UPSERT": 1,
        "TYPE_DELETE": 2,
    }
    assert operator_pb2.GroupEvent.TYPE_DELETE == 2


def test_file_status_oneof() -> None:
    oneof = agent_pb2.FileStatus.DESCRIPTOR.oneofs_by_name["status"]
    assert [f.name for f in oneof.fields] == ["last_modified", "error"]
    status = agent_pb2.FileStatus(error="permission denied")
    assert status.WhichOneof("status") == "error"
    assert agent_pb2.FileStatus().WhichOneof("status") is None


@pytest.mark.parametrize(
    ("module_name", "service", "methods"),
    [(module, service, methods) for module, table in SERVICES.items() for service, methods in table.items()],
)
def test_service_shapes(
    module_name: str, service: str, methods: list[tuple[str, str, str, bool, bool]]
) -> None:
    file = PB2_MODULES[module_name].DESCRIPTOR
    assert set(file.services_by_name) == {service}
    descriptor = file.services_by_name[service]
    assert descriptor.full_name == f"nstance.v1.{service}"

    def qualified(type_name: str) -> str:
        return type_name if "." in type_name else f"nstance.v1.{type_name}"

    actual = sorted(
        (m.name, m.input_type.full_name, m.output_type.full_name, m.client_streaming, m.server_streaming)
        for m in descriptor.methods
    )
    expected = sorted((n, qualified(i), qualified(o), cs, ss) for n, i, o, cs, ss in methods)
    assert actual == expected


class _RecordingChannel:
    """Stands in for a grpc.Channel and records which method paths a stub binds, and how."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    def __getattr__(self, kind: str) -> Any:
        if kind not in {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}:
            raise AttributeError(kind)

        def bind(path: str, *args: Any, **kwargs: Any) -> object:
            self.bound[path] = kind
            return object()

        return bind


@pytest.mark.parametrize(
    ("module_name", "service"),
    [(module, service) for module, table in SERVICES.items() for service in table],
)
def test_stub_method_paths(module_name: str, service: str) -> None:
    channel = _RecordingChannel()
    getattr(GRPC_MODULES[module_name], f"{service}Stub")(channel)
    kinds = {
        (False, False): "unary_unary",
        (False, True): "unary_stream",
        (True, False): "stream_unary",
        (True, True): "stream_stream",
    }
    expected = {
        f"/nstance.v1.{service}/{name}": kinds[(cs, ss)]
        for name, _, _, cs, ss in SERVICES[module_name][service]
    }
    assert channel.bound == expected


# --------------------------------------------------------------------------------------------
# Round trip through a real grpc.aio server
# --------------------------------------------------------------------------------------------


class _Operator(operator_pb2_grpc.OperatorServiceServicer):
    async def GetConfigStatus(  # noqa: N802 - name fixed by the proto
        self, request: empty_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ConfigStatusResponse:
        return operator_pb2.ConfigStatusResponse(
            etag='"abc123"',
            last_modified=timestamp_pb2.Timestamp(seconds=1_700_000_000, nanos=5),
            size=4096,
        )

    async def WatchGroups(  # noqa: N802 - name fixed by the proto
        self, request: empty_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[operator_pb2.GroupEvent]:
        yield operator_pb2.GroupEvent(
            type=operator_pb2.GroupEvent.TYPE_UPSERT,
            group=operator_pb2.GroupStatus(key="web", tenant="acme", size=3, vars={"a": "b"}),
        )
        yield operator_pb2.GroupEvent(
            type=operator_pb2.GroupEvent.TYPE_DELETE,
            group=operator_pb2.GroupStatus(key="old", tenant="acme"),
        )


class _Agent(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self) -> None:
        self.reports: list[agent_pb2.HealthReportRequest] = []

    async def SubmitHealthReport(  # noqa: N802 - name fixed by the proto
        self,
        request_iterator: AsyncIterator[agent_pb2.HealthReportRequest],
        context: grpc.aio.ServicerContext,
    ) -> empty_pb2.Empty:
        async for report in request_iterator:
            self.reports.append(report)
        return empty_pb2.Empty()


@pytest.fixture
async def served() -> AsyncIterator[tuple[grpc.aio.Channel, _Agent]]:
    server = grpc.aio.server()
    agent = _Agent()
    operator_pb2_grpc.add_OperatorServiceServicer_to_server(_Operator(), server)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, agent
    finally:
        await channel.close()
        await server.stop(None)


async def test_unary_round_trip(served: tuple[grpc.aio.Channel, _Agent]) -> None:
    channel, _ = served
    stub = operator_pb2_grpc.OperatorServiceStub(channel)
    response = await stub.GetConfigStatus(empty_pb2.Empty(), timeout=10)
    assert response.etag == '"abc123"'
    assert response.last_modified.seconds == 1_700_000_000
    assert response.last_modified.nanos == 5
    assert response.size == 4096


async def test_unimplemented_rpc_reports_unimplemented(served: tuple[grpc.aio.Channel, _Agent]) -> None:
    channel, _ = served
    stub = operator_pb2_grpc.OperatorServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.ListGroups(empty_pb2.Empty(), timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _reports() -> Iterator[agent_pb2.HealthReportRequest]:
    for count in (1, 2):
        yield agent_pb2.HealthReportRequest(
            version="0.1.0",
            instance_id="knc06bgm7733st2576nx5jht4ecjw",
            count=count,
            uptime=f"{count}m0s",
            metrics=agent_pb2.Metrics(cpu_usage=12.5, ebpf_counters={443: 7}, conntrack_count=0),
            files={
                "ca.crt": agent_pb2.FileStatus(last_modified=timestamp_pb2.Timestamp(seconds=count)),
                "missing.key": agent_pb2.FileStatus(),
            },
            config_hash="h1",
        )


async def test_client_stream_round_trip(served: tuple[grpc.aio.Channel, _Agent]) -> None:
    channel, agent = served
    stub = agent_pb2_grpc.AgentServiceStub(channel)

    async def reports() -> AsyncIterator[agent_pb2.HealthReportRequest]:
        for report in _reports():
            yield report

    response = await stub.SubmitHealthReport(reports(), timeout=10)
    assert isinstance(response, empty_pb2.Empty)
    assert list(agent.reports) == list(_reports())
    last = agent.reports[-1]
    assert last.count == 2
    assert last.metrics.HasField("cpu_usage")
    assert not last.metrics.HasField("memory_usage")
    assert last.metrics.HasField("conntrack_count")  # explicit zero survives the wire
    assert dict(last.metrics.ebpf_counters) == {443: 7}
    assert last.files["ca.crt"].WhichOneof("status") == "last_modified"
    assert last.files["missing.key"].WhichOneof("status") is None


async def test_server_stream_round_trip(served: tuple[grpc.aio.Channel, _Agent]) -> None:
    channel, _ = served
    stub = operator_pb2_grpc.OperatorServiceStub(channel)
    events = [event async for event in stub.WatchGroups(empty_pb2.Empty(), timeout=10)]
    assert [(e.type, e.group.key) for e in events] == [
        (operator_pb2.GroupEvent.TYPE_UPSERT, "web"),
        (operator_pb2.GroupEvent.TYPE_DELETE, "old"),
    ]
    assert dict(events[0].group.vars) == {"a": "b"}
    assert events[0].group.size == 3
