"""Fixtures shared by the ledger tests: the throwaway PostgreSQL cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_cluster import PgCluster, PgClusterError


@pytest.fixture(scope="session")
def dsn() -> Iterator[str]:
    """A private PostgreSQL cluster (see ``pg_cluster``), started once per session.

    Only tests that ask for it start it: the SQLite tests run without a server.
    """
    try:
        cluster = PgCluster()
        started = cluster.start()
    except PgClusterError as exc:
        pytest.fail(f"cannot run the PostgreSQL ledger tests: {exc}")
    try:
        yield started
    finally:
        cluster.stop()
