"""The minion's TPM layer against a real swtpm: identity, AK, activation, quotes, PCRs, slot hygiene."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import typer
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from typer.testing import CliRunner

from minion.settings import TCTI_ENV
from minion.tpm import commands
from minion.tpm.errors import TpmError, TpmUnavailable
from minion.tpm.identity import minion_id
from minion.tpm.session import ATTESTED_PCRS, AttestationKey, TpmSession
from minion.tpm.tcti import DEFAULT_TCTI, resolve_tcti
from provisioner.lab.swtpm import Swtpm


def _spki_id(spki_der: bytes) -> str:
    return hashlib.sha256(spki_der).hexdigest()[:32]


def test_minion_id_matches_ek_certificate_and_tpm2_createek(swtpm: Swtpm, tmp_path: Path) -> None:
    """Three independent derivations agree: our ESAPI EK, the vendor certificate's key, tpm2-tools."""
    cert = x509.load_der_x509_certificate(swtpm.ek_certificate.read_bytes())
    from_cert = _spki_id(
        cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    subprocess.run(
        [
            "tpm2_createek",
            "-T",
            swtpm.tcti,
            "-G",
            "rsa",
            "-f",
            "der",
            "-u",
            str(tmp_path / "ek.der"),
            "-c",
            str(tmp_path / "ek.ctx"),
        ],
        check=True,
        capture_output=True,
    )
    from_tools = _spki_id((tmp_path / "ek.der").read_bytes())
    value = minion_id(swtpm.tcti)
    assert len(value) == 32 and value == value.lower()
    assert value == from_cert == from_tools


def test_ek_certificate_comes_from_nv(swtpm: Swtpm) -> None:
    with TpmSession(swtpm.tcti) as session:
        ek = session.endorsement_key()
    assert ek.certificate == swtpm.ek_certificate.read_bytes()


def test_tcti_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library reads no environment: $RIGBASE_TCTI reaches it only as the CLI's --tcti default."""
    monkeypatch.setenv(TCTI_ENV, "swtpm:path=/env.sock")
    assert resolve_tcti() == resolve_tcti("  ") == DEFAULT_TCTI == "device:/dev/tpmrm0"
    assert resolve_tcti(" swtpm:path=/flag.sock ") == "swtpm:path=/flag.sock"


def test_env_tcti_is_the_option_default(swtpm: Swtpm) -> None:
    result = CliRunner().invoke(_cli(), ["id", "--json"], env={TCTI_ENV: swtpm.tcti})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "minion_id": minion_id(swtpm.tcti),
        "tcti": swtpm.tcti,
        "source": "tpm",
    }


@pytest.mark.parametrize("tcti", ["swtpm:path={dir}/nothing.sock", "device:{dir}/tpmrm0", "nosuchtcti:x"])
def test_no_tpm_gives_clear_error(tcti: str, tmp_path: Path) -> None:
    tcti = tcti.format(dir=tmp_path)
    with pytest.raises(TpmUnavailable) as info:
        minion_id(tcti)
    assert tcti in str(info.value) and "--tcti" in str(info.value)


def test_stopped_swtpm_is_unavailable(swtpm: Swtpm) -> None:
    swtpm.stop()
    with pytest.raises(TpmUnavailable):
        minion_id(swtpm.tcti)


def _cli() -> typer.Typer:
    app = typer.Typer()
    commands.register(app)

    @app.callback()
    def _root() -> None:  # keep `id` a subcommand, as in the real minion app
        pass

    return app


def test_minion_id_command(swtpm: Swtpm) -> None:
    runner = CliRunner()
    plain = runner.invoke(_cli(), ["id", "--tcti", swtpm.tcti])
    assert plain.exit_code == 0, plain.output
    assert plain.output.strip() == minion_id(swtpm.tcti)
    as_json = runner.invoke(_cli(), ["id", "--tcti", swtpm.tcti, "--json"])
    assert json.loads(as_json.output) == {
        "minion_id": plain.output.strip(),
        "tcti": swtpm.tcti,
        "source": "tpm",
    }


