"""Edges of the request flow: waiting for a running duplicate, other key headers, bad bodies."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import ProgrammingError, connection, connections
from django.test import Client, override_settings
from django.test.client import AsyncClient
from django.utils import timezone

from django_idempotency import idempotent
from django_idempotency.core.outcomes import Scope, StoredResponse
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import get_store
from tests.models import Charge
from tests.stores import hold
from tests.utils import assert_problem, post, terminate

URL = "/function/charges/"


@pytest.mark.django_db
@pytest.mark.usefixtures("store")
@override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=0.3)
def test_wait_gives_up_with_409_when_the_first_request_outlasts_the_timeout(
    client: Client,
) -> None:
    hold(Scope("default", "", "k"), URL, {"amount": 10})

    started = time.monotonic()
    response = post(client, URL, key="k")

    assert time.monotonic() - started >= 0.3
    assert_problem(response, 409, "request-in-progress")
    assert Charge.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("store")
@override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=10)
def test_wait_replays_the_result_once_the_first_request_completes() -> None:
    claim = hold(Scope("default", "", "k"), URL, {"amount": 10})

    def complete_soon() -> None:
        time.sleep(0.2)
        get_store().complete(claim, StoredResponse(201, [], b"first"), timezone.now())

    finisher = threading.Thread(target=complete_soon)
    finisher.start()
    response = post(Client(), URL, key="k")
    finisher.join()

    assert response.status_code == 201
    assert response.content == b"first"
    assert response["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 0


@pytest.mark.django_db
def test_the_key_can_come_from_another_header(rf: object) -> None:
    calls = []

    @idempotent(header="webhook-id")
    def receive(request: object) -> object:
        from django.http import HttpResponse

        calls.append(1)
        return HttpResponse(b"ok", status=202)

    from django.test import RequestFactory

    factory = RequestFactory()
    first = receive(factory.post("/hook/", b"{}", "application/json", headers={"webhook-id": "m1"}))
    retry = receive(factory.post("/hook/", b"{}", "application/json", headers={"webhook-id": "m1"}))

    assert first.status_code == retry.status_code == 202  # type: ignore[attr-defined]
    assert retry["Idempotent-Replayed"] == "true"  # type: ignore[index]
    assert len(calls) == 1
    assert IdempotencyRecord.objects.get().key == "m1"


@pytest.mark.django_db
@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_a_body_over_the_upload_limit_is_413_not_500(client: Client) -> None:
    response = post(client, URL, {"amount": 10, "padding": "x" * 500})

    assert_problem(response, 413, "request-too-large")
    assert Charge.objects.count() == 0


@pytest.mark.django_db
def test_a_malformed_multipart_body_is_400_not_500(client: Client) -> None:
    response = client.post(
        URL,
        b"--oops\r\nContent-Disposition: form-data; name=\r\n\r\nbroken",
        content_type="multipart/form-data; boundary=",
        headers={"Idempotency-Key": "k"},
    )

    assert_problem(response, 400, "malformed-request")
    assert not IdempotencyRecord.objects.exists()


# A forgotten `migrate`: a deployment error, not an outage. A 500 without Retry-After (a 503
# with one would have clients retry for ever), and the log gives the command.


@pytest.mark.usefixtures("records_table_missing")
@pytest.mark.parametrize("url", [URL, "/viewset/charges/"])
def test_a_missing_records_table_is_500_without_retry_after_and_the_log_says_run_migrate(
    client: Client, caplog: pytest.LogCaptureFixture, url: str
) -> None:
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        response = post(client, url)

    assert_problem(response, 500, "store-misconfigured")
    assert "Retry-After" not in response
    assert Charge.objects.count() == 0
    ours = [record for record in caplog.records if record.name == "django_idempotency"]
    assert [record.getMessage() for record in ours] == [
        "Idempotency store unusable: The table django_idempotency_record does not exist in the"
        " database 'default': run `python manage.py migrate django_idempotency`."
    ]


@pytest.mark.postgresql  # The others report a missing column as an OperationalError.
@pytest.mark.django_db(transaction=True)
def test_any_other_schema_error_is_raised_not_answered_as_an_outage(client: Client) -> None:
    # A column the store's statements name is gone (say, a hand-made change): a programming
    # error, raised with its traceback, not a 503 that would hide it.
    table = IdempotencyRecord._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME COLUMN fingerprint TO fingerprint_away")
    try:
        with pytest.raises(ProgrammingError, match="fingerprint"):
            post(client, URL)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} RENAME COLUMN fingerprint_away TO fingerprint")

    assert Charge.objects.count() == 0


@pytest.mark.usefixtures("database_down")
def test_an_unreachable_database_is_logged_as_unreachable(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        problem = assert_problem(post(client, URL), 503, "store-unavailable")

    assert problem["detail"] == (
        "The idempotency store cannot be reached, so the request was not run: retry later."
    )
    ours = [record for record in caplog.records if record.name == "django_idempotency"]
    [message] = [record.getMessage() for record in ours]
    # The database's own error follows, for the operator: not the template, not "None".
    why = message.removeprefix("Idempotency store unreachable: ")
    assert why != message
    assert why and why != "None" and "%s" not in why
    assert "migrate" not in caplog.text


# on_conflict="wait" in an async view: it waits on the event loop, not on Django's sync thread.


@pytest.mark.django_db(transaction=True)
@override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=5)
def test_an_async_duplicate_waits_without_blocking_the_shared_sync_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocking_sleeps: list[float] = []
    monkeypatch.setattr(time, "sleep", blocking_sleeps.append)

    async def scenario() -> tuple[Any, Any, int]:
        client = AsyncClient()
        body = json.dumps({"amount": 10, "async_sleep": 0.5})
        headers = {"Idempotency-Key": "async-wait"}

        def send() -> Any:
            return client.post("/async/charges/", body, "application/json", headers=headers)

        first = asyncio.ensure_future(send())
        await asyncio.sleep(0.15)  # The first request holds the key now.
        duplicate = asyncio.ensure_future(send())
        # A third coroutine keeps using the sync thread every other request needs.
        pings = 0
        while not duplicate.done():
            await sync_to_async(lambda: None)()
            pings += 1
            await asyncio.sleep(0.01)
        answers = await first, await duplicate
        await sync_to_async(connections.close_all)()  # The shared sync thread's connection.
        return *answers, pings

    first, duplicate, pings = asyncio.run(scenario())

    assert first.status_code == duplicate.status_code == 201
    assert duplicate["Idempotent-Replayed"] == "true"
    assert duplicate.content == first.content
    assert Charge.objects.count() == 1
    assert blocking_sleeps == []
    # The shared sync thread answered other calls while the duplicate waited: more than once (how
    # often depends on the machine's speed, which is no part of the test).
    assert pings >= 2


@pytest.mark.django_db(transaction=True)
@override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=5)
@pytest.mark.parametrize("first_request", ["completes", "fails"])
def test_an_async_duplicate_keeps_its_views_options_and_lease_mode_through_every_try(
    first_request: str,
) -> None:
    url = "/async-cbv/charges/"  # idempotency_namespace = "async-cbv"
    held = hold(Scope("async-cbv", "", "waited"), url, {"amount": 10})

    async def scenario() -> tuple[Any, bool]:
        waiting = asyncio.ensure_future(
            AsyncClient().post(
                url, {"amount": 10}, "application/json", headers={"Idempotency-Key": "waited"}
            )
        )
        await asyncio.sleep(0.3)  # It has tried at least once, and waits.
        store = get_store()
        if first_request == "completes":
            done = StoredResponse(201, [("Content-Type", "application/json")], b'{"held": true}')
            assert await sync_to_async(store.complete)(held, done, timezone.now())
        else:
            assert await sync_to_async(store.release)(held)
        response = await waiting
        in_transaction = await sync_to_async(lambda: connection.in_atomic_block)()
        await sync_to_async(connections.close_all)()
        return response, in_transaction

    response, in_transaction = asyncio.run(scenario())

    # Each try looks in its view's namespace and runs leased, as async views do: no try leaves
    # a transaction open behind it, and what the duplicate did is kept.
    assert not in_transaction
    if first_request == "completes":
        assert response["Idempotent-Replayed"] == "true"
        assert response.content == b'{"held": true}'
        assert Charge.objects.count() == 0
    else:
        assert response.status_code == 201
        assert "Idempotent-Replayed" not in response
        assert Charge.objects.count() == 1
        assert IdempotencyRecord.objects.get(namespace="async-cbv").status == "completed"


@pytest.mark.django_db(transaction=True)
def test_an_async_view_called_without_a_key_fails_as_it_would_unguarded() -> None:
    # No key, nothing claimed: the view's exception is the view's, with nothing to give back.
    send = async_to_sync(AsyncClient().post)

    with pytest.raises(RuntimeError, match="the view crashed after writing"):
        send("/async/charges/", {"amount": 10}, "application/json", headers={"X-Outcome": "raise"})

    assert Charge.objects.count() == 1
    assert not IdempotencyRecord.objects.exists()


def reads_the_stream(get_response: Any) -> Any:
    """A middleware that reads the body from the stream and keeps nothing."""

    def middleware(request: Any) -> Any:
        request.read()
        return get_response(request)

    return middleware


@pytest.mark.django_db
def test_a_body_a_middleware_read_away_counts_as_empty(settings: Any, client: Client) -> None:
    # The bytes are gone before the guard: nothing tells two such bodies apart, and the retry
    # is answered as the same request rather than failing.
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.test_guard.reads_the_stream"]

    first = post(client, "/answers/", {"amount": 10})  # A view that never reads the body.
    again = post(client, "/answers/", {"amount": 10})

    assert first.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def writes_then_fails(request: Any) -> str:
    """An owner resolver that writes (it records the visit), then fails on a live connection."""
    Charge.objects.create(reference="visit", amount=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    return "owner"


def writes_then_meets_a_dead_connection(request: Any) -> str:
    """An owner resolver that writes to one database, then reads from another."""
    Charge.objects.using("records").create(reference="visit", amount=0)
    return str(Charge.objects.count())


@pytest.mark.postgresql
@pytest.mark.mariadb
@pytest.mark.no_pooler
@pytest.mark.django_db(transaction=True, databases=["default", "records"])
def test_an_owner_resolver_is_not_run_again_for_a_dead_connection_it_did_not_fail_on(
    client: Client,
) -> None:
    records = connections["records"]
    records.ensure_connection()
    terminate(records)  # Dead, but the resolver's error comes from the live default one.
    try:
        with override_settings(IDEMPOTENCY_OWNER_RESOLVER=f"{__name__}.writes_then_fails"):
            response = post(client, URL, key="resolver-1")
    finally:
        records.close()

    assert_problem(response, 503, "store-unavailable")
    assert Charge.objects.filter(reference="visit").count() == 1


@pytest.mark.postgresql
@pytest.mark.mariadb
@pytest.mark.no_pooler
@pytest.mark.django_db(transaction=True, databases=["default", "records"])
def test_an_owner_resolver_is_not_run_again_once_one_of_its_statements_went_through(
    client: Client,
) -> None:
    post(client, "/unguarded/charges/", key=None)  # The default connection now exists; kept.
    terminate(connection)  # As a database restart does; the records database's is new.
    resolver = f"{__name__}.writes_then_meets_a_dead_connection"
    try:
        with override_settings(IDEMPOTENCY_OWNER_RESOLVER=resolver):
            response = post(client, URL, key="resolver-2")
    finally:
        connection.close()

    assert_problem(response, 503, "store-unavailable")
    assert Charge.objects.using("records").filter(reference="visit").count() == 1
