"""The `image-builder` command line keeps the conventions of `provision` (docs/image-builder.md, "Command
line"): --help, `--json` on stdout, exit 0 / 1 refused / 2 usage, and every error one line on stderr.
Each test runs the installed console script, as an operator would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from image_builder import manifest

IMAGE_BUILDER = Path(sys.executable).parent / "image-builder"


def _run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(IMAGE_BUILDER), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "RIGBASE_HOME": str(home)},
        timeout=60,
    )


def test_help_lists_every_command(tmp_path: Path) -> None:
    r = _run("--help", home=tmp_path)
    assert r.returncode == 0, r.stderr
    for command in ("build", "device-bundle", "keygen", "verify", "resolve-nvidia"):
        assert command in r.stdout
    build_help = _run("build", "--help", home=tmp_path).stdout
    for flag in ("--bundle", "--output", "--cache", "--key", "--with-nvidia", "--mirror", "--plan", "--json"):
        assert flag in build_help


def test_keygen_json_names_both_keys_and_a_second_run_is_refused_in_one_line(tmp_path: Path) -> None:
    r = _run("keygen", "--json", home=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["private_key"] == str(tmp_path / "image-builder" / "signing-key.pem")
    assert Path(out["public_key"]).read_bytes().startswith(b"-----BEGIN PUBLIC KEY")
    again = _run("keygen", "--json", home=tmp_path)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and again.stderr.startswith("error: ") and "--force" in again.stderr


def test_usage_error_exits_2_with_one_line_naming_the_help(tmp_path: Path) -> None:
    unknown_flag = ("build", "--bundle", "b", "--output", "o", "--no-such-flag")
    for args in (("build",), unknown_flag, ("no-such-command",)):
        r = _run(*args, home=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and "--help" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_missing_or_malformed_bundle_is_refused_in_one_line(tmp_path: Path) -> None:
    manifest.keygen(tmp_path / "k.pem")
    bad = tmp_path / "bundle.json"
    bad.write_text("{not json")
    for bundle in (bad, tmp_path / "absent.json"):
        r = _run(
            "build",
            "--bundle",
            str(bundle),
            "--output",
            str(tmp_path / "out"),
            "--cache",
            str(tmp_path / "c"),
            "--key",
            str(tmp_path / "k.pem"),
            "--json",
            home=tmp_path,
        )
        assert r.returncode == 1, r.stderr
        assert r.stdout == "" and r.stderr.count("\n") == 1 and "provision region bundle" in r.stderr
        assert not (tmp_path / "out").exists()


def test_verify_json_on_a_signed_manifest_and_a_refusal_on_a_changed_one(tmp_path: Path) -> None:
    priv, pub = manifest.keygen(tmp_path / "k.pem")
    doc = {
        "schema": manifest.SCHEMA,
        "builder": {"key_sha256": "cd" * 32},
        "image": {"sha256": "ab" * 32},
        "verity": {"root_hash": "ef" * 32},
    }
    raw = manifest.canonical(doc)
    path = tmp_path / "manifest.json"
    path.write_bytes(raw)
    path.with_name("manifest.json.sig").write_bytes(manifest.sign(raw, manifest.load_private_key(priv)))
    r = _run("verify", str(path), "--public-key", str(pub), "--json", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "manifest": str(path),
        "verified": True,
        "schema": manifest.SCHEMA,
        "builder_key_sha256": "cd" * 32,
        "image_sha256": "ab" * 32,
        "root_hash": "ef" * 32,
    }
    path.write_bytes(raw.replace(b"abab", b"abac", 1))
    r = _run("verify", str(path), "--public-key", str(pub), "--json", home=tmp_path)
    assert r.returncode == 1 and r.stdout == "" and r.stderr.count("\n") == 1 and "altered" in r.stderr


def test_a_bundle_pointing_at_loopback_is_refused_before_building(tmp_path: Path) -> None:
    """Media whose bundle names 127.0.0.1 could never reach the control plane from a node: refused in one
    line before any work, unless --allow-loopback (a VM on this host)."""
    manifest.keygen(tmp_path / "k.pem")
    bundle = tmp_path / "bundle.json"
    bundle.write_text(
        json.dumps(
            {
                "version": 1,
                "control_plane_url": "https://127.0.0.1:8470",
                "ca_certificate": None,
                "region": "dc1",
                "region_id": "rg-1",
                "provider": "physical",
                "join_token": "t",
                "expires_at": None,
            }
        )
    )
    args = (
        "build",
        "--bundle",
        str(bundle),
        "--output",
        str(tmp_path / "out"),
        "--cache",
        str(tmp_path / "c"),
    )
    r = _run(*args, "--key", str(tmp_path / "k.pem"), home=tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "loopback" in r.stderr and "--control-plane-url" in r.stderr
    assert not (tmp_path / "out").exists()
    planned = _run(*args, "--key", str(tmp_path / "k.pem"), "--allow-loopback", "--plan", home=tmp_path)
    assert planned.returncode == 0, planned.stderr
