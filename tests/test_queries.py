"""SQL the guard adds per request on PostgreSQL and MariaDB, locked by count.

Django logs transaction control (BEGIN, COMMIT) with the statements; they are counted apart:
atomic mode opens a transaction of its own only when no caller's transaction is open. Round
trips are counted in test_round_trips.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from django_idempotency import idempotent_function
from django_idempotency.steps import step
from django_idempotency.stores import get_store
from tests.factories import IdempotencyRecordFactory
from tests.utils import fingerprint_of, post

pytestmark = [pytest.mark.postgresql, pytest.mark.mariadb]

URL = "/viewset/charges/"
TRANSACTION_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK"}


@pytest.fixture(autouse=True)
def store_clock_read() -> None:
    """The store reads its database's clock once a minute, in whichever request comes first
    (see stores.clocks): read before counting, the counts are each request's own."""
    get_store().now()


def _run(client: Client, **kwargs: object) -> tuple[int, int]:
    """(statements, transaction-control commands) one request runs."""
    with CaptureQueriesContext(connection) as captured:
        response = post(client, URL, **kwargs)  # type: ignore[arg-type]
    assert response.status_code in (201, 409), response.content
    sql = [query["sql"] for query in captured.captured_queries]
    control = sum(statement in TRANSACTION_CONTROL for statement in sql)
    assert not any("SAVEPOINT" in statement for statement in sql)
    return len(sql) - control, control


def _added(mode: str) -> tuple[tuple[int, int], tuple[int, int]]:
    client = Client()
    with override_settings(IDEMPOTENCY_MODE=mode):
        plain = _run(client, key=None)
        fresh = _run(client, key="fresh")
        replay = _run(client, key="fresh")
    return (fresh[0] - plain[0], fresh[1] - plain[1]), replay


@pytest.mark.django_db(transaction=True)
def test_lease_mode_adds_three_statements_and_replays_in_one() -> None:
    fresh, replay = _added("lease")
    # The lookup (no record yet), the claim, then the stored response; each by itself.
    assert fresh == (3, 0)
    assert replay == (1, 0)  # The lookup finds and returns the record.


@pytest.mark.django_db(transaction=True)
def test_atomic_mode_in_its_own_transaction_adds_three_statements_and_begin_commit() -> None:
    fresh, replay = _added("atomic")
    assert fresh == (3, 2)
    assert replay == (1, 0)  # Answered before any transaction is opened.


@pytest.mark.django_db(transaction=True)
def test_atomic_mode_under_atomic_requests_adds_three_statements_and_no_savepoint(
    atomic_requests: None,
) -> None:
    fresh, replay = _added("atomic")
    assert fresh == (3, 0)  # The request's transaction is there with or without the guard.
    assert replay == (1, 2)  # The lookup, inside the request's own transaction.


@pytest.mark.django_db
def test_atomic_mode_inside_a_test_case_transaction_adds_three_statements() -> None:
    fresh, replay = _added("atomic")
    assert fresh == (3, 0)
    assert replay == (1, 0)


@pytest.mark.django_db(transaction=True)
def test_a_conflict_costs_one_statement() -> None:
    IdempotencyRecordFactory(
        in_progress=True, key="busy", path=URL, fingerprint=fingerprint_of(URL, {"amount": 10})
    )
    with override_settings(IDEMPOTENCY_MODE="lease"):
        assert _run(Client(), key="busy") == (1, 0)


def _noted(name: str) -> str:
    return name


@idempotent_function(key="key", payload=["key"], mode="lease")
def _with_steps(key: str, steps: int) -> int:
    for number in range(steps):
        step(f"step-{number}", _noted, "done")
    return steps


@pytest.mark.django_db(transaction=True)
def test_each_step_costs_one_statement() -> None:
    def statements(key: str, steps: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert _with_steps(key, steps) == steps
        return len(captured.captured_queries)

    without = statements("no-step", 0)

    assert statements("one-step", 1) == without + 1  # The step's result, one fenced UPDATE.
    assert statements("two-steps", 2) == without + 2
