"""TPM2_MakeCredential in software (TPM 2.0 Library Part 1, 24 "Credential Protection").

The control plane encrypts a random secret to the EK so that only a TPM holding that EK *and* an object
with the AK's name can recover it with TPM2_ActivateCredential. Getting the secret back therefore proves
the AK lives in the same TPM as the certified EK. Built on `cryptography` (OAEP, KBKDF counter mode =
TPM KDFa, AES-CFB, HMAC) so the control plane needs no TPM library.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.kbkdf import KBKDFHMAC, CounterLocation, Mode

from provisioner.attestation.keys import public_key
from provisioner.attestation.tpm_structures import HASH_NAMES, HASH_SIZES, Alg, TpmPublic, tpm2b

try:  # cryptography >= 47 keeps CFB among the "decrepit" modes; TPM credential protection still mandates it
    from cryptography.hazmat.decrepit.ciphers.modes import CFB
except ImportError:  # pragma: no cover - older cryptography
    from cryptography.hazmat.primitives.ciphers.modes import CFB

_HASH_CLASSES: dict[Alg, type[hashes.SHA256 | hashes.SHA384 | hashes.SHA512 | hashes.SHA1]] = {
    Alg.SHA256: hashes.SHA256,
    Alg.SHA384: hashes.SHA384,
    Alg.SHA512: hashes.SHA512,
    Alg.SHA1: hashes.SHA1,
}


@dataclass(frozen=True)
class CredentialChallenge:
    """What goes to the minion: TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET, both marshalled."""

    credential_blob: bytes
    encrypted_secret: bytes


def kdfa(hash_alg: Alg, key: bytes, label: bytes, context_u: bytes, context_v: bytes, bits: int) -> bytes:
    """TPM KDFa = SP 800-108 counter-mode HMAC with `label || 0x00 || contextU || contextV || bits`."""
    return KBKDFHMAC(
        algorithm=_HASH_CLASSES[hash_alg](),
        mode=Mode.CounterMode,
        length=bits // 8,
        rlen=4,
        llen=4,
        location=CounterLocation.BeforeFixed,
        label=label,
        context=context_u + context_v,
        fixed=None,
    ).derive(key)


def make_credential(ek: TpmPublic, secret: bytes, object_name: bytes) -> CredentialChallenge:
    """Encrypt `secret` for the TPM owning `ek`, releasable only to an object named `object_name`."""
    if ek.type != Alg.RSA:
        raise ValueError("only RSA endorsement keys are supported")
    if ek.symmetric is None or ek.symmetric[0] != Alg.AES or ek.symmetric[2] != Alg.CFB:
        raise ValueError("the EK must be a storage key with AES-CFB symmetric parameters")
    name_alg = ek.name_alg
    hash_cls = _HASH_CLASSES[name_alg]
    seed = os.urandom(HASH_SIZES[name_alg])
    key = public_key(ek)
    assert isinstance(key, rsa.RSAPublicKey)
    encrypted_seed = key.encrypt(seed, padding.OAEP(padding.MGF1(hash_cls()), hash_cls(), b"IDENTITY\x00"))
    sym_key = kdfa(name_alg, seed, b"STORAGE", object_name, b"", ek.symmetric[1])
    encryptor = Cipher(algorithms.AES(sym_key), CFB(b"\x00" * 16)).encryptor()
    enc_identity = encryptor.update(tpm2b(secret)) + encryptor.finalize()
    hmac_key = kdfa(name_alg, seed, b"INTEGRITY", b"", b"", HASH_SIZES[name_alg] * 8)
    outer_hmac = hmac.new(hmac_key, enc_identity + object_name, HASH_NAMES[name_alg]).digest()
    return CredentialChallenge(
        credential_blob=tpm2b(tpm2b(outer_hmac) + enc_identity),
        encrypted_secret=tpm2b(encrypted_seed),
    )
