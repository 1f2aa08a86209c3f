"""Image-builder manifests on the control plane (`provision image trust-key|register|list|show|remove`)
and what the join verifier expects from them.

Trust: the operator trusts a builder's Ed25519 public key; a manifest is accepted only when its detached
signature verifies with one of the trusted keys (contracts.manifest.verify — the same code the builder
and `image-builder verify` use, so the two sides cannot disagree about the signed bytes).

What a joining node must show (docs/image-builder.md, "Registering images with the control plane"):
PCR 11 as predicted for the phase a running node reports (`sysinit:ready`) and PCR 12 (the command line).
PCR 4 depends on the firmware's boot path (other boot options tried first, a shim…), so it is not compared
with one value: the node sends the firmware's event log, which must replay to its PCR 4 and name only EFI
applications among the manifests' `pe_hashes` (provisioner/attestation/boot_path.py). Several manifests in
one region are a rollout: a node matching any of them passes."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidInput, NotFound, RuleViolation
from provisioner.attestation.boot_path import BootPathPolicy
from provisioner.attestation.pcr_policy import ManifestPolicy, PcrPolicy, PcrPolicyMode, PcrVerdict
from provisioner.domain.states import IMAGE_TRANSITIONS, TRUST_TRANSITIONS, ImageState, TrustState
from provisioner.services.common import desired_state, lifecycle
from provisioner.services.regions import regions as region_service
from provisioner.store.image_models import ImageKey, ImagePublication, RegisteredManifest
from provisioner.store.models import Region

KEY_KIND = "image_key"
KIND = "image"
RUNNING_PHASE = "sysinit:ready"  # the PCR 11 phase a node reports once its minion runs
_HEX64 = re.compile(r"[0-9a-f]{64}")  # fullmatch: `re.match` with `$` accepts a trailing newline


# ---------------------------------------------------------------- trusted builder keys


def trust_key(session: Session, public_key: bytes, *, name: str | None, actor: str) -> ImageKey:
    """Trust an image builder's public key (PEM SPKI, raw 32 bytes or base64). Trusting a key twice
    returns the existing row: the fingerprint is the identity."""
    from contracts.manifest import ManifestError, public_key_fingerprint

    try:
        fingerprint = public_key_fingerprint(public_key)
    except (ManifestError, ValueError, TypeError) as exc:
        message = str(exc) if isinstance(exc, ManifestError) else "the file holds no Ed25519 public key"
        raise InvalidInput(
            f"{message.rstrip('.')}: pass the builder.pub (or signing-key.pub) that "
            "`image-builder keygen` wrote"
        ) from None
    row = session.scalar(select(ImageKey).where(ImageKey.fingerprint == fingerprint))
    if row is not None:
        return row
    # kept as given (PEM) or as base64 (raw bytes): both are forms contracts.manifest.verify reads
    if b"-----BEGIN" in public_key:
        stored = public_key.decode()
    elif len(public_key) == 32:
        stored = base64.b64encode(public_key).decode()
    else:
        stored = public_key.decode().strip()
    row = ImageKey(
        name=(name or f"builder-{fingerprint[:12]}")[:128],
        fingerprint=fingerprint,
        public_key=stored,
        created_by=actor[:128],
    )
    session.add(row)
    session.flush()
    lifecycle.record(
        session,
        kind=KEY_KIND,
        resource_id=row.id,
        name=row.name,
        actor=actor,
        table=TRUST_TRANSITIONS,
        frm=None,
        to=TrustState.TRUSTED,
        reason=f"sha256 {fingerprint}",
    )
    return row


def list_keys(session: Session) -> list[ImageKey]:
    return list(session.scalars(select(ImageKey).order_by(ImageKey.created_at, ImageKey.id)))


def get_key(session: Session, ref: str) -> ImageKey:
    """By id, name, or a fingerprint prefix of at least 8 characters."""
    rows = [
        k
        for k in list_keys(session)
        if ref in (k.id, k.name) or (len(ref) >= 8 and k.fingerprint.startswith(ref.lower()))
    ]
    if len(rows) != 1:
        raise NotFound(
            f"no single trusted image key matches '{ref}': see `provision image list-keys`",
            code="image_key_not_found",
        )
    return rows[0]


def untrust_key(
    session: Session, ref: str, *, force: bool = False, actor: str
) -> tuple[ImageKey, list[RegisteredManifest]]:
    """Stop trusting a key. Its manifests would otherwise stay trusted without a trusted signer, so they
    are removed with it — only with `force`, because that changes what nodes of those regions must show."""
    key = get_key(session, ref)
    signed = list(session.scalars(select(RegisteredManifest).where(RegisteredManifest.key_id == key.id)))
    if signed and not force:
        raise RuleViolation(
            f"key '{key.name}' signed {len(signed)} registered manifest(s): remove them with "
            f"`provision image remove ID` or pass --force to remove them with the key",
            code="image_key_in_use",
        )
    for manifest in signed:
        _delete_manifest(session, manifest, actor=actor, reason=f"its signing key '{key.name}' was untrusted")
    lifecycle.record(
        session,
        kind=KEY_KIND,
        resource_id=key.id,
        name=key.name,
        actor=actor,
        table=TRUST_TRANSITIONS,
        frm=TrustState.TRUSTED,
        to=TrustState.REMOVED,
        reason="untrusted by operator",
    )
    session.delete(key)
    session.flush()
    return key, signed


# ---------------------------------------------------------------- manifests


@dataclass(frozen=True)
class _Expected:
    """What a verified manifest tells the verifier, checked for shape before anything is stored."""

    pcr11: str
    pcr12: str
    pcr4: str | None
    pe_hashes: list[str]
    image_sha256: str
    uki_sha256: str
    verity_root_hash: str
    packages: int


def _hex(doc: dict[str, Any], *path: str) -> str:
    value: Any = doc
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise InvalidInput(
            f"the manifest has no valid {'.'.join(path)} (64 lowercase hex characters): rebuild "
            "the image with the current image-builder",
            code="manifest_incomplete",
        )
    return value


def _pe_hashes(doc: dict[str, Any]) -> list[str]:
    """The manifest's pe_hashes (name → Authenticode sha256) as a sorted list of digests."""
    found = doc.get("pe_hashes")
    digests = list(found.values()) if isinstance(found, dict) else []
    if not digests or not all(isinstance(d, str) and _HEX64.fullmatch(d) for d in digests):
        raise InvalidInput(
            "the manifest has no valid pe_hashes (name → 64 lowercase hex characters), which joins need "
            "to check the boot path: rebuild the image with the current image-builder",
            code="manifest_incomplete",
        )
    return sorted(set(digests))


