"""The database store behind PgBouncer in transaction pooling: prepared statements only where the
project allows them, and no advisory lock held past its transaction (docs/databases.md)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path

import django_idempotency
from django_idempotency import idempotent
from django_idempotency.core.outcomes import Outcome, Scope, StoredResponse
from django_idempotency.stores.database import DatabaseStore
from django_idempotency.stores.statements import prepares
from tests.models import Charge
from tests.stores import claim_request
from tests.utils import post

# The store's statements read or write this table; no other statement of a test does here.
RECORDS = "django_idempotency_record"


@contextmanager
def project_connection(
    *, prepare_threshold: int | None, pooler: bool
) -> Iterator[BaseDatabaseWrapper]:
    """This thread's default connection, opened as a project would open it with psycopg's
    `prepare_threshold` in OPTIONS (None is Django's default: no prepared statements) and
    DISABLE_SERVER_SIDE_CURSORS (Django's setting for a pooler in transaction mode) set to
    `pooler`; the test's own connection is put back afterwards."""
    original = connections["default"]
    wrapper = connections.create_connection("default")
    wrapper.settings_dict = copy.deepcopy(wrapper.settings_dict)
    wrapper.settings_dict["OPTIONS"]["prepare_threshold"] = prepare_threshold
    wrapper.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = pooler
    connections["default"] = wrapper
    try:
        yield wrapper
    finally:
        connections["default"] = original
        wrapper.close()


# What a project sets: nothing (Django turns psycopg's prepared statements off), prepared
# statements turned on, and those turned on behind a pooler in transaction mode.
DJANGO_DEFAULT: dict[str, Any] = {"prepare_threshold": None, "pooler": False}
PREPARED: dict[str, Any] = {"prepare_threshold": 5, "pooler": False}
PREPARED_BEHIND_A_POOLER: dict[str, Any] = {"prepare_threshold": 5, "pooler": True}


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("settings", "prepared"),
    [(DJANGO_DEFAULT, False), (PREPARED, True), (PREPARED_BEHIND_A_POOLER, False)],
    ids=["django-default", "prepare-threshold", "prepare-threshold-and-pooler"],
)
def test_the_store_prepares_its_statements_only_where_the_project_allows_it(
    settings: dict[str, Any], prepared: bool
) -> None:
    with project_connection(**settings) as connection:
        # One transaction: its statements share one server connection, through a pooler too.
        with transaction.atomic(), connection.cursor() as cursor:
            DatabaseStore().lookup(claim_request())
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                [f"%{RECORDS}%"],
            )
            (found,) = cursor.fetchone()
            cursor.execute("DEALLOCATE ALL")  # Nothing left on a pooler's server connection.
        assert prepares(connection) is prepared
    assert found == (1 if prepared else 0)


@pytest.mark.pgbouncer
@pytest.mark.django_db(transaction=True)
def test_clients_of_pgbouncer_that_prepare_statements_share_its_server_connections() -> None:
    # Two connections of a project that turned psycopg's prepared statements on and set
    # DISABLE_SERVER_SIDE_CURSORS for PgBouncer, used in turn. PgBouncer hands the server
    # connection the first just left to the second. Prepared, each one's first statement
    # would be named "_pg3_0" on it: "already exists", or another client's statement run in
    # its place.
    store = DatabaseStore()
    answers = []
    with ExitStack() as stack:
        clients = [
            stack.enter_context(project_connection(**PREPARED_BEHIND_A_POOLER)) for _ in range(2)
        ]
        for round_ in range(3):
            for number, client in enumerate(clients):
                connections["default"] = client
                request = claim_request(Scope("default", "", f"client-{number}-{round_}"))
                answers.append(store.lookup(request))
                claim = store.begin(request)
                assert claim.outcome is Outcome.FRESH
                assert store.complete(claim, StoredResponse(201, [], b"done"), request.now)
                replayed = store.lookup(request)
                assert replayed is not None and replayed.outcome is Outcome.REPLAY
                assert replayed.response is not None and replayed.response.body == b"done"
    assert answers == [None] * 6


@pytest.mark.pgbouncer
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_a_database_restart_behind_pgbouncer_fails_no_request(settings: Any, mode: str) -> None:
    # What a restart does to the server connections PgBouncer keeps: each ends. The client's
    # own connection, to PgBouncer, stays open. PgBouncer hears of each end from the server and
    # opens a new one for the next transaction; one that died unheard of would cut the client
    # off, and its first statement would run again on a new connection (test_roads).
    settings.IDEMPOTENCY_MODE = mode
    client = Client()
    assert post(client, "/function/charges/", key="warm-up").status_code == 201
    # From another database's pool: a statement from this one would run on the very server
    # connection it ends.
    admin = connections.create_connection("default")
    admin.settings_dict = {**admin.settings_dict, "NAME": "postgres"}
    try:
        with admin.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                [connection.settings_dict["NAME"]],
            )
            (terminated,) = cursor.fetchone()
    finally:
        admin.close()

    response = post(client, "/function/charges/", key="after-restart")

    assert terminated >= 1
    assert response.status_code == 201, response.content
    assert Charge.objects.filter(reference="after-restart").count() == 1


def advisory_locks_held() -> int:
    """Advisory locks any session holds on the test database, read on a connection of its own
    (PostgreSQL's lock table is the server's, whichever server connection reads it)."""
    reader = connections.create_connection("default")
    try:
        with reader.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            return int(cursor.fetchone()[0])
    finally:
        reader.close()


seen_in_views: list[int] = []


def _charge(request: HttpRequest) -> JsonResponse:
    seen_in_views.append(advisory_locks_held())
    return JsonResponse({"ok": True}, status=201)


urlpatterns = [
    path("atomic/", idempotent(mode="atomic")(_charge)),
    path("lease/", idempotent(mode="lease")(_charge)),
]


@pytest.mark.postgresql
@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("mode", "during_the_view"), [("atomic", 2), ("lease", 0)])
def test_no_advisory_lock_outlives_the_transaction_that_took_it(
    mode: str, during_the_view: int
) -> None:
    # The claim's two locks are transaction-scoped: atomic mode holds them while the view runs
    # in the claim's transaction, lease mode only for its claim's own statement. Behind a pooler
    # in transaction mode, a lock held past its transaction would stay on a server connection
    # that other clients' transactions then run on.
    seen_in_views.clear()
    client = Client()
    url = f"/{mode}/"

    assert post(client, url, key="k").status_code == 201
    assert advisory_locks_held() == 0
    assert post(client, url, key="k").status_code == 201  # The replay.
    assert post(client, url, key="k", body={"amount": 2}).status_code == 422
    assert advisory_locks_held() == 0
    assert seen_in_views == [during_the_view]


SESSION_LOCK = re.compile(r"pg_(try_)?advisory_(lock|unlock)")


def test_no_session_scoped_advisory_lock_is_taken_anywhere() -> None:
    # Session-scoped locks (pg_advisory_lock and its kin) outlive the transaction: behind a
    # pooler they stay with a server connection, not with the client that took them.
    package = Path(django_idempotency.__file__).parent
    sources = {source: source.read_text() for source in package.rglob("*.py")}
    session_scoped = [str(source) for source, text in sources.items() if SESSION_LOCK.search(text)]

    assert session_scoped == []
    # The claim's transaction-scoped locks are found: the search read the package's code.
    assert any("pg_try_advisory_xact_lock" in text for text in sources.values())
