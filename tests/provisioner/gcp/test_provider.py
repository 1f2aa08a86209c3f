"""GcpProvider on the shared ProviderDriver base: registry, validation, plans — no network."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from contracts.errors import InvalidInput
from provisioner.providers.base import provider_for
from provisioner.providers.gcp import GcpProvider


def test_registry_gives_gcp_provider() -> None:
    assert isinstance(provider_for("gcp"), GcpProvider)


def test_importing_the_provider_loads_no_google_library() -> None:
    code = "import sys, provisioner.providers.gcp; print(any(m.startswith('google') for m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "False"


def test_validate_config(sa_key_json: str) -> None:
    cfg = GcpProvider().validate_config({"credentials": sa_key_json})
    assert cfg.public == {
        "project_id": "rigbase-test",
        "client_email": "rigbase@rigbase-test.iam.gserviceaccount.com",
        "prefix": "rigbase",
    }
    assert cfg.secret == sa_key_json.encode()
    assert "private_key" not in json.dumps(cfg.public)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({}, "credentials"),
        ({"credentials": "{}"}, "'type'"),
        ({"credentials": "x", "payment_mode": "barter"}, "payment mode"),
    ],
)
def test_validate_config_refuses(raw: dict, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        GcpProvider().validate_config(raw)


def test_bad_prefix(sa_key_json: str) -> None:
    with pytest.raises(InvalidInput, match="prefix"):
        GcpProvider().validate_config({"credentials": sa_key_json, "prefix": "Bad_Prefix"})


def test_validate_region_and_plan() -> None:
    p = GcpProvider()
    settings = p.validate_region("us-central1", {"storage_class": "medium"})
    assert (
        settings["zones"][0] == "us-central1-a"
        and settings["machine_type"] == "n2-standard-16"
        and settings["local_ssds"] == 8
    )
    (action,) = p.plan_region("lab", settings)
    assert (action.verb, action.kind, action.name) == ("create", "instance", "rigbase-storage-lab")
    assert "8 × 375 GB" in action.detail


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("mars-north1", {"storage_class": "small"}, "not in rigbase's catalogue"),
        ("us-east1", {}, "--storage-class"),
        ("us-east1", {"storage_class": "huge"}, "unknown storage class"),
    ],
)
def test_validate_region_refuses(name: str, options: dict, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        GcpProvider().validate_region(name, options)


def test_plan_enable(sa_key_json: str) -> None:
    p = GcpProvider()
    actions = p.plan_enable(p.validate_config({"credentials": sa_key_json}))
    assert [a.kind for a in actions] == [
        "pubsub-topic",
        "pubsub-subscription",
        "logging-sink",
        "pubsub-topic-iam",
        "firewall",
    ]
    assert actions[0].name == "projects/rigbase-test/topics/rigbase-node-events"


def test_context_from_stored_key(sa_key_json: str) -> None:
    p = GcpProvider()
    ctx = p.context(p.validate_config({"credentials": sa_key_json}))
    assert ctx.project == "rigbase-test"
    assert ctx.credentials.service_account_email == "rigbase@rigbase-test.iam.gserviceaccount.com"