def _expected(doc: dict[str, Any]) -> _Expected:
    phases = {e.get("phase"): e.get("sha256") for e in doc.get("pcr11") or [] if isinstance(e, dict)}
    pcr4 = (doc.get("pcr4") or {}).get("sha256") if isinstance(doc.get("pcr4"), dict) else None
    root = (doc.get("verity") or {}).get("root_hash") if isinstance(doc.get("verity"), dict) else None
    if not isinstance(root, str) or not re.fullmatch(r"[0-9a-f]{64,128}", root):
        raise InvalidInput(
            "the manifest has no verity.root_hash: rebuild the image with the current image-builder",
            code="manifest_incomplete",
        )
    return _Expected(
        pcr11=_hex({"pcr11": phases}, "pcr11", RUNNING_PHASE),
        pcr12=_hex(doc, "pcr12", "sha256"),
        pcr4=pcr4 if isinstance(pcr4, str) and _HEX64.fullmatch(pcr4) else None,
        pe_hashes=_pe_hashes(doc),
        image_sha256=_hex(doc, "image", "sha256"),
        uki_sha256=_hex(doc, "uki", "sha256"),
        verity_root_hash=root,
        packages=len(doc.get("packages") or []),
    )


def _verified(session: Session, manifest: bytes, signature: bytes) -> tuple[dict[str, Any], ImageKey]:
    """The parsed manifest and the trusted key whose signature checks out, or a one-line refusal."""
    from contracts.manifest import ManifestError, verify

    if not signature.strip():
        raise RuleViolation(
            "the manifest is unsigned (empty signature): pass the manifest.json.sig the builder wrote",
            code="manifest_unsigned",
        )
    keys = list_keys(session)
    if not keys:
        raise RuleViolation(
            "no image builder key is trusted yet: run `provision image trust-key builder.pub` first",
            code="image_key_untrusted",
        )
    named = _claimed_signer(manifest)
    last: ManifestError | None = None
    for key in sorted(keys, key=lambda k: k.fingerprint != named):  # the key the manifest names first
        try:
            return verify(manifest, signature, key.public_key.encode()), key
        except ManifestError as exc:
            last = exc
    if named and any(k.fingerprint == named for k in keys):
        raise RuleViolation(
            f"{str(last).rstrip('.')}: rebuild the image or register the untouched "
            "manifest.json with its .sig",
            code="manifest_signature_invalid",
        )
    raise RuleViolation(
        f"the manifest is not signed by a trusted image builder key (it names "
        f"{(named or 'no key')[:16]}…): trust the builder's key with `provision image trust-key "
        f"builder.pub` if you trust that builder",
        code="image_key_untrusted",
    )


