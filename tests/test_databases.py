"""What each database backend promises a user: exact keys, claims that never wait, and a clear
refusal of a backend the store cannot run on."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import connections
from django.test import Client

from django_idempotency import signals
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import database
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


@contextlib.contextmanager
def _first_request_held(url: str, body: dict[str, Any], key: str) -> Iterator[list[Any]]:
    """The first request with `key`, on a thread (and a connection) of its own, held after its
    claim (uncommitted in atomic mode) until the block ends; yields the list its answer joins."""
    answers: list[Any] = []
    holding, done = threading.Event(), threading.Event()
    first = threading.current_thread

    def hold(**kwargs: Any) -> None:
        if first() is thread:
            holding.set()
            done.wait(30)

    def run_first() -> None:
        try:
            answers.append(post(Client(), url, body, key=key))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run_first)
    signals.claimed.connect(hold, dispatch_uid="held-first-request")
    thread.start()
    try:
        assert holding.wait(30)
        yield answers
    finally:
        done.set()
        thread.join()
        signals.claimed.disconnect(dispatch_uid="held-first-request")


def _timed(send: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    return send(), time.monotonic() - started


@pytest.mark.postgresql
def test_while_the_first_claim_is_uncommitted_a_duplicate_gets_409_and_another_request_422_at_once(
    settings: Any,
) -> None:
    # Atomic mode: the first request's claim is an uncommitted row nobody else can read. The
    # claim's advisory locks still tell a duplicate
    # from a different request with the key, at once, without waiting for the first to end.
    settings.IDEMPOTENCY_MODE = "atomic"
    with _first_request_held(URL, {"amount": 10}, "held") as first:
        duplicate, duplicate_took = _timed(lambda: post(Client(), URL, {"amount": 10}, key="held"))
        other, other_took = _timed(lambda: post(Client(), URL, {"amount": 99}, key="held"))

    assert_problem(duplicate, 409, "request-in-progress")
    assert_problem(other, 422, "key-reused")
    assert max(duplicate_took, other_took) < 2  # Answered, not queued behind the first.
    assert first[0].status_code == 201
    assert_problem(post(Client(), URL, {"amount": 99}, key="held"), 422, "key-reused")
    assert post(Client(), URL, {"amount": 10}, key="held")["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


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


def _max_allowed_packet() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        return int(cursor.fetchone()[0])


def _miss_the_first_size_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's size check lets the first statement through, as if it had been wrong: the
    server refuses it (1153, or a connection reset while it is still being sent)."""
    checks = iter([lambda connection, params: True])
    real = database.fits_in_a_packet
    monkeypatch.setattr(database, "fits_in_a_packet", lambda *args: next(checks, real)(*args))


@pytest.mark.mariadb
@pytest.mark.parametrize(
    ("mode", "checked", "encrypted"),
    [
        ("lease", True, False),
        ("atomic", True, False),
        ("lease", False, False),
        ("lease", True, True),
        ("lease", False, True),
    ],
    ids=[
        "lease-checked-before",
        "atomic-checked-before",
        "lease-refused-by-server",
        "encrypted-checked-before",
        "encrypted-refused-by-server",
    ],
)
def test_mariadb_a_body_larger_than_max_allowed_packet_is_kept_without_it_and_never_runs_twice(
    settings: Any, monkeypatch: pytest.MonkeyPatch, mode: str, checked: bool, encrypted: bool
) -> None:
    # With no limit of its own (IDEMPOTENCY_MAX_STORED_BYTES = None), a body the database
    # refuses for its size is stored as one over the limit: status and headers, and retries
    # get 410. The store checks the size before sending; were it to send anyway, MariaDB
    # refuses the statement and closes the connection: lease mode stores the outcome on a new
    # connection.
    settings.IDEMPOTENCY_MAX_STORED_BYTES = None
    settings.IDEMPOTENCY_MODE = mode
    settings.IDEMPOTENCY_LEASE = 30
    if encrypted:
        # Dropped from the sealed response, the body left an empty token, which no key opens:
        # retries were told the response was sealed with a retired key, not that it was big.
        settings.IDEMPOTENCY_ENCRYPTION_KEYS = [Fernet.generate_key()]
    if not checked:
        _miss_the_first_size_check(monkeypatch)
    size = _max_allowed_packet() + 1024 * 1024
    client = Client()
    headers = {"Idempotency-Key": "big", "X-Body-Bytes": str(size)}

    first, took = _timed(lambda: client.post("/sized/", headers=headers))
    retry = client.post("/sized/", headers=headers)

    assert first.status_code == 200
    assert len(first.content) == size
    assert took < 15  # Not retried until the lease ends.
    problem = assert_problem(retry, 410, "response-not-stored")
    assert f"({size} bytes)" in problem["detail"]
    assert Charge.objects.count() == 1
    (record,) = IdempotencyRecord.objects.all()
    assert record.status == "completed"
    assert encrypted or record.response_body == b""


@pytest.mark.mariadb
def test_mariadb_atomic_mode_refused_by_the_server_for_size_keeps_nothing_and_answers_503(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were the store's size check bypassed, atomic mode's transaction is lost with the
    # connection MariaDB closes: nothing was committed, the view's writes included, so the
    # client gets 503 and a retry runs the view again, which is correct.
    settings.IDEMPOTENCY_MAX_STORED_BYTES = None
    settings.IDEMPOTENCY_MODE = "atomic"
    _miss_the_first_size_check(monkeypatch)
    headers = {"Idempotency-Key": "big", "X-Body-Bytes": str(_max_allowed_packet() + 1)}

    response = Client().post("/sized/", headers=headers)

    assert_problem(response, 503, "store-unavailable")
    assert not Charge.objects.exists()
    assert not IdempotencyRecord.objects.exists()


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
