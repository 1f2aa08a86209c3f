"""What a booted node prints on its console about its measurements (image_builder.node_files'
MEASUREMENTS_SCRIPT: one RIGBASE-PCR<n>= line per PCR and the event log in base64), read back and checked
against the image's signed manifest."""

from __future__ import annotations

import base64
import re
from typing import Any

from image_builder import measure

EVENTLOG_LINE = r"RIGBASE-EVENTLOG=\S+\r?\n"  # the whole line: a partial one fails base64


def pcrs(console: str) -> dict[int, str]:
    return {int(p): v.lower() for p, v in re.findall(r"RIGBASE-PCR(\d+)=([0-9A-Fa-f]{64})", console)}


def assert_measured_as_signed(console: str, doc: dict[str, Any]) -> None:
    """PCR 11 and 12 equal the manifest's, and the PCR 4 event log replays to the manifest's boot path."""
    values = pcrs(console)
    assert values[11] == {p["phase"]: p["sha256"] for p in doc["pcr11"]}["sysinit:ready"]
    assert values[12] == doc["pcr12"]["sha256"]
    found = re.search(r"RIGBASE-EVENTLOG=(\S+)", console)
    assert found, "no event log line on the console"
    events = measure.parse_event_log(base64.b64decode(found.group(1)))
    check = measure.check_pcr4(events, values[4], doc["pe_hashes"])
    assert check.ok, check.reason
    assert check.loaded_images == doc["pcr4"]["boot_path"] and values[4] == doc["pcr4"]["sha256"]
    assert measure.replay(events, 11) == {p["phase"]: p["sha256"] for p in doc["pcr11"]}[""]
