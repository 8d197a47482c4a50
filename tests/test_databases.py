"""What each database backend promises a user: exact keys, claims that never wait, and a clear
refusal of a backend the store cannot run on."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from tests.models import Charge
from tests.utils import assert_problem, post

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/function/charges/"


@pytest.mark.parametrize("other", ["ABC", "aBc", "abc-"])
def test_keys_that_differ_only_in_case_or_one_character_are_different_keys(other: str) -> None:
    # MariaDB's default collations would make "abc" and "ABC" one key (its migration makes the
    # scope columns binary there): a client would get another request's response.
    first = post(Client(), URL, {"amount": 10}, key="abc")
    second = post(Client(), URL, {"amount": 20}, key=other)

    assert first.status_code == second.status_code == 201
    assert "Idempotent-Replayed" not in second
    assert sorted(Charge.objects.values_list("amount", flat=True)) == [10, 20]


@pytest.mark.mariadb
def test_mariadb_answers_a_claim_not_yet_committed_at_once_then_the_mismatch(
    settings: Any,
) -> None:
    # Atomic mode: the first request's claim is an uncommitted row. MariaDB cannot tell a
    # duplicate from another request then (docs/databases.md); both are told the key is in
    # progress while the first still runs, never held until it ends, and the other request
    # learns it reused the key once the first has committed.
    settings.IDEMPOTENCY_MODE = "atomic"
    slow = {"amount": 10, "sleep": 1.5}
    first: list[Any] = []
    claimed = threading.Event()

    def run_first() -> None:
        first.append(post(Client(), URL, slow, key="held"))
        connections.close_all()

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        claimed.wait(0.5)  # The first request holds its uncommitted claim by now.
        duplicate = post(Client(), URL, slow, key="held")
        other = post(Client(), URL, {"amount": 99}, key="held")
        answered_while_running = thread.is_alive()
    finally:
        thread.join()

    assert answered_while_running
    assert_problem(duplicate, 409, "request-in-progress")
    assert_problem(other, 409, "request-in-progress")
    assert first[0].status_code == 201
    assert_problem(post(Client(), URL, {"amount": 99}, key="held"), 422, "key-reused")
    assert post(Client(), URL, slow, key="held")["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def test_a_backend_the_store_cannot_run_on_is_500_and_the_log_names_it(
    settings: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With `manage.py check` skipped (E012 reports this at start-up), the first request still
    # fails loudly and says why, and the view does not run unguarded.
    legacy = {**connections["default"].settings_dict, "ENGINE": "django.db.backends.dummy"}
    monkeypatch.setitem(connections.settings, "legacy", legacy)
    settings.IDEMPOTENCY_DATABASE = "legacy"

    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        response = post(Client(), URL, {"amount": 10}, key="k")

    # A deployment error, not an outage: no Retry-After that would have clients retry for ever.
    assert_problem(response, 500, "store-misconfigured")
    assert "Retry-After" not in response
    [line] = [m for m in caplog.messages if "not unknown" in m]
    assert line.startswith(
        "Idempotency store unusable: The database store supports PostgreSQL, MariaDB and "
        "SQLite, not unknown (database 'legacy'): point IDEMPOTENCY_DATABASE at one of those."
    )
    assert not Charge.objects.exists()
