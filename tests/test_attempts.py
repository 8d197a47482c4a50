"""One claim from begin to complete: its log lines, a lease outlived, a store lost at the end."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.test.client import AsyncClient
from django.urls import path

from django_idempotency import idempotent
from django_idempotency.attempts import current_attempt
from django_idempotency.models import IdempotencyRecord
from tests.models import Charge
from tests.utils import assert_problem, lose_database, post, terminate
from tests.views import async_view, function_view

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

URL = "/charges/"
LOST = "/charges/then-the-database-is-lost/"
KILLED = "/charges/then-the-connection-is-killed/"
KILLED_MID_VIEW = "/charges/then-a-query-on-a-killed-connection/"
ASYNC_LOST = "/async/charges/then-the-database-is-lost/"


@idempotent
def charge_then_lose_the_database(request: HttpRequest) -> HttpResponse:
    """The work is done, then the database goes away before the response is stored."""
    created = Charge.objects.create(reference="lost", amount=10)
    lose_database(connection)
    return JsonResponse({"id": created.pk}, status=201)


@idempotent
def charge_then_lose_the_connection(request: HttpRequest) -> HttpResponse:
    """The work is done, then the server ends this request's connection (a restart, a kill)."""
    created = Charge.objects.create(reference="killed", amount=10)
    terminate(connection)
    return JsonResponse({"id": created.pk}, status=201)


@idempotent
def charge_then_query_a_lost_connection(request: HttpRequest) -> HttpResponse:
    """The server ends this request's connection between two of the view's own queries."""
    Charge.objects.create(reference="killed", amount=10)
    terminate(connection)
    return JsonResponse({"charges": Charge.objects.count()}, status=201)


@idempotent
async def charge_then_fail_on_a_lost_database(request: HttpRequest) -> HttpResponse:
    """An async view whose work loses the database, then fails on its next query."""

    def work() -> int:
        Charge.objects.create(reference="lost", amount=10)
        lose_database(connection)
        return Charge.objects.count()

    return JsonResponse({"charges": await sync_to_async(work)()}, status=201)


urlpatterns = [
    path(URL.lstrip("/"), function_view),
    path(LOST.lstrip("/"), charge_then_lose_the_database),
    path(KILLED.lstrip("/"), charge_then_lose_the_connection),
    path(KILLED_MID_VIEW.lstrip("/"), charge_then_query_a_lost_connection),
    path(ASYNC_LOST.lstrip("/"), charge_then_fail_on_a_lost_database),
    path("async/charges/", async_view),
]


@pytest.mark.parametrize("url", [URL, "/async/charges/"])
def test_a_served_request_leaves_its_thread_outside_any_operation(url: str) -> None:
    """A WSGI thread serves request after request: an attempt left current after one would
    hand its scope to the next request's outbound keys (an async view ends its claim in a task of
    its own, whose context the thread does not share)."""
    first = post(Client(), url, key="thread-1")
    assert current_attempt() is None
    retry = post(Client(), url, key="thread-1")

    assert first.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert current_attempt() is None


@pytest.fixture
def restore_database() -> Iterator[Callable[[], None]]:
    """Undo whatever a view did to the default connection's settings (at the latest after the
    test): call it to look at the database again."""
    original = dict(connection.settings_dict)

    def restore() -> None:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)

    try:
        yield restore
    finally:
        restore()


def test_each_outcome_is_logged_at_info_with_a_hash_of_the_key_never_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client()
    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        post(client, URL, key="secret-key-1")
        post(client, URL, key="secret-key-1")
        post(client, URL, {"amount": 99}, key="secret-key-1")

    key_hash = hashlib.sha256(b"secret-key-1").hexdigest()[:16]
    records = [r for r in caplog.records if r.getMessage().startswith("idempotency ")]
    outcomes = [getattr(r, "idempotency_outcome", None) for r in records]
    # One record per outcome, named as its signal (and the metrics' label): the claim, its
    # completion, the replay, the other request's 422.
    assert outcomes == ["claimed", "completed", "replayed", "mismatch"]
    for record, outcome in zip(records, outcomes, strict=True):
        assert record.getMessage() == f"idempotency {outcome} namespace=default key_hash={key_hash}"
        assert getattr(record, "idempotency_namespace", None) == "default"
        assert getattr(record, "idempotency_key_hash", None) == key_hash
    assert "secret-key-1" not in caplog.text


