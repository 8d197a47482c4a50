"""Round trips to PostgreSQL the guard adds per request, counted from libpq's own protocol
trace: what the client waits for, whatever Django logs as statements (see test_queries)."""

from __future__ import annotations

import contextlib
import itertools
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings

from django_idempotency.stores import get_store
from tests.utils import post

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

URL = "/viewset/charges/"


@pytest.fixture(autouse=True)
def store_clock_read() -> None:
    """The store reads its database's clock once a minute, in whichever request comes first
    (see stores.clocks): read before counting, the counts are each request's own."""
    get_store().now()


@contextlib.contextmanager
def _round_trips() -> Iterator[list[int]]:
    """Count the client's round trips to PostgreSQL: each run of messages it sends (libpq's
    trace marks them F) that the server then answers (B)."""
    from psycopg import pq

    counted: list[int] = []
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield counted
        finally:
            pgconn.untrace()
        trace.seek(0)
        directions = [line[0] for line in trace if line[:1] in ("F", "B")]
    counted.append(sum(a == "F" and b == "B" for a, b in itertools.pairwise(directions)))


def _trips(client: Client, key: str | None) -> int:
    with _round_trips() as counted:
        response = post(client, URL, key=key)
    assert response.status_code == 201, response.content
    return counted[0]


@pytest.mark.parametrize(
    ("mode", "fresh", "replay"),
    [
        # The lookup, the claim, the completion: each its own round trip.
        ("lease", 3, 1),
        # The lookup; the claim with BEGIN; the completion with COMMIT. Beside the view's
        # own statement, which the plain view runs in autocommit.
        ("atomic", 3, 1),
    ],
)
def test_round_trips_the_guard_adds(mode: str, fresh: int, replay: int) -> None:
    client = Client()
    with override_settings(IDEMPOTENCY_MODE=mode):
        _trips(client, None)  # A warm connection: no connection set-up is counted.
        plain = _trips(client, None)
        assert (_trips(client, "fresh") - plain, _trips(client, "fresh")) == (fresh, replay)


def test_a_caller_transaction_keeps_its_own_begin_and_commit(atomic_requests: None) -> None:
    client = Client()
    with override_settings(IDEMPOTENCY_MODE="atomic"):
        _trips(client, None)
        plain = _trips(client, None)  # BEGIN, the view's statement, COMMIT.
        # The lookup, the claim, the completion: the request's transaction is not the guard's
        # to end, so its COMMIT goes on its own round trip, as without the guard. A replay runs
        # the lookup where the plain request ran the view's statement.
        assert (_trips(client, "fresh") - plain, _trips(client, "fresh") - plain) == (3, 0)


@pytest.fixture
def repeatable_read() -> Iterator[None]:
    """The connection at REPEATABLE READ, as DATABASES' OPTIONS "isolation_level" sets it."""
    from psycopg import IsolationLevel

    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["isolation_level"] = IsolationLevel.REPEATABLE_READ
    try:
        yield
    finally:
        del options["isolation_level"]
        connection.close()


@pytest.mark.usefixtures("repeatable_read")
def test_an_isolation_level_the_project_sets_keeps_psycopgs_own_begin() -> None:
    # psycopg's BEGIN carries the level (BEGIN ISOLATION LEVEL ...): the guard leaves it to
    # psycopg, on a round trip of its own, rather than open the transaction at the default.
    client = Client()
    levels: list[str] = []

    def level_of_the_views_insert(execute: Any, sql: str, *args: Any) -> Any:
        result = execute(sql, *args)
        if sql.startswith("INSERT INTO") and "charge" in sql:
            with connection.connection.cursor() as cursor:  # Inside the view's transaction.
                cursor.execute("SHOW transaction_isolation")
                levels.append(cursor.fetchone()[0])
        return result

    with override_settings(IDEMPOTENCY_MODE="atomic"):
        _trips(client, None)
        plain = _trips(client, None)
        fresh = _trips(client, "fresh")
        with connection.execute_wrapper(level_of_the_views_insert):
            post(client, URL, key="another")

    assert fresh - plain == 4
    assert levels == ["repeatable read"]
