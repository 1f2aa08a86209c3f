"""TPM public areas as `cryptography` keys: the EK's SubjectPublicKeyInfo (for minion_id) and the AK's
signature check over quotes."""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from contracts.identity import minion_id_from_spki
from provisioner.attestation.tpm_structures import Alg, Curve, Signature, TpmPublic

_CURVES: dict[Curve, type[ec.EllipticCurve]] = {
    Curve.NIST_P256: ec.SECP256R1,
    Curve.NIST_P384: ec.SECP384R1,
    Curve.NIST_P521: ec.SECP521R1,
}
_HASHES: dict[Alg, type[hashes.HashAlgorithm]] = {
    Alg.SHA1: hashes.SHA1,
    Alg.SHA256: hashes.SHA256,
    Alg.SHA384: hashes.SHA384,
    Alg.SHA512: hashes.SHA512,
}

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey


def public_key(public: TpmPublic) -> PublicKey:
    """The `cryptography` key for a TPM public area."""
    if public.type == Alg.RSA:
        return rsa.RSAPublicNumbers(
            public.rsa_exponent, int.from_bytes(public.rsa_modulus, "big")
        ).public_key()
    assert public.curve is not None
    return ec.EllipticCurvePublicNumbers(
        int.from_bytes(public.ecc_x, "big"), int.from_bytes(public.ecc_y, "big"), _CURVES[public.curve]()
    ).public_key()


def spki_der(key: PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def minion_id_for(key: PublicKey) -> str:
    """The minion_id of an EK given as a `cryptography` key (derivation: contracts/identity.py)."""
    return minion_id_from_spki(spki_der(key))


def signature_valid(key: PublicKey, signature: Signature, message: bytes) -> bool:
    """True when `signature` (a parsed TPMT_SIGNATURE) signs `message` under `key`."""
    hash_cls = _HASHES.get(signature.hash_alg)
    if hash_cls is None:
        return False
    try:
        if signature.alg == Alg.ECDSA and isinstance(key, ec.EllipticCurvePublicKey):
            der = encode_dss_signature(
                int.from_bytes(signature.ecc_r, "big"), int.from_bytes(signature.ecc_s, "big")
            )
            key.verify(der, message, ec.ECDSA(hash_cls()))
        elif signature.alg == Alg.RSASSA and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature.rsa, message, padding.PKCS1v15(), hash_cls())
        elif signature.alg == Alg.RSAPSS and isinstance(key, rsa.RSAPublicKey):
            key.verify(
                signature.rsa, message, padding.PSS(padding.MGF1(hash_cls()), padding.PSS.AUTO), hash_cls()
            )
        else:
            return False
    except InvalidSignature:
        return False
    return True
