"""Fixtures shared by the adversarial server tests."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest


@pytest.fixture
def enough_fds() -> Iterator[None]:
    """Room for a thousand client sockets (and the daemon's, which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
