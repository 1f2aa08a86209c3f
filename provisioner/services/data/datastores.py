"""Datastores: an NFS or SMB share of a region, with a root that jobs can never climb above.

The root and the credential rules are the ones the node applies before it mounts (contracts/regional.py:
`check_datastore` and `normalize_root`), so the control plane accepts exactly what a node can mount. The
SMB password is sealed at rest (provisioner/adapters/secrets.py) and never returned by the API."""

from __future__ import annotations

import ipaddress

from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput
from contracts.regional import DatastoreType, check_datastore, check_one_line, normalize_root
from provisioner.domain.states import DATASTORE_TRANSITIONS, DatastoreState
from provisioner.services.common import lifecycle, names
from provisioner.services.common.runtime import runtime_of
from provisioner.services.regions import regional_lookup
from provisioner.services.regions import regions as region_service
from provisioner.store.models import new_id
from provisioner.store.regional_models import Datastore

KIND = "datastore"


def transition(
    session: Session, ds: Datastore, to: DatastoreState, *, actor: str, reason: str | None = None
) -> None:
    lifecycle.apply(
        session, ds, to, kind=KIND, name=ds.name, table=DATASTORE_TRANSITIONS, actor=actor, reason=reason
    )


def _check_address(address: str) -> str:
    """The address in the one form the store keeps and nodes mount: an IP address in its canonical text
    (IPv6 compressed, lowercase), else a lowercase DNS name as given. Comparing and showing stored
    addresses then needs no normalising of its own."""
    check_one_line("datastore address", address)  # an IPv6 scope id ("fe80::1%eth0") takes any text
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return names.hostname(address)


def add(
    session: Session,
    name: str,
    *,
    region: str,
    type: str,
    address: str,
    root: str,
    username: str | None = None,
    password: str | None = None,
    actor: str,
) -> Datastore:
    names.dns_label("datastore", name)
    try:
        kind = DatastoreType(type)
    except ValueError:
        raise InvalidInput(
            f"datastore type '{type}' is not known: use nfs or smb", code="invalid_type"
        ) from None
    address = _check_address(address)
    # the node's rules, verbatim: root absolute without '..', SMB needs credentials, NFS refuses them
    check_datastore(name, kind, root, username or None, password)
    reg = region_service.get(session, region)
    if regional_lookup.holder(session, Datastore, reg.id, name=name) is not None:
        raise Conflict(
            f"datastore '{name}' already exists in region '{reg.name}': choose another name",
            code="duplicate_name",
        )
    ds = Datastore(
        id=new_id("ds"),
        name=name,
        region=reg,
        type=kind.value,
        address=address,
        root=str(normalize_root(root)),
        username=username or None,
        sealed_password=runtime_of(session).sealer.seal(password.encode()) if password is not None else None,
    )
    session.add(ds)
    transition(
        session,
        ds,
        DatastoreState.ACTIVE,
        actor=actor,
        reason=f"added by operator: {kind.value} {address}:{ds.root}",
    )
    return ds


def list_all(session: Session, region: str | None = None) -> list[Datastore]:
    return regional_lookup.list_live(session, Datastore, region)


def get(session: Session, ref: str, region: str | None = None) -> Datastore:
    """By id, or by name (unique per region; `region` disambiguates)."""
    return regional_lookup.get_live(session, Datastore, KIND, ref, region)


def remove_row(
    session: Session, ds: Datastore, *, actor: str, reason: str = "removed by operator"
) -> Datastore:
    transition(session, ds, DatastoreState.REMOVED, actor=actor, reason=reason)
    return ds


def remove(session: Session, ref: str, *, region: str | None = None, actor: str) -> Datastore:
    return remove_row(session, get(session, ref, region), actor=actor)
