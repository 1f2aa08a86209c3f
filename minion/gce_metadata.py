"""The enrollment bundle of a rigbase VM on Google Compute Engine, read from the instance metadata server.

A GCE boot disk has no USB drive and no bundle on its ESP: the control plane puts the region's bundle in
the instance's metadata under `rigbase-bundle` when it creates the VM (provisioner/providers/gcp/
instances.py), and `minion gce-bundle` copies it to the state partition before the minion starts
(the image's rigbase-gce-bundle.service). The metadata server is link-local and answers only requests
carrying `Metadata-Flavor: Google`, and it says so in the same header: a response without it is not the
metadata server's (a captive proxy, a misrouted name) and is refused. Standard library only."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from pathlib import Path

from contracts.bundle import BundleError, EnrollmentBundle, parse_bundle, write_bundle

DEFAULT_HOST = (
    "metadata.google.internal"  # GCE's DHCP resolver answers it (minion settings: GCE_METADATA_HOST)
)
ATTRIBUTE = "rigbase-bundle"  # the instance attribute the control plane writes
PATH = f"/computeMetadata/v1/instance/attributes/{ATTRIBUTE}"
FLAVOR = ("Metadata-Flavor", "Google")
DMI_PRODUCT_NAME = Path("/sys/class/dmi/id/product_name")
GCE_PRODUCT_NAME = "Google Compute Engine"  # every Compute Engine VM's DMI product name
STATE_BUNDLE = "bundle.json"  # where `minion gce-bundle` puts it, in the state directory (the image's unit)


def on_gce(product_name: Path = DMI_PRODUCT_NAME) -> bool:
    """Whether this machine is a Compute Engine VM (its DMI product name, as the image's units check)."""
    try:
        return product_name.read_text().strip() == GCE_PRODUCT_NAME
    except OSError:
        return False


class MetadataUnavailable(Exception):
    """The metadata server could not be asked (yet): the network may still be coming up."""


class NoBundle(Exception):
    """The metadata server answered, without a usable bundle: retrying will not help."""


def fetch(host: str = DEFAULT_HOST, *, timeout_s: float = 5.0) -> EnrollmentBundle:
    """One request for the bundle; MetadataUnavailable (retry) or NoBundle (give up) when it fails."""
    conn = http.client.HTTPConnection(host, timeout=timeout_s)
    try:
        conn.request("GET", PATH, headers=dict([FLAVOR]))
        resp = conn.getresponse()
        body = resp.read(1 << 20)
    except OSError as exc:
        raise MetadataUnavailable(f"the metadata server {host} cannot be reached ({exc})") from None
    finally:
        conn.close()
    if resp.getheader(FLAVOR[0]) != FLAVOR[1]:
        raise NoBundle(f"{host} answered without {FLAVOR[0]}: {FLAVOR[1]}; it is not a GCE metadata server")
    if resp.status == 404:
        raise NoBundle(
            f"this instance has no '{ATTRIBUTE}' metadata; it was not created by rigbase "
            "(create VMs with `provision region create` or let placement create them)"
        )
    if resp.status != 200:
        raise MetadataUnavailable(f"the metadata server answered {resp.status} {resp.reason}")
    try:
        return parse_bundle(json.loads(body), f"the instance metadata '{ATTRIBUTE}'")
    except ValueError:
        raise NoBundle(f"the instance metadata '{ATTRIBUTE}' is not JSON") from None
    except BundleError as exc:
        raise NoBundle(exc.message) from None


def fetch_to(
    output: Path,
    host: str = DEFAULT_HOST,
    *,
    wait_s: float = 300.0,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> EnrollmentBundle:
    """Fetch, retrying while the server cannot be reached (up to wait_s), and write the bundle 0600."""
    deadline = time.monotonic() + wait_s
    delay = 0.5
    while True:
        try:
            bundle = fetch(host)
            break
        except MetadataUnavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            say(f"waiting for the metadata server: {exc}")
            sleep(delay)
            delay = min(delay * 2, 10.0)
    output.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_bundle(output, bundle)
    return bundle
