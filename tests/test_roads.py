"""The roads an ordinary Django project takes: CSRF forms, PATCH bodies, lost races, restarts."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import DatabaseError, connection, connections
from django.db.backends.signals import connection_created
from django.http import HttpRequest
from django.test import Client, override_settings
from django.test.client import encode_multipart
from django.utils import timezone

from django_idempotency.core.keys import MAX_OWNER_LENGTH
from django_idempotency.core.outcomes import Scope
from django_idempotency.http import guard
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores.dialects import dialect_for
from tests.factories import IdempotencyRecordFactory, UserFactory
from tests.models import Charge
from tests.stores import hold
from tests.utils import (
    CSRF_TOKEN,
    asgi_post,
    assert_problem,
    fingerprint_of,
    logged_in_browser,
    lose_database,
    post,
    terminate,
)

pytestmark = pytest.mark.django_db(transaction=True)

FORMS = "/forms/charges/"
CSRF_MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
BOUNDARY = "BoUnDaRy"


@pytest.fixture
def csrf_client(settings: Any) -> Client:
    """A logged-in browser behind Django's CSRF middleware, holding its token."""
    settings.MIDDLEWARE = CSRF_MIDDLEWARE
    return logged_in_browser()


def send_form(
    client: Client,
    method: str,
    fields: dict[str, Any] | list[tuple[str, Any]],
    *,
    key: str = "form-1",
    multipart: bool = True,
    url: str = FORMS,
) -> Any:
    """A form the way a browser sends one: urlencoded or multipart, with the CSRF token."""
    pairs = list(fields.items()) if isinstance(fields, dict) else list(fields)
    pairs.append(("csrfmiddlewaretoken", CSRF_TOKEN))
    if multipart:
        data: dict[str, Any] = {}
        for name, value in pairs:
            data.setdefault(name, []).append(value)
        body = encode_multipart(BOUNDARY, data)
        content_type = f"multipart/form-data; boundary={BOUNDARY}"
    else:
        from urllib.parse import urlencode

        body = urlencode(pairs).encode()
        content_type = "application/x-www-form-urlencoded"
    return client.generic(
        method,
        url,
        body,
        content_type=content_type,
        headers={"Idempotency-Key": key, "X-CSRFToken": CSRF_TOKEN},
    )


# 1. Forms whose stream the CSRF middleware read first


@pytest.mark.parametrize("multipart", [True, False], ids=["multipart", "urlencoded"])
def test_a_form_behind_csrf_runs_once_and_replays(csrf_client: Client, multipart: bool) -> None:
    def fields() -> dict[str, Any]:
        if not multipart:
            return {"amount": "10"}
        return {"amount": "10", "receipt": SimpleUploadedFile("r.txt", b"receipt")}

    first = send_form(csrf_client, "POST", fields(), multipart=multipart)
    again = send_form(csrf_client, "POST", fields(), multipart=multipart)

    assert first.status_code == 201, first.content
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert Charge.objects.get().amount == 10


def test_a_form_behind_csrf_with_another_file_is_422(csrf_client: Client) -> None:
    send_form(csrf_client, "POST", {"amount": "10", "receipt": SimpleUploadedFile("r", b"one")})

    other = send_form(
        csrf_client, "POST", {"amount": "10", "receipt": SimpleUploadedFile("r", b"two")}
    )

    assert_problem(other, 422, "key-reused")
    assert Charge.objects.count() == 1


# 2. Every guarded method's body counts


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("multipart", [True, False], ids=["multipart", "urlencoded"])
def test_another_body_on_put_patch_delete_is_422(
    csrf_client: Client, method: str, multipart: bool
) -> None:
    first = send_form(csrf_client, method, {"status": "shipped"}, multipart=multipart)
    same = send_form(csrf_client, method, {"status": "shipped"}, multipart=multipart)
    other = send_form(csrf_client, method, {"status": "cancelled"}, multipart=multipart)

    assert first.status_code == 201, first.content
    assert same["Idempotent-Replayed"] == "true"
    assert_problem(other, 422, "key-reused")
    assert Charge.objects.count() == 1


def test_a_patch_files_count_too(csrf_client: Client) -> None:
    send_form(csrf_client, "PATCH", {"avatar": SimpleUploadedFile("a.png", b"one")})

    other = send_form(csrf_client, "PATCH", {"avatar": SimpleUploadedFile("a.png", b"two")})

    assert_problem(other, 422, "key-reused")


