"""What a serving process sets before it answers, in `provision serve` and in each of its workers."""

from __future__ import annotations

import gc

#: The event loop and HTTP parser `provision serve` runs uvicorn with (uvicorn's "standard" extras).
SERVE_LOOP, SERVE_HTTP = "uvloop", "httptools"

# On asyncio's own loop (the bench's load client; uvloop keeps its own, smaller buffers), every TLS
# connection gets a read buffer of SSLProtocol.max_size (256 KiB), zero-filled and so resident: 10,000
# connections held between beats would pin 2.5 GiB in buffers alone.
# A TLS record carries at most 16 KiB, so a 32 KiB read still takes two whole records; a large upload
# only makes more reads (bench/bench_fleet_heartbeats.py measures the memory a held connection costs).
TLS_READ_BUFFER = 32 * 1024


def tune_process() -> None:
    """A page of 500 nodes allocates tens of thousands of short-lived objects; with CPython's default
    thresholds a full collection of everything the app imported lands inside some requests and sets
    the p99 (bench/bench_api.py). Freezing the start-up heap and collecting young objects less often
    keeps the pauses short; memory stays bounded because full collections still run. Then the smaller
    TLS read buffer (TLS_READ_BUFFER) for whatever runs on asyncio's own loop; uvloop's is its own."""
    import asyncio.sslproto

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


def keep_alive_s(heartbeat_s: float) -> int:
    """How long the server keeps an idle connection: two beats and a margin, so a minion's connection
    (kept 1.5 beats and 5 s, minion/join/client.py beat_idle_s) is always the minion's to close, and a
    beat never races the server's close. A browser or the CLI holds an idle socket that long too."""
    return int(2 * heartbeat_s + 15)
