"""The control plane's settings, read once and passed down.

`provision serve` and every `provision` command load one frozen `Settings` at start (from `RIGBASE_*`
environment variables and the command's own flags) and hand it to what needs it, so no module reads the
environment on its own and a test builds the object it wants instead of patching variables. The variables
are listed in docs/control-plane.md."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from contracts.errors import InvalidInput, plain_validation_message
from contracts.ports import CONTROL_PLANE_PORT
from provisioner.client_settings import ENV_PREFIX, ClientSettings, default_home

DEFAULT_PORT = CONTROL_PLANE_PORT
# One heartbeat every 30 s: three missed beats (90 s, ONLINE_WINDOW) before a node shows offline.
DEFAULT_HEARTBEAT_S = 30.0
# Continuous attestation: a fresh quote every K-th heartbeat (about every 5 minutes at 30 s).
DEFAULT_QUOTE_EVERY = 10
# A node that lets this many heartbeats pass without answering a quote request goes errored.
DEFAULT_QUOTE_GRACE_BEATS = 3
# A node's minion reports its finalize run as it goes (docs/join-protocol.md, "Finalize"); one that stays in
# provisioning this long without any report (a minion too old to finalize, a hung play) is errored.
DEFAULT_FINALIZE_TIMEOUT_S = 30 * 60.0
# a node offline (past the online window) or errored this long fails its jobs' workers (docs/jobs.md)
DEFAULT_JOB_NODE_GRACE_S = 5 * 60.0


# playbooks/ beside the packages (source checkout and editable install)
SHIPPED_PLAYBOOKS = Path(__file__).resolve().parents[1] / "playbooks"


class Settings(BaseSettings):
    """Everything a control-plane process may be told from outside. Frozen: read once, never changed."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    home: Path = Field(default_factory=default_home, description="state directory (keys, tokens, store)")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default SQLite under `home`")
    url: str | None = Field(None, description="the control plane a CLI talks to (else client.json)")
    token: SecretStr | None = Field(None, description="the operator token a CLI sends (else client.json)")
    public_url: str | None = Field(None, description="the URL nodes reach the control plane at")
    ca_cert: Path | None = Field(
        None, description="the CA a CLI trusts for the control plane's certificate (else client.json's)"
    )
    # TLS of `provision serve` (provisioner/adapters/tls.py; docs/control-plane.md, "TLS").
    advertise: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="names and addresses the server certificate is for (comma-separated)"
    )
    tls_cert: Path | None = Field(None, description="the operator's own server certificate (PEM chain)")
    tls_key: Path | None = Field(None, description="the key of `tls_cert`")
    tls_ca: Path | None = Field(None, description="the private CA `tls_cert` chains to (pinned by nodes)")
    insecure_http: bool = Field(False, description="serve plain HTTP (loopback unless --host says otherwise)")
    playbooks: Path = Field(default=SHIPPED_PLAYBOOKS, description="the finalize playbooks")
    ansible_collections: Path = Field(
        default_factory=lambda: Path(sys.prefix) / "ansible-collections",
        description="where community.general lives (scripts/install-deps.sh puts it in the venv)",
    )
    heartbeat_s: float = Field(DEFAULT_HEARTBEAT_S, gt=0, description="the interval minions heartbeat at")
    quote_every: int = Field(DEFAULT_QUOTE_EVERY, ge=1, description="a fresh quote every K-th heartbeat")
    quote_grace_beats: int = Field(
        DEFAULT_QUOTE_GRACE_BEATS, ge=1, description="heartbeats a node may let pass unanswered after a quote"
    )
    reconcilers: bool = Field(True, description="run the reconcilers in this process")
    beats_at_once: int = Field(
        3, ge=1, description="heartbeats one serving process runs at once; the rest wait on its event loop"
    )
    finalize_timeout_s: float = Field(
        DEFAULT_FINALIZE_TIMEOUT_S,
        gt=0,
        description="seconds a node in provisioning may go without a finalize report before it is errored",
    )
    job_node_grace_s: float = Field(
        DEFAULT_JOB_NODE_GRACE_S,
        ge=0,
        description="seconds a node may stay offline or errored before its jobs' workers fail (or re-queue)",
    )
    # Rate limits per source address, in this process's memory (provisioner/api/limits.py). Only failed
    # authentications spend from the first budget, so well-behaved clients never meet it; joins spend
    # from the second, sized for a burst of a thousand minions behind one address.
    auth_failures_burst: int = Field(
        50, ge=1, description="failed authentications a source address may make before it gets 429"
    )
    auth_failures_per_minute: float = Field(
        30.0, ge=0, description="how fast that budget refills (failed authentications per minute)"
    )
    join_attempts_burst: int = Field(
        2000, ge=1, description="POST /v1/join requests a source address may make in a burst"
    )
    join_attempts_per_minute: float = Field(
        1200.0, ge=0, description="how fast that budget refills (join attempts per minute)"
    )
    regions_dir: Path | None = Field(
        None, description="catalogue data (regions/*.yaml) instead of the shipped"
    )
    # datasets, models and checkpoints (provisioner/adapters/object_store.py; docs/data.md)
    object_store: str | None = Field(
        None, description="where object bytes live: s3://BUCKET[/PREFIX] or a directory; else HOME/objects"
    )
    object_store_endpoint: str | None = Field(
        None, description="the endpoint URL of an S3-compatible object store that is not AWS"
    )
    # a notebook's or endpoint's URL (docs/job-urls.md): connections open at once through the tunnels
    tunnel_streams_per_job: int = Field(512, ge=1, description="connections open at once to one job's URL")
    tunnel_streams_per_source: int = Field(
        256, ge=1, description="connections one source address holds open at once to jobs' URLs"
    )
    tunnel_relay_dir: Path | None = Field(
        None,
        description="set by `provision serve --workers N` for its workers: where each one's Unix socket "
        "lets the others reach the node tunnels it holds (api/tunnel_relay.py)",
    )
    # several control-plane hosts (docs/control-plane.md, "Several hosts"): their processes reach each
    # other's node tunnels over TLS at this address (api/tunnel_relay.py, api/relay_peers.py)
    peer_address: str | None = Field(
        None,
        description="the address this host's peers (the deployment's other control-plane hosts) reach "
        "it at: a job's URL then answers through whichever host holds its node's tunnel",
    )
    peer_port: int = Field(
        0, ge=0, le=65535, description="the tunnel relay port between hosts (0: each process a free one)"
    )
    object_store_presign: bool = Field(
        True,
        description="nodes read chunks straight from a bucket store through short-lived pre-signed URLs "
        "(false: through the control plane)",
    )
    # a source's or an output's host on these networks may be read although it is not a public address (the
    # operator's own MinIO, a LAN web server); any other private, loopback or link-local host is refused,
    # so no tenant can make the control plane fetch its cloud metadata or an internal service
    source_networks: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="CIDRs that sources and outputs may reach besides public addresses (comma-separated)"
    )
    storage_quota_gb: float = Field(
        1000.0, gt=0, description="the bytes of datasets, models and checkpoints one project may hold (GB)"
    )
    # X-Forwarded-For and X-Forwarded-Proto are believed only from these peers (HAProxy in front of
    # the control plane): from any other client they could be set to dodge, or aim, the rate limits
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="addresses (or CIDRs) of reverse proxies whose X-Forwarded-* headers are trusted"
    )

    @field_validator("advertise", "trusted_proxies", "source_networks", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """RIGBASE_ADVERTISE=cp.example,192.0.2.10 (the flag is repeated instead)."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @classmethod
    def load(cls, **overrides: object) -> Settings:
        """The environment, with the command's own flags (`overrides`, None meaning "not given") on top.
        A bad value is one InvalidInput naming the variable, not a traceback."""
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ENV_PREFIX + "_".join(str(p) for p in first["loc"]).upper()
            said = plain_validation_message(first["msg"])  # without pydantic's "Value error, "
            raise InvalidInput(f"{name}: {said} (see docs/control-plane.md)") from None

    def as_environment(self) -> dict[str, str]:
        """These settings as RIGBASE_* variables, which Settings.load() in another process (a worker of
        `provision serve --workers`) reads back as the same settings; unset optional ones are left out."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, tuple):
                value = ",".join(value)
            elif isinstance(value, bool):
                value = "1" if value else "0"
            env[f"RIGBASE_{name.upper()}"] = str(value)
        env["RIGBASE_DATABASE_URL"] = self.database  # the store the parent migrated, also when defaulted
        return env

    def ensure_home(self) -> Path:
        """The state directory, created 0700 on first use and tightened if it exists wider: it holds
        keys, tokens and the store."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.home.stat().st_mode & 0o077:
            self.home.chmod(0o700)
        return self.home

    @property
    def database(self) -> str:
        """`database_url`, else SQLite under the home. The plain libpq form (postgresql://…) is fine:
        store.engine.make_engine picks the psycopg driver for every URL."""
        return self.database_url or f"sqlite:///{self.home / 'rigbase.db'}"

    @property
    def client_config(self) -> Path:
        """The CLI's client config (URL + admin token), written by `provision serve`, mode 0600."""
        return self.client_settings.client_config

    @property
    def client_settings(self) -> ClientSettings:
        """What a client of this control plane reads from these settings (provisioner/client_settings.py)."""
        token = self.token.get_secret_value() if self.token else None
        return ClientSettings(home=self.home, url=self.url, token=token, ca_cert=self.ca_cert)

    @property
    def tls_dir(self) -> Path:
        """The control-plane CA and server certificate `provision serve` creates (keys 0600)."""
        return self.home / "tls"

    @property
    def secret_key(self) -> Path:
        """The key that seals secrets at rest (GCP service-account keys, join tokens for VMs)."""
        return self.home / "secret.key"
