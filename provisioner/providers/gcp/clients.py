"""Builds the real Google clients (google-cloud-compute, -pubsub, -logging, -storage, Resource Manager REST).

Every client takes the same `Endpoints`: in production they are all None and the libraries use Google's
endpoints with the service-account credentials; tests and the benchmark point each one at a local server
(the Pub/Sub emulator, a Compute REST fake, small gRPC servers) with AnonymousCredentials, injected as
GcpProvider(endpoints=..., anonymous=True). Nothing else in the provider builds a client, so no code path
can slip past an override. Imports stay inside the functions: the Google libraries take a second to import
and `provision --help` must not pay it."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from google.auth.credentials import Credentials

    from provisioner.providers.gcp.credentials import ServiceAccountKey

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com"


@dataclass(frozen=True)
class Endpoints:
    """Overrides; None = Google's production endpoint.

    compute / resource_manager are REST base URLs (http:// honoured); pubsub, pubsub_iam and logging are
    gRPC host:port. `insecure` makes gRPC channels plaintext (local servers only)."""

    compute: str | None = None
    resource_manager: str | None = None
    pubsub: str | None = None
    pubsub_iam: str | None = None  # topic IAM; the Pub/Sub emulator lacks it (501), tests serve it apart
    logging: str | None = None
    storage: str | None = None  # Cloud Storage JSON API base URL (a local emulator in tests)
    insecure: bool = False


@dataclass
class GcpContext:
    """One project's credentials + endpoints, and the clients built from them (lazily, once)."""

    project: str
    credentials: Credentials
    endpoints: Endpoints = field(default_factory=Endpoints)

    @classmethod
    def from_key(cls, key: ServiceAccountKey, endpoints: Endpoints | None = None) -> GcpContext:
        from google.oauth2 import service_account

        creds = service_account.Credentials.from_service_account_info(key.info(), scopes=list(SCOPES))
        return cls(project=key.project_id, credentials=creds, endpoints=endpoints or Endpoints())

    @classmethod
    def anonymous(cls, project: str, endpoints: Endpoints) -> GcpContext:
        from google.auth.credentials import AnonymousCredentials

        return cls(project=project, credentials=AnonymousCredentials(), endpoints=endpoints)

    # --- Compute Engine (REST) -------------------------------------------------------------------
    def _compute_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"credentials": self.credentials, "transport": "rest"}
        if self.endpoints.compute:
            kwargs["client_options"] = {"api_endpoint": self.endpoints.compute}
        return kwargs

    def _compute(self, client_class: str) -> Any:
        from google.cloud import compute_v1

        return getattr(compute_v1, client_class)(**self._compute_kwargs())

    @cached_property
    def regions(self) -> Any:
        return self._compute("RegionsClient")

    @cached_property
    def instances(self) -> Any:
        return self._compute("InstancesClient")

    @cached_property
    def zone_operations(self) -> Any:
        return self._compute("ZoneOperationsClient")

    @cached_property
    def global_operations(self) -> Any:
        return self._compute("GlobalOperationsClient")

    @cached_property
    def firewalls(self) -> Any:
        return self._compute("FirewallsClient")

    @cached_property
    def images(self) -> Any:
        return self._compute("ImagesClient")

    # --- Cloud Storage (JSON API) ------------------------------------------------------------------
    @cached_property
    def storage(self) -> Any:
        # by its full path, as for pub/sub: mypy reads `from google.cloud import storage` as a missing
        # attribute of a typed namespace package
        from google.cloud.storage import Client

        options = {"api_endpoint": self.endpoints.storage} if self.endpoints.storage else None
        return Client(project=self.project, credentials=self.credentials, client_options=options)

    # --- Pub/Sub and Cloud Logging (gRPC) ----------------------------------------------------------
    def _channel(self, target: str) -> Any:
        import grpc

        if self.endpoints.insecure:
            return grpc.insecure_channel(target)
        from google.auth.transport import grpc as google_auth_grpc
        from google.auth.transport import requests as google_auth_requests

        return google_auth_grpc.secure_authorized_channel(
            self.credentials, google_auth_requests.Request(), target
        )

    def _publisher(self, endpoint: str | None) -> Any:
        # imported by its full path: google-cloud-pubsub ships no type information, and mypy reads
        # `from google.cloud import pubsub_v1` as a missing attribute of a typed namespace package
        from google.cloud.pubsub_v1 import PublisherClient
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

        if endpoint is None:
            return PublisherClient(credentials=self.credentials)
        return PublisherClient(transport=PublisherGrpcTransport(channel=self._channel(endpoint)))

    @cached_property
    def publisher(self) -> Any:
        return self._publisher(self.endpoints.pubsub)

    @cached_property
    def topic_iam(self) -> Any:
        """A publisher client for topic get/setIamPolicy (same service in production)."""
        return self._publisher(self.endpoints.pubsub_iam or self.endpoints.pubsub)

    @cached_property
    def subscriber(self) -> Any:
        from google.cloud.pubsub_v1 import SubscriberClient  # full path: see _publisher
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        if self.endpoints.pubsub is None:
            return SubscriberClient(credentials=self.credentials)
        return SubscriberClient(
            transport=SubscriberGrpcTransport(channel=self._channel(self.endpoints.pubsub))
        )

    @cached_property
    def logging_config(self) -> Any:
        from google.cloud.logging_v2.services.config_service_v2 import ConfigServiceV2Client
        from google.cloud.logging_v2.services.config_service_v2.transports import ConfigServiceV2GrpcTransport

        if self.endpoints.logging is None:
            return ConfigServiceV2Client(credentials=self.credentials)
        return ConfigServiceV2Client(
            transport=ConfigServiceV2GrpcTransport(channel=self._channel(self.endpoints.logging))
        )

    # --- Resource Manager (REST, testIamPermissions only) -------------------------------------------
    @cached_property
    def http(self) -> Any:
        from google.auth.transport.requests import AuthorizedSession

        return AuthorizedSession(self.credentials)

    @property
    def resource_manager_url(self) -> str:
        return (self.endpoints.resource_manager or RESOURCE_MANAGER).rstrip("/")
