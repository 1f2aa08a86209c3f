"""One conversation with the node's TPM: the endorsement key (EK), the attestation key (AK) under it,
credential activation, quotes and PCR reads.

Why the steps look the way they do:
- The EK is re-created from the standard TCG template (`EK-RSA2048`, honouring a template/nonce the
  vendor left in NV) instead of trusting whatever sits at 0x81010001: the template is what the vendor's
  EK certificate certifies, so the public key we report is the one the certificate speaks about.
- The AK is a restricted signing key created *under the EK*. A restricted key only signs digests the
  TPM produced itself (quotes), and living under the EK makes `ActivateCredential` prove to the control
  plane that this AK and this EK share one TPM.
- The EK's authPolicy is PolicySecret(TPM_RH_ENDORSEMENT), so every use of the EK as a parent or as the
  activation key needs a fresh policy session that satisfies it.
- Without a resource manager (a bare swtpm) the TPM has 3 transient object slots, so every object this
  module loads is flushed before the method returns, error or not.

tpm2-pytss is imported here only, so `minion --help` stays instant and hosts without libtss2 still
import the rest of the minion.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contracts.attestation import ATTESTED_PCRS, PCR_BANK
from contracts.identity import minion_id_from_spki
from minion.tpm.errors import TpmError, TpmUnavailable
from minion.tpm.tcti import resolve_tcti

if TYPE_CHECKING:  # pragma: no cover - typing only
    from tpm2_pytss import ESAPI

EK_TEMPLATE = "EK-RSA2048"
# TPM2_PCR_Read returns at most 8 digests per call (TPML_DIGEST holds 8).
_PCR_READ_BATCH = 8


@dataclass(frozen=True)
class EndorsementKey:
    """The TPM's RSA-2048 EK: its TPM public area, its SPKI and (when the vendor wrote one) its
    certificate."""

    public: bytes  # marshalled TPM2B_PUBLIC, what MakeCredential on the control plane needs
    spki_der: bytes
    certificate: bytes | None  # DER, from NV 0x01C00002

    @property
    def minion_id(self) -> str:
        return minion_id_from_spki(self.spki_der)


@dataclass(frozen=True)
class AttestationKey:
    """An AK created under the EK. `private` is wrapped by the EK (only this TPM can load it), so the
    minion may keep it on disk and reload the same AK for continuous attestation after a restart."""

    public: bytes  # marshalled TPM2B_PUBLIC
    private: bytes  # marshalled TPM2B_PRIVATE
    name: bytes  # TPM2B_NAME contents: nameAlg || H(TPMT_PUBLIC)

    def to_dict(self) -> dict[str, str]:
        return {k: base64.b64encode(getattr(self, k)).decode() for k in ("public", "private", "name")}

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> AttestationKey:
        return cls(**{k: base64.b64decode(data[k]) for k in ("public", "private", "name")})


@dataclass(frozen=True)
class Quote:
    """A TPM2_Quote over `nonce` and the PCR values it covers (read alongside, checked to match)."""

    attest: bytes  # TPMS_ATTEST as signed by the AK
    signature: bytes  # marshalled TPMT_SIGNATURE
    pcrs: dict[int, bytes] = field(default_factory=dict)
    bank: str = PCR_BANK


class TpmSession:
    """Context manager around one ESAPI connection. Every method leaves no transient object loaded but the
    EK, which stays loaded until close() (see _loaded_ek)."""

    def __init__(self, tcti: str | None = None) -> None:
        self.tcti = resolve_tcti(tcti)
        self._ectx: ESAPI | None = None
        self._ek_cache: EndorsementKey | None = None
        self._ek_loaded: tuple[Any, Any, bytes | None] | None = None

    # -- connection ---------------------------------------------------------------------------------
    def __enter__(self) -> TpmSession:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        # tpm2-tss logs every expected miss (absent NV template indices, a dead socket) to stderr; our
        # exceptions say what matters. An operator's own TSS2_LOG still wins.
        os.environ.setdefault("TSS2_LOG", "all+none")
        try:
            from tpm2_pytss import ESAPI, TSS2_Exception
        except ImportError as exc:  # pragma: no cover - depends on the host's libtss2
            raise TpmUnavailable(self.tcti, f"tpm2-pytss/libtss2 not installed: {exc}") from exc
        try:
            ectx = ESAPI(self.tcti)
        except (TSS2_Exception, ValueError, OSError) as exc:
            raise TpmUnavailable(self.tcti, str(exc)) from exc
        try:
            # A cheap round trip: TCTIs connect lazily, so this is where a dead socket shows up.
            from tpm2_pytss.constants import TPM2_CAP, TPM2_PT

            ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, TPM2_PT.FIXED, 1)
        except TSS2_Exception as exc:
            ectx.close()
            raise TpmUnavailable(self.tcti, str(exc)) from exc
        self._ectx = ectx

    def close(self) -> None:
        if self._ectx is not None:
            self._flush_ek()
            self._ectx.close()
            self._ectx = None

    @property
    def ectx(self) -> ESAPI:
        if self._ectx is None:
            raise RuntimeError("TpmSession used outside `with` (call open() first)")
        return self._ectx

    # -- endorsement key ----------------------------------------------------------------------------
    @contextmanager
    def _loaded_ek(self) -> Iterator[tuple[Any, Any, bytes | None]]:
        """Yield the EK as (handle, TPM2B_PUBLIC, cert), created from the standard template on first use
        and kept loaded for this session. TPM2_CreatePrimary of an RSA-2048 key is the costliest step of
        every operation here (about 25 ms on swtpm, seconds on some discrete TPMs), and a join uses the EK
        four times (its public key, the AK's parent, the quote's AK, activate credential). One transient
        slot is held until close(); a TPM has at least three."""
        if self._ek_loaded is None:
            from tpm2_pytss.constants import ESYS_TR
            from tpm2_pytss.utils import NVReadEK, create_ek_template

            cert, template = create_ek_template(EK_TEMPLATE, NVReadEK(self.ectx))
            handle, public, _, _, _ = self.ectx.create_primary(None, template, ESYS_TR.ENDORSEMENT)
            self._ek_loaded = (handle, public, cert)
        yield self._ek_loaded

    def _flush_ek(self) -> None:
        from tpm2_pytss import TSS2_Exception

        if self._ek_loaded is not None:
            handle, self._ek_loaded = self._ek_loaded[0], None
            try:
                self.ectx.flush_context(handle)
            except TSS2_Exception:
                pass  # the TPM was reset or the connection lost: nothing is loaded any more

    def _ek_policy_session(self) -> Any:
        """A policy session satisfying the EK's PolicySecret(TPM_RH_ENDORSEMENT) authPolicy."""
        from tpm2_pytss.constants import ESYS_TR, TPM2_ALG, TPM2_SE
        from tpm2_pytss.types import TPMT_SYM_DEF

        session = self.ectx.start_auth_session(
            ESYS_TR.NONE, ESYS_TR.NONE, TPM2_SE.POLICY, TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL), TPM2_ALG.SHA256
        )
        try:
            self.ectx.policy_secret(ESYS_TR.ENDORSEMENT, session)
        except Exception:
            self.ectx.flush_context(session)
            raise
        return session

    @contextmanager
    def _ek_authorized(self) -> Iterator[Any]:
        """Yield a policy session for one EK use and flush it afterwards: ESAPI starts sessions with
        continueSession set, so without the flush each call would leak one of the TPM's session slots."""
        from tpm2_pytss import TSS2_Exception

        session = self._ek_policy_session()
        try:
            yield session
        finally:
            try:
                self.ectx.flush_context(session)
            except TSS2_Exception:
                pass  # the TPM already closed it

    def endorsement_key(self, *, refresh: bool = False) -> EndorsementKey:
        """The RSA-2048 EK (public area, SPKI, certificate when NV holds one); cached per session
        unless `refresh` (the benchmark times TPM2_CreatePrimary that way)."""
        if self._ek_cache is None or refresh:
            if refresh:
                self._flush_ek()
            with self._loaded_ek() as (_, public, cert):
                self._ek_cache = EndorsementKey(
                    public=public.marshal(),
                    spki_der=public.publicArea.to_der(),
                    certificate=_strip_nv_padding(cert) if cert else None,
                )
        return self._ek_cache

    # -- attestation key ----------------------------------------------------------------------------
    def create_ak(self) -> AttestationKey:
        """Create a restricted ECDSA P-256 signing key under the EK (fast on every TPM; quotes only)."""
        from tpm2_pytss.constants import TPMA_OBJECT
        from tpm2_pytss.types import TPM2B_PUBLIC, TPMT_PUBLIC

        attrs = (
            TPMA_OBJECT.RESTRICTED
            | TPMA_OBJECT.SIGN_ENCRYPT
            | TPMA_OBJECT.FIXEDTPM
            | TPMA_OBJECT.FIXEDPARENT
            | TPMA_OBJECT.SENSITIVEDATAORIGIN
            | TPMA_OBJECT.USERWITHAUTH
        )
        template = TPM2B_PUBLIC(
            publicArea=TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs)
        )
        with self._loaded_ek() as (ek, _, _), self._ek_authorized() as session:
            private, public, _, _, _ = self.ectx.create(ek, None, template, session1=session)
        return AttestationKey(
            public=public.marshal(), private=private.marshal(), name=bytes(public.get_name())
        )

    @contextmanager
    def _loaded_ak(self, ak: AttestationKey, ek: Any) -> Iterator[Any]:
        from tpm2_pytss.types import TPM2B_PRIVATE, TPM2B_PUBLIC

        public, _ = TPM2B_PUBLIC.unmarshal(ak.public)
        private, _ = TPM2B_PRIVATE.unmarshal(ak.private)
        with self._ek_authorized() as session:
            handle = self.ectx.load(ek, private, public, session1=session)
        try:
            yield handle
        finally:
            self.ectx.flush_context(handle)

    def activate_credential(
        self, ak: AttestationKey, credential_blob: bytes, encrypted_secret: bytes
    ) -> bytes:
        """Recover the control plane's secret; the TPM only releases it if `ak` lives beside this EK."""
        from tpm2_pytss import TSS2_Exception
        from tpm2_pytss.constants import ESYS_TR
        from tpm2_pytss.types import TPM2B_ENCRYPTED_SECRET, TPM2B_ID_OBJECT

        blob, _ = TPM2B_ID_OBJECT.unmarshal(credential_blob)
        secret, _ = TPM2B_ENCRYPTED_SECRET.unmarshal(encrypted_secret)
        with self._loaded_ek() as (ek, _, _), self._loaded_ak(ak, ek) as ak_handle:
            try:
                with self._ek_authorized() as session:
                    digest = self.ectx.activate_credential(
                        ak_handle, ek, blob, secret, session1=ESYS_TR.PASSWORD, session2=session
                    )
            except TSS2_Exception as exc:
                raise TpmError(f"the TPM refused the credential challenge: {exc}") from exc
        return bytes(digest)

    # -- PCRs and quotes ----------------------------------------------------------------------------
    def read_pcrs(self, indices: Sequence[int] = ATTESTED_PCRS) -> dict[int, bytes]:
        """Current sha256 PCR values, in batches of 8 (the TPM's per-call limit)."""
        from tpm2_pytss.types import TPML_PCR_SELECTION

        wanted = sorted(set(indices))
        values: dict[int, bytes] = {}
        while len(values) < len(wanted):
            batch = [i for i in wanted if i not in values][:_PCR_READ_BATCH]
            _, selection, digests = self.ectx.pcr_read(
                TPML_PCR_SELECTION.parse(f"{PCR_BANK}:{','.join(map(str, batch))}")
            )
            got = _selected_indices(selection)
            if not got:
                raise TpmError(f"the TPM has no {PCR_BANK} values for PCRs {batch}; is the bank enabled?")
            for index, digest in zip(got, digests, strict=True):
                values[index] = bytes(digest)
        return values

    def extend_pcr(self, index: int, data: bytes) -> bytes:
        """Measure `data` into sha256 PCR `index` (PCR ← H(PCR || H(data))); return the new value.
        The lab uses it to simulate a changed boot chain; PCR 16 is the debug PCR that can be reset."""
        from tpm2_pytss.constants import ESYS_TR, TPM2_ALG
        from tpm2_pytss.types import TPML_DIGEST_VALUES, TPMT_HA, TPMU_HA

        digest = TPMT_HA(hashAlg=TPM2_ALG.SHA256, digest=TPMU_HA(sha256=hashlib.sha256(data).digest()))
        self.ectx.pcr_extend(getattr(ESYS_TR, f"PCR{index}"), TPML_DIGEST_VALUES([digest]))
        return self.read_pcrs([index])[index]

    def quote(self, ak: AttestationKey, nonce: bytes, indices: Sequence[int] = ATTESTED_PCRS) -> Quote:
        """Quote `indices` over `nonce`. PCRs are read after quoting; if something extended a PCR in
        between, the values would not hash to the quoted digest, so we retry (bounded)."""
        from tpm2_pytss.types import TPM2B_ATTEST, TPML_PCR_SELECTION, TPMS_ATTEST

        selection = TPML_PCR_SELECTION.parse(f"{PCR_BANK}:{','.join(map(str, sorted(set(indices))))}")
        for _ in range(3):
            with self._loaded_ek() as (ek, _, _), self._loaded_ak(ak, ek) as ak_handle:
                attest, signature = self.ectx.quote(ak_handle, selection, nonce)
            attest_bytes = (
                bytes(attest.attestationData) if isinstance(attest, TPM2B_ATTEST) else bytes(attest)
            )
            pcrs = self.read_pcrs(indices)
            info, _ = TPMS_ATTEST.unmarshal(attest_bytes)
            quoted = bytes(info.attested.quote.pcrDigest)
            if quoted == hashlib.sha256(b"".join(pcrs[i] for i in sorted(pcrs))).digest():
                return Quote(attest=attest_bytes, signature=signature.marshal(), pcrs=pcrs)
        raise TpmError("PCRs kept changing while quoting; retry when the boot has settled")


def _selected_indices(selection: Any) -> list[int]:
    """PCR indices set in a TPML_PCR_SELECTION, in the order the TPM returns their digests."""
    out: list[int] = []
    for sel in selection.pcrSelections[: selection.count]:
        bits = bytes(sel.pcrSelect)[: sel.sizeofSelect]
        out.extend(byte_i * 8 + bit for byte_i, b in enumerate(bits) for bit in range(8) if b & (1 << bit))
    return out


def _strip_nv_padding(cert: bytes) -> bytes:
    """NV indices are often larger than the DER they hold (vendors pad with 0x00/0xFF); cut at the
    length the outer DER SEQUENCE header declares."""
    if len(cert) < 4 or cert[0] != 0x30:
        return cert
    first = cert[1]
    if first < 0x80:
        return cert[: 2 + first]
    n = first & 0x7F
    length = int.from_bytes(cert[2 : 2 + n], "big")
    return cert[: 2 + n + length]
