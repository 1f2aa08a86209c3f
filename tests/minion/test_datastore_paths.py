"""Job paths never leave the datastore root: string rules and real trees with symlinks (hypothesis)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.errors import InvalidInput, NotFound
from minion.datastores.paths import is_within, join_under_root, open_in_root, resolve_in_root

SEGMENTS = st.one_of(
    st.sampled_from(["..", ".", "", "a", "b", "sub", "etc", "..."]),
    st.text(alphabet="ab./\\\x00-_ ", max_size=6),
)
PATHS = st.one_of(
    st.lists(SEGMENTS, max_size=8).map("/".join),
    st.lists(SEGMENTS, max_size=8).map(lambda parts: "/" + "/".join(parts)),
    st.text(max_size=40),
)


def test_product_rules_example() -> None:
    """docs/product-rules.md "Datastores": root /dir2, a job asks for /subdir2."""
    assert join_under_root("/dir2", "/subdir2") == PurePosixPath("/dir2/subdir2")
    assert join_under_root("/dir2", "subdir2/") == PurePosixPath("/dir2/subdir2")
    assert join_under_root("/", "/dir1") == PurePosixPath("/dir1")
    assert join_under_root("/dir2", "/") == PurePosixPath("/dir2")


@pytest.mark.parametrize("requested", ["/../dir1", "..", "subdir2/../../dir1", "/a/b/../../..", "x\x00y"])
def test_escapes_are_refused_with_advice(requested: str) -> None:
    with pytest.raises(InvalidInput, match="datastore path"):
        join_under_root("/dir2", requested)


def test_root_must_be_absolute() -> None:
    with pytest.raises(InvalidInput, match="absolute"):
        join_under_root("dir2", "/x")


@given(root=PATHS, requested=PATHS)
def test_string_join_never_leaves_the_root(root: str, requested: str) -> None:
    try:
        result = join_under_root("/" + root, requested)
    except InvalidInput:
        return
    base = join_under_root("/" + root, "/")
    assert result == base or base in result.parents
    assert ".." not in result.parts and "\x00" not in str(result)


# -- real trees ----------------------------------------------------------------------------------

LINK_TARGETS = st.sampled_from(
    [
        "/",
        "..",
        "../..",
        "../../..",
        "/..",
        "/../..",
        "a",
        "/a",
        "b/../..",
        "../outside",
        "/../outside",
        "OUTSIDE",
        "OUTSIDE/secret",
        "/etc",
        "loop",
        "a/l0",
        "l1",
        ".",
        "a/../../..",
    ]
)
LINK_PLACES = st.sampled_from(["l0", "l1", "loop", "a/l0", "a/l1", "b/l0"])


def _build(base: Path, links: list[tuple[str, str]]) -> tuple[Path, Path]:
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret").write_text("must not be reachable")
    root = base / "root"
    for d in ("a", "b", "sub", "etc"):
        (root / d).mkdir(parents=True)
    (root / "sub" / "data").write_text("inside")
    for place, target in links:
        path = root / place
        if not path.exists() and not path.is_symlink():
            os.symlink(target.replace("OUTSIDE", str(outside)), path)
    return root, outside


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(links=st.lists(st.tuples(LINK_PLACES, LINK_TARGETS), max_size=6), requested=PATHS)
def test_real_tree_with_symlinks_never_leaves_the_root(links: list[tuple[str, str]], requested: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = _build(Path(tmp), links)
        try:
            fd, relative = open_in_root(root, requested)
        except (InvalidInput, NotFound):
            return
        try:
            # Ask the kernel where the descriptor really points: that is what a bind mount would expose.
            real = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        assert real == str(root) or real.startswith(f"{root}/"), (requested, links, real)
        assert ".." not in relative.parts
        assert is_within(root, root.joinpath(*relative.parts[1:]))


def test_absolute_symlink_is_rooted_in_the_datastore(tmp_path: Path) -> None:
    root, outside = _build(tmp_path, [("l0", "/etc"), ("l1", "OUTSIDE/secret"), ("loop", "loop")])
    assert resolve_in_root(root, "/l0") == root / "etc"  # not the node's /etc
    with pytest.raises(NotFound, match="does not exist in the datastore"):
        resolve_in_root(root, "/l1")  # the host path is looked up under the root, where it isn't
    with pytest.raises(InvalidInput, match="too many symbolic links"):
        resolve_in_root(root, "/loop")


def test_dotdot_in_a_symlink_stops_at_the_root(tmp_path: Path) -> None:
    root, _ = _build(tmp_path, [("a/l0", "../../../../outside")])
    with pytest.raises(NotFound):
        resolve_in_root(root, "/a/l0")  # ../../.. clamps at the root; root/outside does not exist
    assert resolve_in_root(root, "/sub") == root / "sub"
