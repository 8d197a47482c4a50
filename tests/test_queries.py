"""SQL statements the guard adds per request on PostgreSQL: fresh 2, replay 1 (budget 3 and 1)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from tests.utils import post

pytestmark = pytest.mark.postgresql

URL = "/viewset/charges/"


def _statements(client: Client, **kwargs: object) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = post(client, URL, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == 201
    return [query["sql"] for query in captured.captured_queries]


@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize(
    "transactional", [False, True], ids=["inside-caller-transaction", "own-transaction"]
)
def test_statements_added_to_fresh_and_replayed_requests(
    mode: str, transactional: bool, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("transactional_db" if transactional else "db")
    client = Client()
    with override_settings(IDEMPOTENCY_MODE=mode):
        without_key = _statements(client, key=None)
        fresh = _statements(client, key="fresh")
        replay = _statements(client, key="fresh")

    added = len(fresh) - len(without_key)
    assert added == 2, fresh  # The claim, then the stored response.
    assert len(replay) == 1, replay  # The claim statement finds and returns the record.
    assert not any("SAVEPOINT" in sql for sql in fresh)


def test_a_conflict_costs_at_most_two_statements(db: None) -> None:
    from tests.factories import IdempotencyRecordFactory
    from tests.utils import fingerprint_of

    IdempotencyRecordFactory(
        in_progress=True, key="busy", path=URL, fingerprint=fingerprint_of(URL, {"amount": 10})
    )
    with CaptureQueriesContext(connection) as captured:
        response = post(Client(), URL, key="busy")

    assert response.status_code == 409
    assert len(captured) <= 2


@override_settings(IDEMPOTENCY_MODE="atomic")
def test_atomic_requests_adds_no_savepoints(transactional_db: None) -> None:
    connection.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        client = Client()
        without_key = _statements(client, key=None)
        fresh = _statements(client, key="fresh")
    finally:
        connection.settings_dict["ATOMIC_REQUESTS"] = False

    assert len(fresh) - len(without_key) == 2
