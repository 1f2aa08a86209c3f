"""The heartbeat key `objects` (docs/data.md, "The regional cache"): which objects a node should hold in
its cache, and what its cache holds.

Where a region's objects are cached depends on its storage mode (contracts/regional.py):
- local: every compute node caches for itself, on its own data cache (role `node`);
- central: the storage node caches for the whole region under the cache volume it exports over NFS
  (role `region`), and the compute nodes read that export at their data cache mount (role `shared`):
  they never fetch, so an object is pulled once per region however many nodes use it.

An object removed from the store (an ended inference job's input, a removed dataset) is listed in `drop`
for a while: a node that caches for itself or for its region deletes its copy then, rather than when its
cache next needs room.

The control plane lists, for each node, the objects its region's live jobs use there; the node fetches
the ones it lacks (a `shared` node fetches none) and never evicts a listed one or one a worker of its own
mounts. It reports what it holds whole, what it is fetching and what waits for room, every beat."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import Field

from contracts.messages import ControlPlaneMessage, MinionMessage

DIGEST_PATTERN: Final = r"^sha256:[0-9a-f]{64}$"
MAX_REPORTED: Final = 10_000  # objects in one report: a cache of more lists its most recently used


class CacheRole(StrEnum):
    NODE = "node"  # a compute node of a local region: caches what its own workers mount
    REGION = "region"  # the storage node of a central region: caches for every node of the region
    SHARED = "shared"  # a compute node of a central region: reads the region's cache, fetches nothing


class WantedObject(ControlPlaneMessage):
    object_id: str = Field(min_length=1, max_length=32)
    digest: str = Field(pattern=DIGEST_PATTERN)
    size: int = Field(ge=0)
    name: str = Field("", max_length=128)  # for the node's messages


class ObjectsDesired(ControlPlaneMessage):
    role: CacheRole
    objects: list[WantedObject] = Field(default_factory=list)  # fetch these, and never evict them
    # removed since (an ended job's input, a removed dataset) and held by no live object: drop the copy
    # unless a worker here still mounts it
    drop: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)


class Fetching(MinionMessage):
    digest: str = Field(pattern=DIGEST_PATTERN)
    done: int = Field(ge=0)
    total: int = Field(ge=0)


class CacheWait(MinionMessage):
    digest: str = Field(pattern=DIGEST_PATTERN)
    reason: str = Field(max_length=1000)


class ObjectsActual(MinionMessage):
    role: CacheRole
    held: list[str] = Field(default_factory=list, max_length=MAX_REPORTED)  # digests held whole
    used_bytes: int = Field(0, ge=0)
    budget_bytes: int = Field(0, ge=0)  # the most the cache may hold (its volume, less a reserve)
    fetching: list[Fetching] = Field(default_factory=list, max_length=MAX_REPORTED)
    waiting: list[CacheWait] = Field(default_factory=list, max_length=MAX_REPORTED)  # no room, or failed
