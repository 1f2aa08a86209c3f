"""What the services and reconcilers of one control-plane process take from its settings, built once.

`create_app` builds a Runtime from the Settings `provision serve` loaded (provisioner/settings.py) and
attaches it to the app's session factory, so every unit of work (a request's session, a reconciler's
session factory) carries it and no service reads the environment. Tests build the Runtime they want
(a GCP provider pointed at local fakes) and attach it the same way."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from provisioner.adapters.object_store import ObjectStore, open_store
from provisioner.adapters.secrets import Sealer
from provisioner.providers.base import ProviderDriver, provider_for
from provisioner.services.common.heartbeat_timing import HeartbeatTiming
from provisioner.settings import DEFAULT_PORT, Settings

_KEY = "rigbase.runtime"  # the key in Session.info


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    sealer: Sealer
    heartbeat: HeartbeatTiming
    # provider drivers built with something of their own (GCP: the catalogue directory, or in tests
    # endpoints of local fakes); kinds not here are built plainly
    providers: Mapping[str, ProviderDriver] = field(default_factory=dict)
    _objects: dict[str, ObjectStore] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        providers: Mapping[str, ProviderDriver] | None = None,
    ) -> Runtime:
        settings.ensure_home()
        built: dict[str, ProviderDriver] = {}
        if settings.regions_dir is not None:
            from provisioner.providers.gcp import GcpProvider

            built[GcpProvider.kind] = GcpProvider(regions_dir=settings.regions_dir)
        return cls(
            settings=settings,
            sealer=Sealer(settings.secret_key),
            heartbeat=HeartbeatTiming(
                interval_s=settings.heartbeat_s,
                quote_every=settings.quote_every,
                quote_grace_beats=settings.quote_grace_beats,
            ),
            providers={**built, **(providers or {})},
        )

    def objects(self) -> ObjectStore:
        """The object store the settings name (opened once per runtime)."""
        store = self._objects.get("store")
        if store is None:
            store = open_store(
                self.settings.object_store, self.settings.object_store_endpoint, self.settings.home
            )
            self._objects["store"] = store
        return store

    def provider(self, kind: str) -> ProviderDriver:
        """The driver for `kind`: the one this runtime was given, else the plain one."""
        return self.providers.get(kind) or provider_for(kind)

    def node_url(self) -> str:
        """The URL nodes dial, written into their bundles and minion.yaml: RIGBASE_PUBLIC_URL (what VMs in
        Google Cloud or a lab's LAN can reach), else the URL `provision serve` wrote, else the default."""
        if self.settings.public_url:
            return self.settings.public_url
        written = _written_url(self.settings.client_config)
        if written is not None:
            return written
        scheme = "http" if self.settings.insecure_http else "https"
        return f"{scheme}://127.0.0.1:{DEFAULT_PORT}"


# client.json's URL by path, with the stat it was read at: every heartbeat answer of a node with finalize
# work names the URL, and a stat costs far less than reading and parsing the file each time. `provision
# serve` rewrites the file (a new inode, mtime and size), so a changed file is read again.
_WRITTEN: dict[Path, tuple[tuple[int, int, int], str]] = {}


def _written_url(path: Path) -> str | None:
    """The URL in the client config at `path`, or None when it is missing or unreadable."""
    try:
        st = path.stat()
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = _WRITTEN.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        url = str(json.loads(path.read_text())["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    _WRITTEN[path] = (stamp, url)
    return url


def attach(sessions: sessionmaker[Session], runtime: Runtime) -> sessionmaker[Session]:
    """Make every session of `sessions` carry `runtime`."""
    sessions.configure(info={_KEY: runtime})
    return sessions


def runtime_of(source: Session | sessionmaker[Session]) -> Runtime:
    """The runtime a session (or session factory) carries. One made outside an app (a script, a test
    that did not attach one) gets a runtime from the settings of the environment, loaded here."""
    info = source.info if isinstance(source, Session) else source.kw.get("info") or {}
    runtime = info.get(_KEY)
    if runtime is None:
        runtime = Runtime.from_settings(Settings.load())
    return runtime