def _claimed_signer(manifest: bytes) -> str | None:
    """builder.key_sha256 as the (not yet verified) manifest states it: only used to pick the key to try
    first and to word the refusal, never to decide trust."""
    try:
        value = json.loads(manifest).get("builder", {}).get("key_sha256")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _region_for(session: Session, doc: dict[str, Any], region_ref: str | None) -> Region:
    """The region named in the manifest (its bundle), or the one given; both must agree."""
    named = doc.get("region")
    if not isinstance(named, dict):
        named = {}
    in_manifest: Region | None = None
    for ref in (named.get("region_id"), named.get("name")):
        if isinstance(ref, str) and ref:
            try:
                in_manifest = region_service.get(session, ref)
                break
            except (NotFound, InvalidInput):
                continue
    if region_ref is None:
        if in_manifest is None:
            where = f"region '{named.get('name')}'" if named.get("name") else "no region"
            raise InvalidInput(
                f"the manifest names {where} this control plane knows: pass --region REGION",
                code="manifest_region_unknown",
            )
        return in_manifest
    given = region_service.get(session, region_ref)
    if in_manifest is not None and in_manifest.id != given.id:
        raise InvalidInput(
            f"the image was built for region '{in_manifest.name}', not '{given.name}': its nodes "
            f"join with '{in_manifest.name}''s bundle; drop --region or rebuild the image",
            code="manifest_region_mismatch",
        )
    return given


def register(
    session: Session,
    manifest: bytes,
    signature: bytes,
    *,
    region: str | None = None,
    actor: str,
) -> RegisteredManifest:
    """Verify, check shape, bind to a region, store. Every check runs before the first write, so a
    refused manifest leaves nothing behind."""
    doc, key = _verified(session, manifest, signature)
    expected = _expected(doc)
    target = _region_for(session, doc, region)
    sha = hashlib.sha256(manifest).hexdigest()
    existing = session.scalar(
        select(RegisteredManifest).where(
            RegisteredManifest.region_id == target.id, RegisteredManifest.manifest_sha256 == sha
        )
    )
    if existing is not None:
        raise Conflict(
            f"this manifest is already registered for region '{target.name}' as {existing.id}: nothing to do",
            code="manifest_exists",
        )
    try:
        text = manifest.decode("ascii")
    except UnicodeDecodeError:  # canonical JSON is ASCII; keep other bytes exact all the same
        text = "base64:" + base64.b64encode(manifest).decode()
    row = RegisteredManifest(
        region_id=target.id,
        key_id=key.id,
        manifest_sha256=sha,
        manifest=text,
        signature=base64.b64encode(_raw_signature(signature)).decode(),
        image_sha256=expected.image_sha256,
        uki_sha256=expected.uki_sha256,
        verity_root_hash=expected.verity_root_hash,
        pcr11=expected.pcr11,
        pcr12=expected.pcr12,
        pcr4=expected.pcr4,
        pe_hashes=expected.pe_hashes,
        packages=expected.packages,
        created_by=actor[:128],
    )
    session.add(row)
    session.flush()
    lifecycle.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=f"{target.name}:{sha[:12]}",
        actor=actor,
        table=IMAGE_TRANSITIONS,
        frm=None,
        to=ImageState.REGISTERED,
        reason=f"manifest sha256 {sha} signed by '{key.name}' ({key.fingerprint[:16]}); joins check "
        f"PCR 11, 12 and the boot path ({len(expected.pe_hashes)} EFI applications)",
    )
    return row


def _raw_signature(signature: bytes) -> bytes:
    return signature if len(signature) == 64 else base64.b64decode(signature.strip())


def list_manifests(session: Session, region: str | None = None) -> list[RegisteredManifest]:
    stmt = select(RegisteredManifest).order_by(RegisteredManifest.created_at, RegisteredManifest.id)
    if region:
        stmt = stmt.where(RegisteredManifest.region_id == region_service.get(session, region).id)
    return list(session.scalars(stmt))