# Without renewal, as in a process that stalled whole (its heartbeat too) past the lease.
@override_settings(IDEMPOTENCY_MODE="lease", IDEMPOTENCY_LEASE=0.3, IDEMPOTENCY_LEASE_RENEWAL=False)
def test_a_request_that_outlives_its_lease_keeps_its_answer_but_the_retrys_is_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = {"amount": 10, "sleep": 0.8}  # Longer than the lease.
    responses: dict[str, Any] = {}

    def first_request() -> None:
        try:
            responses["first"] = post(Client(), URL, body)
        finally:
            connections.close_all()  # This thread's own connection.

    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        first = threading.Thread(target=first_request)
        first.start()
        time.sleep(0.5)  # The first request still runs; its lease has run out.
        responses["retry"] = post(Client(), URL, body)
        first.join()
        replay = post(Client(), URL, body)

    first_id, retry_id = (responses[name].json()["id"] for name in ("first", "retry"))
    assert responses["first"].status_code == responses["retry"].status_code == 201
    assert first_id != retry_id  # The retry took the key over and ran the work again.
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == retry_id
    assert Charge.objects.count() == 2
    [warning] = [r for r in caplog.records if "lease expired" in r.getMessage()]
    assert "this result was not stored. Raise IDEMPOTENCY_LEASE" in warning.getMessage()


@override_settings(IDEMPOTENCY_MODE="lease", IDEMPOTENCY_LEASE=0.3)
def test_lease_mode_answers_the_work_done_when_the_database_is_lost_before_storing_it(
    restore_database: Callable[[], None], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        response = post(Client(), LOST)
    restore_database()

    # The work is done and cannot be undone: the client gets its answer. Storing it was tried
    # again until the lease ended, then given up; the claim ends with its lease.
    assert response.status_code == 201
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("The store is unreachable; retrying to store the") for m in messages)
    assert any(m.startswith("The response could not be stored: ") for m in messages)
    assert Charge.objects.filter(reference="lost").count() == 1
    assert IdempotencyRecord.objects.get().status == "in_progress"


@pytest.mark.postgresql
@pytest.mark.mariadb
@pytest.mark.parametrize("url", [KILLED, KILLED_MID_VIEW], ids=["before-storing", "mid-view"])
@override_settings(IDEMPOTENCY_MODE="atomic")
def test_atomic_mode_answers_503_and_keeps_nothing_when_the_connection_dies(url: str) -> None:
    response = post(Client(), url)

    # The view's writes were in the transaction the server ended: nothing happened, and no
    # claim is left to hold off the client's retry.
    assert_problem(response, 503, "store-unavailable")
    assert Charge.objects.count() == 0
    assert IdempotencyRecord.objects.count() == 0


def test_an_async_view_failing_with_its_store_lost_is_503_and_its_claim_ends_with_its_lease(
    restore_database: Callable[[], None], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        response = async_to_sync(AsyncClient().post)(
            ASYNC_LOST, {"amount": 10}, "application/json", headers={"Idempotency-Key": "k"}
        )
    restore_database()

    # The view failed because the database went away, which also kept the key from being given
    # back: answered as a lost store. The claim holds the key until its lease ends.
    assert_problem(response, 503, "store-unavailable")
    [logged] = [
        r for r in caplog.records if r.getMessage().startswith("The view failed while the ")
    ]
    assert logged.getMessage() == "The view failed while the idempotency store was unreachable"
    assert logged.exc_info is not None  # With the view's traceback, for the operator.
    assert Charge.objects.filter(reference="lost").count() == 1
    assert IdempotencyRecord.objects.get().status == "in_progress"
