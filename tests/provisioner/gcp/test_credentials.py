"""Service-account key validation: a good key is accepted, each bad field is named in one line."""

from __future__ import annotations

import json

import pytest

from contracts.errors import InvalidInput
from provisioner.providers.gcp.credentials import parse_key
from tests.fixtures.gcp import make_sa_key


def test_valid_key_shows_project_and_account(sa_key_json: str) -> None:
    key = parse_key(sa_key_json)
    assert key.public() == {
        "project_id": "rigbase-test",
        "client_email": "rigbase@rigbase-test.iam.gserviceaccount.com",
    }
    assert key.raw == sa_key_json.encode()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"type": "authorized_user"}, "type"),
        ({"type": None}, "type"),
        ({"project_id": ""}, "project_id"),
        ({"client_email": None}, "client_email"),
        ({"client_email": "not-an-email"}, "client_email"),
        ({"private_key": "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n"}, "private_key"),
        ({"private_key": "just text"}, "private_key"),
        ({"token_uri": None}, "token_uri"),
        ({"token_uri": "http://oauth2.googleapis.com/token"}, "token_uri"),
    ],
)
def test_bad_field_is_named(overrides: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_key(json.dumps(make_sa_key(**overrides)))
    assert f"'{field}'" in err.value.message
    assert "\n" not in err.value.message
    assert err.value.code == "invalid_credentials"


@pytest.mark.parametrize("raw", [b"", b"{not json", b"[1, 2]", b"\xff\xfe", "null"])
def test_not_a_json_object(raw: bytes | str) -> None:
    with pytest.raises(InvalidInput, match="'file'"):
        parse_key(raw)


def test_oauth_client_secret_is_refused() -> None:
    # the file people download by mistake from "OAuth 2.0 Client IDs"
    doc = {
        "installed": {
            "client_id": "x.apps.googleusercontent.com",
            "client_secret": "s",
            "token_uri": "https://oauth2.googleapis.com/token",
        }
    }
    with pytest.raises(InvalidInput, match="'type'"):
        parse_key(json.dumps(doc))


def test_message_never_contains_key_material(sa_key_json: str) -> None:
    doc = json.loads(sa_key_json)
    doc["token_uri"] = "ftp://x"
    with pytest.raises(InvalidInput) as err:
        parse_key(json.dumps(doc))
    assert "PRIVATE KEY" not in err.value.message