def test_a_new_multipart_boundary_is_the_same_patch(csrf_client: Client) -> None:
    body = {"status": "shipped", "csrfmiddlewaretoken": CSRF_TOKEN}
    headers = {"Idempotency-Key": "form-1", "X-CSRFToken": CSRF_TOKEN}
    for boundary in ("first-boundary", "second-boundary"):
        response = csrf_client.generic(
            "PATCH",
            FORMS,
            encode_multipart(boundary, body),
            content_type=f"multipart/form-data; boundary={boundary}",
            headers=headers,
        )
        assert response.status_code == 201

    assert response["Idempotent-Replayed"] == "true"


def test_the_order_of_a_repeated_fields_values_counts(csrf_client: Client) -> None:
    send_form(csrf_client, "POST", [("to", "alice"), ("to", "mallory")], multipart=False)

    other = send_form(csrf_client, "POST", [("to", "mallory"), ("to", "alice")], multipart=False)

    assert_problem(other, 422, "key-reused")


# The replay is the original's, for the original's method and path only


@pytest.mark.parametrize("fingerprint", ["tests.test_roads.constant_fingerprint", None])
def test_another_path_or_method_never_gets_the_replay(settings: Any, fingerprint: Any) -> None:
    if fingerprint:  # Even a fingerprint that calls every request the same.
        settings.IDEMPOTENCY_FINGERPRINT = fingerprint
    client = Client()
    post(client, "/function/charges/")

    assert_problem(post(client, "/cbv/charges/"), 422, "key-reused")
    put = client.put(
        "/function/charges/", "{}", "application/json", headers={"Idempotency-Key": "key-1"}
    )
    assert_problem(put, 422, "key-reused")
    assert Charge.objects.count() == 1


def constant_fingerprint(request: HttpRequest) -> str:
    return "0" * 64


@pytest.mark.parametrize(
    "answer", ["204", "200 Fine Indeed", "202 Queued", "200 empty"], ids=lambda a: a.lower()
)
@override_settings(MIDDLEWARE=[])  # CommonMiddleware would add a Content-Length to both.
def test_a_replay_is_the_original_status_line_and_length(
    answer: str, store_mode: tuple[str, str]
) -> None:
    # From every store, in each of its modes. (pytest-django's `settings` fixture would undo the
    # store's settings out of order at teardown, leaving the store configured for later tests.)
    client = Client()
    headers = {"Idempotency-Key": "answer-1", "X-Answer": answer.removesuffix(" empty")}
    if answer.endswith(" empty"):
        headers["X-Empty"] = "1"
    first = client.post("/answers/", headers=headers)
    again = client.post("/answers/", headers=headers)

    assert again["Idempotent-Replayed"] == "true"
    assert (again.status_code, again.reason_phrase) == (first.status_code, first.reason_phrase)
    assert again.content == first.content
    if answer == "204":
        assert "Content-Length" not in again
    else:
        assert again["Content-Length"] == str(len(first.content))
    assert Charge.objects.count() == 1


# 3. USE_TZ = False (the whole suite also runs that way: USE_TZ=0)


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_without_time_zones_replays_expiry_and_purge_work(settings: Any, mode: str) -> None:
    settings.USE_TZ = False
    settings.IDEMPOTENCY_MODE = mode
    client = Client()
    first = post(client, "/function/charges/")
    again = post(client, "/function/charges/")
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content

    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert "Idempotent-Replayed" not in post(client, "/function/charges/")
    assert Charge.objects.count() == 2

    from django_idempotency.purge import purge_expired_records

    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert purge_expired_records().total == 1


# 3b. A database kept in local time (DATABASES[alias]["TIME_ZONE"], on SQLite and MariaDB)


@pytest.fixture(params=["America/New_York", "Asia/Tokyo"])
def database_in_local_time(request: pytest.FixtureRequest) -> Iterator[str]:
    """The default database keeps its datetimes in this time zone, as a legacy one may."""
    with override_settings(USE_TZ=True):  # Django refuses it without USE_TZ.
        connection.settings_dict["TIME_ZONE"] = request.param
        _forget_time_zone()
        try:
            yield request.param
        finally:
            connection.settings_dict["TIME_ZONE"] = None
            _forget_time_zone()


def _forget_time_zone() -> None:
    for cached in ("timezone", "timezone_name"):
        connection.__dict__.pop(cached, None)