def test_minion_id_command_without_tpm(tmp_path: Path) -> None:
    result = CliRunner().invoke(_cli(), ["id", "--tcti", f"swtpm:path={tmp_path}/none.sock"])
    assert result.exit_code == 1
    assert "no TPM reachable" in result.output


def _transient_handles(session: TpmSession) -> list[int]:
    from tpm2_pytss.constants import TPM2_CAP, TPM2_HT

    _, data = session.ectx.get_capability(TPM2_CAP.HANDLES, TPM2_HT.TRANSIENT << 24, 64)
    return list(data.data.handles)


def test_ak_activation_and_quote_leave_no_object_loaded(swtpm: Swtpm) -> None:
    """swtpm has 3 object slots and no resource manager: 5 rounds would fail on the first leak. The EK
    stays loaded for the session (one CreatePrimary instead of one per operation) and close() flushes it."""
    from tpm2_pytss.types import TPM2B_NAME, TPM2B_PUBLIC
    from tpm2_pytss.utils import make_credential

    with TpmSession(swtpm.tcti) as session:
        ek_public, _ = TPM2B_PUBLIC.unmarshal(session.endorsement_key().public)
        for round_ in range(5):
            ak = session.create_ak()
            blob, secret = make_credential(ek_public, f"secret-{round_}".encode(), TPM2B_NAME(ak.name))
            assert (
                session.activate_credential(ak, blob.marshal(), secret.marshal())
                == f"secret-{round_}".encode()
            )
            quote = session.quote(ak, b"n" * 32)
            assert sorted(quote.pcrs) == list(ATTESTED_PCRS)
        assert len(_transient_handles(session)) == 1  # the EK
    with TpmSession(swtpm.tcti) as after:
        assert _transient_handles(after) == []


def test_ak_reloads_in_a_new_session_after_serialization(swtpm: Swtpm) -> None:
    with TpmSession(swtpm.tcti) as session:
        ak = session.create_ak()
    stored = json.loads(json.dumps(ak.to_dict()))
    with TpmSession(swtpm.tcti) as session:
        quote = session.quote(AttestationKey.from_dict(stored), b"x" * 32)
    # The reloaded key is the same AK: its quote verifies against the public part recorded at creation.
    from provisioner.attestation.quote import QuoteEvidence, VerifiedQuote, verify_quote
    from provisioner.attestation.tpm_structures import parse_public

    verified = verify_quote(
        parse_public(ak.public), QuoteEvidence(quote.attest, quote.signature, quote.pcrs), b"x" * 32
    )
    assert isinstance(verified, VerifiedQuote), verified


def test_credential_for_another_tpm_is_refused(swtpm: Swtpm, make_swtpm) -> None:
    """A challenge made for TPM A's EK cannot be activated in TPM B, even for B's own AK's name."""
    from tpm2_pytss.types import TPM2B_NAME, TPM2B_PUBLIC
    from tpm2_pytss.utils import make_credential

    with TpmSession(swtpm.tcti) as a:
        ek_a, _ = TPM2B_PUBLIC.unmarshal(a.endorsement_key().public)
    with TpmSession(make_swtpm().tcti) as b:
        ak_b = b.create_ak()
        blob, secret = make_credential(ek_a, b"for A only", TPM2B_NAME(ak_b.name))
        with pytest.raises(TpmError):
            b.activate_credential(ak_b, blob.marshal(), secret.marshal())
        assert len(_transient_handles(b)) == 1  # the EK, until the session closes


def test_extend_pcr_changes_value_and_quote(swtpm: Swtpm) -> None:
    with TpmSession(swtpm.tcti) as session:
        before = session.read_pcrs()
        new = session.extend_pcr(12, b"kernel command line changed")
        assert (
            new
            == hashlib.sha256(before[12] + hashlib.sha256(b"kernel command line changed").digest()).digest()
        )
        ak = session.create_ak()
        quote = session.quote(ak, b"q" * 32)
    assert quote.pcrs[12] == new and quote.pcrs[0] == before[0]
