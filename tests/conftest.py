"""Shared pytest configuration and fixtures."""

from __future__ import annotations

import pytest

from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, LoadedModel, load_pair


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "embedded: uses the real embedded model pair (converted once into the cache; slow on first use)",
    )


@pytest.fixture(scope="session")
def embedded_pair() -> tuple[LoadedModel, LoadedModel]:
    """The embedded (target, draft) pair in float32 on the CPU, loaded once per test session."""
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, dtype="float32", device="cpu")
    assert draft is not None
    return target, draft