@pytest.mark.sqlite  # PostgreSQL keeps time zones itself: Django refuses a TIME_ZONE for it.
@pytest.mark.mariadb
def test_a_database_in_local_time_replays_holds_and_expires_keys(
    database_in_local_time: str,
) -> None:
    # The store writes its times in the database's time zone, as the ORM does; read back as
    # UTC they would be hours off (east of UTC, a record replayed hours after it expired).
    url, client = "/function/charges/", Client()
    first = post(client, url)
    again = post(client, url)
    hold(Scope("default", "", "held"), url, {"amount": 10})
    busy = post(client, url, key="held")
    IdempotencyRecord.objects.filter(key="key-1").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    after_expiry = post(client, url)

    assert (first.status_code, again["Idempotent-Replayed"]) == (201, "true")
    assert_problem(busy, 409, "request-in-progress")
    assert after_expiry.status_code == 201
    assert "Idempotent-Replayed" not in after_expiry
    assert Charge.objects.count() == 2


# 4. A take-over that loses its race


@pytest.fixture
def before_take_over() -> Iterator[Callable[[Callable[[Any], None]], None]]:
    """Run `act(cursor)` on the database just before the store's take-over UPDATE is sent: what
    a purge or another retry, committing in between, leaves for that UPDATE to find."""
    acts: list[Callable[[Any], None]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        update = sql.removeprefix(dialect_for(connection).no_wait).startswith("UPDATE")
        if update and "lease_token" in sql and acts:
            acts.pop()(context["cursor"])
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield acts.append


@pytest.mark.parametrize("mode", ["atomic", "lease"])
@pytest.mark.parametrize("rival", ["purge", "retry"])
def test_a_lost_take_over_never_replays_the_old_response(
    settings: Any, before_take_over: Any, mode: str, rival: str
) -> None:
    settings.IDEMPOTENCY_MODE = mode
    record = IdempotencyRecordFactory(
        key="key-1",
        path="/function/charges/",
        fingerprint=fingerprint_of("/function/charges/", {"amount": 10}),
        expires_at=timezone.now() - timedelta(seconds=1),
        response_body=b'{"old": true}',
    )
    table = IdempotencyRecord._meta.db_table
    if rival == "purge":
        before_take_over(lambda cursor: cursor.execute(f"DELETE FROM {table}"))
    else:  # Another retry took the key over and is running now.
        later = timezone.now() + timedelta(seconds=60)
        before_take_over(
            lambda cursor: IdempotencyRecord.objects.filter(pk=record.pk).update(
                status="in_progress", lease_token="rival", lease_expires_at=later, expires_at=later
            )
        )

    response = post(Client(), "/function/charges/")

    assert_problem(response, 409, "request-in-progress")
    assert b"old" not in response.content
    assert Charge.objects.count() == 0


# 5. A TTL shorter than the lease


def test_a_live_lease_past_its_expiry_is_never_taken_over() -> None:
    url = "/function/charges/"
    IdempotencyRecordFactory(
        in_progress=True,
        key="key-1",
        path=url,
        fingerprint=fingerprint_of(url, {"amount": 10}),
        expires_at=timezone.now() - timedelta(seconds=1),
    )

    assert_problem(post(Client(), url), 409, "request-in-progress")
    assert Charge.objects.count() == 0


# 6. SQLite in IMMEDIATE transaction mode


@pytest.mark.sqlite
def test_sqlite_immediate_mode_answers_a_busy_writer_with_409() -> None:
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    options.update(transaction_mode="IMMEDIATE", timeout=0.2)
    connection.close()
    holding, done = threading.Event(), threading.Event()

    def hold_the_writer() -> None:
        from django.db import transaction

        with transaction.atomic():
            Charge.objects.create(reference="elsewhere", amount=1)
            holding.set()
            done.wait(10)
        connections.close_all()

    thread = threading.Thread(target=hold_the_writer)
    thread.start()
    try:
        holding.wait(10)
        response = post(Client(), "/function/charges/")
    finally:
        done.set()
        thread.join()
        options.clear()
        options.update(saved)
        connection.close()

    assert_problem(response, 409, "request-in-progress")


@pytest.mark.sqlite
def test_sqlite_locked_even_for_reading_answers_409_then_serves_the_retry() -> None:
    # Another process holds the database file exclusively (a VACUUM, a backup): even the
    # guard's first read waits for it. Busy is not lost: 409, and the retry goes through.
    import sqlite3

    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    options.update(timeout=0.2)
    connection.close()
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        try:
            response = post(Client(), "/function/charges/")
        finally:
            other.execute("ROLLBACK")
        retry = post(Client(), "/function/charges/")
    finally:
        other.close()
        options.clear()
        options.update(saved)
        connection.close()

    assert_problem(response, 409, "request-in-progress")
    assert retry.status_code == 201
    assert Charge.objects.count() == 1


# 7. PostgreSQL restarted under CONN_MAX_AGE


@pytest.mark.postgresql
@pytest.mark.mariadb
@pytest.mark.no_pooler  # Behind PgBouncer: test_pgbouncer's restart test.
@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_a_dead_persistent_connection_is_replaced_before_the_guard_answers(
    settings: Any, mode: str
) -> None:
    settings.IDEMPOTENCY_MODE = mode
    client = Client()
    post(client, "/function/charges/", key="warm-up")  # The connection now exists; kept open.
    terminate(connection)  # What a database restart does to every connection it had.

    response = post(client, "/function/charges/", key="after-restart")

    assert response.status_code == 201, response.content
    assert Charge.objects.filter(reference="after-restart").count() == 1


# 8. An async view whose client disconnects


def test_a_cancelled_async_view_runs_to_its_end_and_the_retry_replays() -> None:
    from django.core.handlers.asgi import ASGIHandler

    async def scenario() -> tuple[list[Any], Any]:
        handler = ASGIHandler()
        scope = asgi_post("/async/charges/", "gone-1")
        body = json.dumps({"amount": 10, "async_sleep": 0.5}).encode()
        sent: list[Any] = []
        # The client sends its request, then goes away while the view sleeps: once its key is
        # claimed (a client gone before that leaves nothing to finish, on a loaded machine).
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        records = IdempotencyRecord.objects.filter(key="gone-1")

        async def wait_for(found: Any) -> None:
            deadline = time.monotonic() + 30  # Generous: a loaded machine is not a failure.
            while not await sync_to_async(found.exists)() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

        async def receive() -> Any:
            if messages:
                return messages.pop()
            await wait_for(records)
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(message)

        await handler(scope, receive, send)
        await wait_for(records.filter(status="completed"))  # The shielded view goes on.
        deadline = time.monotonic() + 30
        while guard._detached and time.monotonic() < deadline:  # Its task ends just after.
            await asyncio.sleep(0.01)
        # This test's own waits ran on asgiref's shared sync thread: close their connection.
        await sync_to_async(connections.close_all)()
        return sent, None

    opened: list[Any] = []

    def note(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(connection)

    connection_created.connect(note)
    try:
        sent, _ = asyncio.run(scenario())
    finally:
        connection_created.disconnect(note)

    assert not any(m["type"] == "http.response.start" for m in sent)  # Nobody was answered.
    assert not guard._detached  # Held while it ran, and let go once it ended.
    # Django closed the request's connections when it learnt the client had left; the view
    # went on past that on a thread of its own, and closed the connection it used there too.
    assert opened and [c for c in opened if c.connection is not None] == []
    assert Charge.objects.count() == 1
    again = post(Client(), "/async/charges/", {"amount": 10, "async_sleep": 0.5}, key="gone-1")
    assert again["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


# 9. Another request while the first still runs, in atomic mode


@pytest.mark.postgresql
@pytest.mark.parametrize("on_conflict", ["reject", "wait"])
def test_another_request_while_the_first_runs_is_422_at_once(
    settings: Any, on_conflict: str
) -> None:
    settings.IDEMPOTENCY_MODE = "atomic"
    settings.IDEMPOTENCY_ON_CONFLICT = on_conflict
    slow = {"amount": 10, "sleep": 1.5}
    first: list[Any] = []
    thread = threading.Thread(
        target=lambda: (
            first.append(post(Client(), "/function/charges/", slow)),
            connections.close_all(),
        )
    )
    thread.start()
    time.sleep(0.5)  # The first request holds its uncommitted claim now.
    try:
        started = time.monotonic()
        other = post(Client(), "/function/charges/", {"amount": 99})
        waited = time.monotonic() - started
        same = post(Client(), "/function/charges/", slow) if on_conflict == "reject" else None
    finally:
        thread.join()

    assert_problem(other, 422, "key-reused")
    assert waited < 1.0  # Answered at once, not after the first request finished.
    if same is not None:
        assert_problem(same, 409, "request-in-progress")
    assert first[0].status_code == 201
    assert Charge.objects.count() == 1


# 10. The database lost before the view runs, on a plain view with a session


def test_a_lost_database_while_loading_the_session_user_is_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Client()
    client.force_login(UserFactory())
    original = lose_database(connection)
    try:
        with caplog.at_level(logging.ERROR, logger="django_idempotency"):
            lost = post(client, FORMS)
    finally:
        connection.close()
        connection.settings_dict.update(original)

    assert_problem(lost, 503, "store-unavailable")
    [logged] = [r for r in caplog.records if r.name == "django_idempotency"]
    [error] = logged.args
    assert isinstance(error, DatabaseError)  # The database's own error, in its words:
    assert logged.getMessage() == f"The request's owner could not be loaded: {error}"
    assert post(client, FORMS).status_code == 201  # Back: the key runs, once.
    assert Charge.objects.count() == 1


# Hostile or unusual input: a clear problem+json, never a 500


def test_json_nested_too_deeply_is_400() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    response = Client().post(
        "/function/charges/", body, "application/json", headers={"Idempotency-Key": "deep"}
    )

    assert_problem(response, 400, "malformed-request")


def test_too_many_form_fields_is_400(settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    fields = "&".join(f"f{number}=1" for number in range(10))
    response = Client().post(
        FORMS, fields, "application/x-www-form-urlencoded", headers={"Idempotency-Key": "many"}
    )

    problem = assert_problem(response, 400, "malformed-request")
    assert problem["detail"] == (
        "The request has more form fields than the server accepts: send fewer."
    )


def test_a_body_over_the_upload_limit_is_413(settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10
    response = post(Client(), "/function/charges/", {"note": "x" * 100})

    problem = assert_problem(response, 413, "request-too-large")
    assert problem["detail"] == "The request body exceeds the server's upload limit."


@pytest.mark.parametrize("joined", ["k1,k2", "k1, k2"])
def test_repeated_key_headers_are_400(joined: str) -> None:
    # WSGI and ASGI servers join repeated headers with commas.
    response = post(Client(), "/function/charges/", key=joined)

    assert_problem(response, 400, "invalid-key")
    assert Charge.objects.count() == 0


@pytest.mark.parametrize("tenant", ["t" * (MAX_OWNER_LENGTH + 1), "acme\x00"])
def test_an_owner_the_column_cannot_hold_is_400(settings: Any, tenant: str) -> None:
    settings.IDEMPOTENCY_OWNER_RESOLVER = "tests.test_roads.tenant_owner"

    response = post(Client(), "/function/charges/", **{"X-Tenant": tenant})

    assert_problem(response, 400, "invalid-owner")
    assert IdempotencyRecord.objects.count() == 0


def test_an_owner_of_exactly_the_columns_length_is_kept(settings: Any) -> None:
    settings.IDEMPOTENCY_OWNER_RESOLVER = "tests.test_roads.tenant_owner"
    tenant = "t" * MAX_OWNER_LENGTH

    first = post(Client(), "/function/charges/", **{"X-Tenant": tenant})
    again = post(Client(), "/function/charges/", **{"X-Tenant": tenant})

    assert first.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert IdempotencyRecord.objects.get().owner == tenant


def tenant_owner(request: HttpRequest) -> str:
    return request.META.get("HTTP_X_TENANT", "")


@pytest.mark.postgresql
@pytest.mark.parametrize("mode", ["lease", "atomic"])
def test_a_result_the_store_refuses_is_kept_as_not_stored_and_never_run_again(
    settings: Any, mode: str
) -> None:
    # PostgreSQL's jsonb holds no NUL character. The key was given back (lease mode: each retry
    # ran the view again) or the request answered 500 (atomic mode); the store now refuses the
    # value before writing, and the claim keeps that the view ran (tests/test_unstorable.py).
    settings.IDEMPOTENCY_MODE = mode
    headers = {"Idempotency-Key": f"nul-{mode}", "X-Tag": "a\x00b"}
    client = Client(raise_request_exception=False)

    first = client.post("/answers/", headers=headers)
    retry = client.post("/answers/", headers=headers)

    assert first.status_code == 200
    (record,) = IdempotencyRecord.objects.all()
    assert record.status == "completed"
    assert_problem(retry, 410, "response-not-stored")
    assert Charge.objects.count() == 1  # The view's write is kept, and was made once.


def test_a_form_too_large_for_drfs_csrf_check_is_413(settings: Any) -> None:
    # SessionAuthentication's CSRF check reads the form before the guard runs.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    client = logged_in_browser()

    response = send_form(client, "POST", {"note": "x" * 500}, url="/viewset/charges/")

    assert_problem(response, 413, "request-too-large")
    assert Charge.objects.count() == 0
