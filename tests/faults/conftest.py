from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.cluster import Cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """One PostgreSQL, Redis and model server for the fault suite (each test makes its
    own sessions and reads only those)."""
    started = Cluster()
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def workers(cluster: Cluster) -> Iterator[Cluster]:
    """The test supervises the workers; none outlive it."""
    try:
        yield cluster
    finally:
        cluster.stop_workers()
