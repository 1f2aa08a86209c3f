"""Small in-process gRPC servers for the two Google services with no local counterpart.

- google.iam.v1.IAMPolicy for Pub/Sub topics (the Pub/Sub emulator answers 501 to IAM calls);
- google.logging.v2.ConfigServiceV2 sinks (Cloud Logging has no emulator).
Both are built from the libraries' own message types with grpc.method_handlers_generic_handler, so the
real clients talk their real wire format to them. State is kept per resource name; a sink created with
unique_writer_identity gets a service-account writer identity as Cloud Logging gives one."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from concurrent import futures
from typing import Any

import grpc
from google.cloud.logging_v2.types import logging_config
from google.iam.v1 import iam_policy_pb2, policy_pb2
from google.protobuf import empty_pb2


def _unary(fn: Any, request_type: Any, response_type: Any, proto_plus: bool) -> grpc.RpcMethodHandler:
    if proto_plus:  # proto-plus classes (logging types) serialise through classmethods
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=request_type.deserialize, response_serializer=response_type.serialize
        )
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=request_type.FromString, response_serializer=response_type.SerializeToString
    )


class IamPolicyServer:
    """Topic IAM: get (empty policy for a new resource), set (etag-checked), test."""

    def __init__(self) -> None:
        self.policies: dict[str, policy_pb2.Policy] = {}
        self.calls: Counter = Counter()
        self._lock = threading.Lock()

    def _etag(self, policy: policy_pb2.Policy) -> bytes:
        copy = policy_pb2.Policy()
        copy.CopyFrom(policy)
        copy.etag = b""
        return hashlib.sha256(copy.SerializeToString(deterministic=True)).digest()[:8]

    def get(
        self, request: iam_policy_pb2.GetIamPolicyRequest, context: grpc.ServicerContext
    ) -> policy_pb2.Policy:
        with self._lock:
            self.calls["GetIamPolicy"] += 1
            policy = self.policies.get(request.resource) or policy_pb2.Policy(version=1)
            out = policy_pb2.Policy()
            out.CopyFrom(policy)
            out.etag = self._etag(policy)
            return out

    def set(
        self, request: iam_policy_pb2.SetIamPolicyRequest, context: grpc.ServicerContext
    ) -> policy_pb2.Policy:
        with self._lock:
            self.calls["SetIamPolicy"] += 1
            current = self.policies.get(request.resource) or policy_pb2.Policy(version=1)
            if request.policy.etag and request.policy.etag != self._etag(current):
                context.abort(grpc.StatusCode.ABORTED, "etag mismatch: re-read the policy")
            stored = policy_pb2.Policy()
            stored.CopyFrom(request.policy)
            stored.etag = b""
            self.policies[request.resource] = stored
            out = policy_pb2.Policy()
            out.CopyFrom(stored)
            out.etag = self._etag(stored)
            return out

    def test(
        self, request: iam_policy_pb2.TestIamPermissionsRequest, context: grpc.ServicerContext
    ) -> iam_policy_pb2.TestIamPermissionsResponse:
        return iam_policy_pb2.TestIamPermissionsResponse(permissions=list(request.permissions))

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "google.iam.v1.IAMPolicy",
            {
                "GetIamPolicy": _unary(
                    self.get, iam_policy_pb2.GetIamPolicyRequest, policy_pb2.Policy, False
                ),
                "SetIamPolicy": _unary(
                    self.set, iam_policy_pb2.SetIamPolicyRequest, policy_pb2.Policy, False
                ),
                "TestIamPermissions": _unary(
                    self.test,
                    iam_policy_pb2.TestIamPermissionsRequest,
                    iam_policy_pb2.TestIamPermissionsResponse,
                    False,
                ),
            },
        )

    def members(self, resource: str, role: str) -> list[str]:
        policy = self.policies.get(resource)
        if policy is None:
            return []
        return [m for b in policy.bindings if b.role == role for m in b.members]


class LoggingConfigServer:
    """ConfigServiceV2 sinks: create (ALREADY_EXISTS on a duplicate), get, delete, list."""

    def __init__(self, project_number: str = "123456789012") -> None:
        self.sinks: dict[str, logging_config.LogSink] = {}  # full name projects/P/sinks/ID -> sink
        self.calls: Counter = Counter()
        self.project_number = project_number
        self._lock = threading.Lock()

    def create(
        self, request: logging_config.CreateSinkRequest, context: grpc.ServicerContext
    ) -> logging_config.LogSink:
        with self._lock:
            self.calls["CreateSink"] += 1
            name = f"{request.parent}/sinks/{request.sink.name}"
            if name in self.sinks:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"Sink {request.sink.name} already exists")
            if not request.sink.destination or not request.sink.filter:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "sink needs a destination and a filter")
            sink = logging_config.LogSink(request.sink)
            if request.unique_writer_identity:
                digest = hashlib.sha256(name.encode()).hexdigest()[:12]
                sink.writer_identity = (
                    f"serviceAccount:service-{self.project_number}-{digest}"
                    "@gcp-sa-logging.iam.gserviceaccount.com"
                )
            else:
                sink.writer_identity = "serviceAccount:cloud-logs@system.gserviceaccount.com"
            self.sinks[name] = sink
            return sink

    def get(
        self, request: logging_config.GetSinkRequest, context: grpc.ServicerContext
    ) -> logging_config.LogSink:
        with self._lock:
            self.calls["GetSink"] += 1
            sink = self.sinks.get(request.sink_name)
            if sink is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Sink {request.sink_name} does not exist")
            assert sink is not None  # abort raises
            return sink

    def delete(self, request: logging_config.DeleteSinkRequest, context: grpc.ServicerContext) -> Any:
        with self._lock:
            self.calls["DeleteSink"] += 1
            if self.sinks.pop(request.sink_name, None) is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Sink {request.sink_name} does not exist")
            return empty_pb2.Empty()

    def handler(self) -> grpc.GenericRpcHandler:
        empty = type("EmptySer", (), {"serialize": staticmethod(lambda m: m.SerializeToString())})
        return grpc.method_handlers_generic_handler(
            "google.logging.v2.ConfigServiceV2",
            {
                "CreateSink": _unary(
                    self.create, logging_config.CreateSinkRequest, logging_config.LogSink, True
                ),
                "GetSink": _unary(self.get, logging_config.GetSinkRequest, logging_config.LogSink, True),
                "DeleteSink": _unary(self.delete, logging_config.DeleteSinkRequest, empty, True),
            },
        )


class GrpcServer:
    """Serves handlers on 127.0.0.1:<free port> until closed."""

    def __init__(self, *handlers: grpc.GenericRpcHandler) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        for h in handlers:
            self._server.add_generic_rpc_handlers((h,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def __enter__(self) -> GrpcServer:
        self._server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop(grace=None)
