"""The node's object cache within its budget (minion/jobs/objects.py, docs/data.md "The regional cache"):
least recently used objects are evicted to make room, never one a worker mounts or one the control plane
lists for a live job; with no room the fetch waits and says why. A shared cache (a central region's
compute node) fetches nothing and sees what the storage node put there. Objects here are real manifests
and chunks of real files (contracts/object_tree.scan), served from memory as the control plane's node
routes serve them (tests/provisioner/test_regional_cache.py runs the same cache against the real routes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from contracts.object_cache import CacheRole, ObjectsActual
from contracts.object_tree import scan
from minion.jobs.cache_agent import CacheAgent, cache_root
from minion.jobs.mounts import bind_all
from minion.jobs.objects import CacheFull, ObjectCache, ObjectUnavailable
from minion.settings import ContainerSettings

MB = 10**6


class Served:
    """Objects by id: each a directory scanned into its manifest and chunks, counting the bytes sent."""

    def __init__(self) -> None:
        self.manifests: dict[str, bytes] = {}
        self.chunks: dict[str, bytes] = {}
        self.digests: dict[str, str] = {}
        self.sent = 0

    def add(self, root: Path, object_id: str, size: int) -> str:
        root.mkdir(parents=True)
        (root / "data.bin").write_bytes(object_id.encode()[:1] * size)
        scanned = scan(root)
        manifest = scanned.manifest
        self.manifests[object_id] = manifest.canonical()
        for entry in manifest.files:
            data = (root / entry.path).read_bytes()
            for i, sha in enumerate(entry.chunks):
                self.chunks[sha] = data[i * 8 * 2**20 : (i + 1) * 8 * 2**20]
        self.digests[object_id] = manifest.digest()
        return manifest.digest()

    def manifest(self, object_id: str) -> bytes:
        return self.manifests[object_id]

    def chunk(self, object_id: str, sha256: str) -> bytes:
        self.sent += len(self.chunks[sha256])
        return self.chunks[sha256]


@pytest.fixture
def served(tmp_path: Path) -> Served:
    s = Served()
    for name in ("a", "b", "c"):
        s.add(tmp_path / "src" / name, name, 10 * MB)
    return s


def _cache(tmp_path: Path, served: Served, **kw: object) -> ObjectCache:
    return ObjectCache(tmp_path / "cache", served, **({"budget_bytes": 25 * MB} | kw))  # type: ignore[arg-type]


def test_the_least_recently_used_object_makes_room(tmp_path: Path, served: Served) -> None:
    cache = _cache(tmp_path, served)
    a = cache.ensure("a", served.digests["a"])
    cache.ensure("b", served.digests["b"])
    time.sleep(0.01)
    cache.ensure("a", served.digests["a"])  # a is used again: b is now the oldest
    cache.ensure("c", served.digests["c"])
    assert cache.held() == sorted([served.digests["a"], served.digests["c"]])
    assert (a / "data.bin").stat().st_size == 10 * MB
    report = cache.report()
    assert report.used_bytes == 20 * MB and report.budget_bytes == 25 * MB
    assert not any(p.name.startswith(".evicted") for p in (tmp_path / "cache").iterdir())


def test_what_a_worker_mounts_or_a_live_job_uses_is_never_evicted(tmp_path: Path, served: Served) -> None:
    cache = _cache(tmp_path, served)
    cache.ensure("a", served.digests["a"])
    cache.ensure("b", served.digests["b"])
    cache.busy = lambda: {served.digests["a"]}
    cache.pinned = {served.digests["b"]}
    with pytest.raises(CacheFull, match="needs 10.0 MB, 5.0 MB is free of its 25.0 MB budget"):
        cache.ensure("c", served.digests["c"], name="imagenet")
    assert cache.held() == sorted([served.digests["a"], served.digests["b"]])
    waiting = cache.report().waiting
    assert [w.digest for w in waiting] == [served.digests["c"]] and "imagenet" in waiting[0].reason
    # once the job using b ends, b makes room and the wait is over
    cache.pinned = set()
    cache.ensure("c", served.digests["c"])
    assert cache.report().waiting == []
    assert served.digests["b"] not in cache.held()


def test_a_worker_waiting_for_room_is_told_why_and_nothing_stays_bound(
    tmp_path: Path, served: Served
) -> None:
    from contracts.jobs import Mount, MountSource

    cache = _cache(tmp_path, served, budget_bytes=5 * MB)
    mount = Mount(
        source_kind=MountSource.OBJECT,
        object_id="a",
        digest=served.digests["a"],
        name="cifar",
        target="/opt/ml/input",
        read_only=True,
    )
    worker = tmp_path / "worker"
    worker.mkdir()
    with pytest.raises(CacheFull, match="cifar needs"):
        bind_all([mount], worker, ContainerSettings(), {}, objects=cache)
    assert not (worker / "mounts").exists() or not any((worker / "mounts").iterdir())


def test_objects_removed_from_the_store_are_dropped_unless_a_worker_mounts_them(
    tmp_path: Path, served: Served
) -> None:
    cache = _cache(tmp_path, served, budget_bytes=100 * MB)
    for name in ("a", "b", "c"):
        cache.ensure(name, served.digests[name])
    cache.busy = lambda: {served.digests["a"]}
    cache.pinned = {served.digests["b"]}
    dropped = cache.drop({served.digests[n] for n in ("a", "b", "c")})
    assert dropped == [served.digests["c"]]
    assert cache.held() == sorted([served.digests["a"], served.digests["b"]])
    assert cache.report().used_bytes == 20 * MB


def test_a_shared_cache_fetches_nothing_and_sees_the_storage_nodes_objects(
    tmp_path: Path, served: Served
) -> None:
    region = ObjectCache(tmp_path / "export" / "objects", served, role=CacheRole.REGION)  # type: ignore[arg-type]
    shared = ObjectCache(tmp_path / "export" / "objects", served, role=CacheRole.SHARED)  # type: ignore[arg-type]
    with pytest.raises(ObjectUnavailable, match="not in the region's cache yet"):
        shared.ensure("a", served.digests["a"], name="cifar")
    assert served.sent == 0
    region.ensure("a", served.digests["a"])
    assert shared.ensure("a", served.digests["a"]) == region.path_of(served.digests["a"])
    assert shared.held() == [served.digests["a"]]
    assert served.sent == 10 * MB  # one copy, for both nodes


def test_the_agent_fetches_what_the_control_plane_lists_and_reports_it(
    tmp_path: Path, served: Served
) -> None:
    agent = CacheAgent(_cache(tmp_path, served))
    wanted = {
        "role": "region",
        "objects": [{"object_id": "a", "digest": served.digests["a"], "size": 10 * MB, "name": "cifar"}],
    }
    first = ObjectsActual.model_validate(agent.handle(wanted))
    assert first.role is CacheRole.REGION
    deadline = time.monotonic() + 30
    while served.digests["a"] not in ObjectsActual.model_validate(agent.handle(wanted)).held:
        assert time.monotonic() < deadline, "the listed object was never fetched"
        time.sleep(0.05)
    agent.handle(wanted)
    assert served.sent == 10 * MB  # listed on every beat, fetched once
    assert agent.cache.pinned == {served.digests["a"]}
    shared = CacheAgent(_cache(tmp_path / "other", served))
    assert ObjectsActual.model_validate(shared.handle({**wanted, "role": "shared"})).held == []
    time.sleep(0.2)
    assert served.sent == 10 * MB  # a shared cache never fetches
    agent.close()


def test_where_the_cache_lives_follows_the_nodes_storage_facts(tmp_path: Path) -> None:
    settings = ContainerSettings(cache_dir=Path("/data/cache"))
    state = tmp_path / "state"
    assert cache_root(settings, state, None) == state / "objects"
    assert cache_root(settings, state, {"role": "compute", "applied": False}) == state / "objects"
    assert cache_root(settings, state, {"role": "compute", "applied": True}) == Path("/data/cache/objects")
    storage = {"role": "storage", "applied": True, "export": {"path": "/scratch/cache"}}
    assert cache_root(settings, state, storage) == Path("/scratch/cache/objects")
    explicit = ContainerSettings(object_dir=tmp_path / "mine")
    assert cache_root(explicit, state, storage) == tmp_path / "mine"


def test_a_budget_that_is_not_a_size_is_refused() -> None:
    with pytest.raises(ValueError, match="RIGBASE_JOBS_OBJECT_CACHE_GB='lots'"):
        ContainerSettings.from_env({"RIGBASE_JOBS_OBJECT_CACHE_GB": "lots"})
    assert ContainerSettings.from_env({"RIGBASE_JOBS_OBJECT_CACHE_GB": "500"}).object_cache_gb == 500