def get_manifest(session: Session, ref: str) -> RegisteredManifest:
    """By id or a manifest SHA-256 prefix of at least 8 characters (unique across regions)."""
    rows = [
        m
        for m in list_manifests(session)
        if m.id == ref or (len(ref) >= 8 and m.manifest_sha256.startswith(ref.lower()))
    ]
    if len(rows) != 1:
        raise NotFound(
            f"no single registered image matches '{ref}': see `provision image list`", code="image_not_found"
        )
    return rows[0]


def manifest_document(row: RegisteredManifest) -> dict[str, Any]:
    raw = base64.b64decode(row.manifest[7:]) if row.manifest.startswith("base64:") else row.manifest.encode()
    return json.loads(raw)


def remove(session: Session, ref: str, *, actor: str) -> RegisteredManifest:
    row = get_manifest(session, ref)
    _delete_manifest(session, row, actor=actor, reason="removed by operator")
    session.flush()
    return row


def _delete_manifest(session: Session, row: RegisteredManifest, *, actor: str, reason: str) -> None:
    name = f"{row.region.name}:{row.manifest_sha256[:12]}"
    published = list(session.scalars(select(ImagePublication).where(ImagePublication.manifest_id == row.id)))
    if published:
        # the provider's images stay (a running VM's disk was made from one); the operator deletes them
        reason += "; left in the provider's project: " + ", ".join(f"image {p.image_name}" for p in published)
        for pub in published:
            session.delete(pub)
    lifecycle.record(
        session,
        kind=KIND,
        resource_id=row.id,
        name=name,
        actor=actor,
        table=IMAGE_TRANSITIONS,
        frm=ImageState.REGISTERED,
        to=ImageState.REMOVED,
        reason=reason,
    )
    session.delete(row)


# ---------------------------------------------------------------- what the join verifier expects


def expected_pcrs(row: RegisteredManifest | ManifestFacts) -> dict[int, bytes]:
    return {11: bytes.fromhex(row.pcr11), 12: bytes.fromhex(row.pcr12)}


class ManifestFacts(NamedTuple):
    """What a node's attestation checks of one registered manifest."""

    pcr11: str
    pcr12: str
    pe_hashes: list[str] | None


_MANIFEST_FACTS = "images.manifest_facts"


def _manifest_facts(session: Session, region: Region) -> list[ManifestFacts]:
    """The region's registered manifests, oldest first, as the checks read them: once per heartbeat
    (desired_state.memo), whose quote check asks for both the PCR policy and the boot path."""

    def read() -> list[ManifestFacts]:
        m = RegisteredManifest
        rows = session.execute(
            select(m.pcr11, m.pcr12, m.pe_hashes).where(m.region_id == region.id).order_by(m.created_at, m.id)
        )
        return [ManifestFacts(*row) for row in rows]

    return desired_state.memo(session, (_MANIFEST_FACTS, region.id), read)


def manifest_pcr_sets(session: Session, region: Region) -> list[dict[int, bytes]]:
    """One expectation per registered manifest of the region, oldest first (distinct ones only)."""
    sets: list[dict[int, bytes]] = []
    for row in _manifest_facts(session, region):
        expected = expected_pcrs(row)
        if expected not in sets:
            sets.append(expected)
    return sets


@dataclass(frozen=True)
class AnyManifestPolicy:
    """A rollout: the node passes when its PCRs match any registered manifest. A refusal names the PCRs
    that differ from the closest manifest (fewest differing PCRs), which is the one the node most
    likely meant to boot."""

    alternatives: tuple[ManifestPolicy, ...]
    mode: PcrPolicyMode = PcrPolicyMode.manifest

    def check(self, pcrs: Mapping[int, bytes]) -> PcrVerdict:
        verdicts = [policy.check(pcrs) for policy in self.alternatives]
        return next((v for v in verdicts if v.ok), None) or min(verdicts, key=lambda v: len(v.differing))


def manifest_policy_for(session: Session, region: Region) -> PcrPolicy | None:
    """The region's manifest policy (None: no manifest registered, the verifier uses record mode)."""
    sets = manifest_pcr_sets(session, region)
    if not sets:
        return None
    if len(sets) == 1:
        return ManifestPolicy(sets[0])
    return AnyManifestPolicy(tuple(ManifestPolicy(s) for s in sets))


def boot_path_policy_for(session: Session, region: Region) -> BootPathPolicy:
    """What the region's event logs must show: with manifests registered, a log whose EFI applications
    are all among their pe_hashes (any manifest's, as in a rollout); without, only a log that replays."""
    rows = _manifest_facts(session, region)
    if not rows:
        return BootPathPolicy()
    return BootPathPolicy(frozenset(d for row in rows for d in row.pe_hashes or ()))
