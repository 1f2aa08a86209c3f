"""Shared pytest configuration. Fixtures for each real component live in tests/fixtures/<component>.py."""

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.control_plane",
    "tests.fixtures.swtpm",
    "tests.fixtures.netns",
    "tests.fixtures.umockdev",
    "tests.fixtures.gcp",
    "tests.fixtures.s3",
    "tests.fixtures.azurite",
    "tests.fixtures.leftovers",
]
