"""Fixtures the red-team tests share with the hardening suite (hosts booted once per module)."""

from tests.hardening.conftest import shared_hosts  # noqa: F401  (a fixture, by its name)
