"""A router that sends reads to a streaming replica made to lag: every decision is taken on the
primary, and a lagging replica never makes a key look new.

The replica is a real PostgreSQL hot standby of the one under test (PG_REPLICA_URL, started by
scripts/services.sh), receiving the test database by streaming replication; each test holds
back the commits it applies (`recovery_min_apply_delay`), so that a commit the primary has made
is not on the replica for a few seconds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import dj_database_url
import psycopg
import pytest
from django.db import connections
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from django_idempotency import signals
from django_idempotency.admin import delete_and_forget
from django_idempotency.models import IdempotencyRecord
from tests.factories import IdempotencyRecordFactory
from tests.models import Charge
from tests.utils import post

pytestmark = [
    pytest.mark.postgresql,
    pytest.mark.replica,
    pytest.mark.django_db(databases=["default", "replica"], transaction=True),
]

URL = "/function/charges/"
# Each commit reaches the replica this long after the primary made it: far longer than a test
# takes between its first request and its last check.
LAG = "6s"
CATCH_UP_TIMEOUT = 60.0  # Seconds; the test database's creation streams in within this.


class PrimaryReplicaRouter:
    """Django's documented primary/replica router: reads from the replica, writes to the
    primary."""

    def db_for_read(self, model: Any, **hints: Any) -> str:
        return "replica"

    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "default"

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return True


class Replica:
    """The replica's server, driven from outside Django: how far it lags behind the primary."""

    def __init__(self) -> None:
        url = os.environ["PG_REPLICA_URL"]
        server = dj_database_url.parse(url)
        try:
            self.server = psycopg.connect(
                host=server["HOST"],
                port=server["PORT"],
                user=server["USER"] or "postgres",
                dbname="postgres",
                autocommit=True,
                connect_timeout=5,
            )
        except psycopg.OperationalError as exc:
            pytest.fail(
                f"PG_REPLICA_URL={url} is set but its server cannot be reached ({exc}): start "
                "it with scripts/services.sh (start_pg_replica), or unset PG_REPLICA_URL."
            )
        (in_recovery,) = self._one("SELECT pg_is_in_recovery()")
        if not in_recovery:
            pytest.fail(f"PG_REPLICA_URL={url} is not a replica (pg_is_in_recovery() is false).")

    def _one(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        row = self.server.execute(sql, params).fetchone()
        assert row is not None
        return tuple(row)

    def apply_delay(self, delay: str | None) -> None:
        """Hold back each commit `delay` after the primary made it; None: the server's own
        setting again."""
        if delay is None:
            self.server.execute("ALTER SYSTEM RESET recovery_min_apply_delay")
        else:
            self.server.execute(f"ALTER SYSTEM SET recovery_min_apply_delay = '{delay}'")
        self.server.execute("SELECT pg_reload_conf()")

    def catch_up(self) -> None:
        """Return once the replica has applied everything the primary has written so far."""
        self.apply_delay("0")
        with connections["default"].cursor() as cursor:
            # Inserted, not only written: the primary may commit asynchronously
            # (synchronous_commit=off), its WAL writer sending the commits a moment later.
            cursor.execute("SELECT pg_current_wal_insert_lsn()")
            (written,) = cursor.fetchone()
        self._wait_until(
            lambda: bool(self._one("SELECT pg_last_wal_replay_lsn() >= %s", (written,))[0]),
            f"apply the primary's WAL up to {written}",
        )

    def lag(self) -> None:
        """Make the replica hold back commits, and return once it holds one back: a commit of
        the primary's, seen waiting on the replica's startup process (wait event
        RecoveryApplyDelay). Every later commit waits behind it."""
        self.apply_delay(LAG)
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT txid_current()")  # A transaction that commits, and no data.
        self._wait_until(self._holding_back_a_commit, f"hold back a commit for {LAG}")

    def _holding_back_a_commit(self) -> bool:
        (waiting,) = self._one(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'startup' AND wait_event = 'RecoveryApplyDelay'"
        )
        return bool(waiting)

    def _wait_until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while not done():
            if time.monotonic() > deadline:
                pytest.fail(f"The replica did not {what} within {CATCH_UP_TIMEOUT:.0f} s.")
            time.sleep(0.02)

    def close(self) -> None:
        self.apply_delay(None)
        self.server.close()


@pytest.fixture
def replica() -> Iterator[Replica]:
    """The replica, caught up with the primary (the test database's tables are on it), its
    Django connection closed at the end (the primary's flush then replays there freely)."""
    replica = Replica()
    try:
        replica.catch_up()
        with override_settings(DATABASE_ROUTERS=[f"{__name__}.PrimaryReplicaRouter"]):
            yield replica
    finally:
        connections["replica"].close()
        replica.close()


def seen_by_the_router(key: str) -> bool:
    """Whether a read routed as the project routes it (to the replica) finds the key."""
    return IdempotencyRecord.objects.filter(key=key).exists()


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_a_replay_right_after_the_commit_replays_while_the_replica_lags(
    replica: Replica, mode: str
) -> None:
    replica.lag()
    client = Client()
    with override_settings(IDEMPOTENCY_MODE=mode):
        first = post(client, URL)
        with (
            CaptureQueriesContext(connections["default"]) as on_the_primary,
            CaptureQueriesContext(connections["replica"]) as on_the_replica,
        ):
            retry = post(client, URL)

    assert first.status_code == 201
    assert not seen_by_the_router("key-1")  # The replica has not applied the first commit yet.
    assert retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Charge.objects.using("default").count() == 1  # The view ran once.
    assert on_the_replica.captured_queries == []
    assert len(on_the_primary.captured_queries) == 1  # The replay's one indexed read.


@pytest.mark.parametrize("mode", ["atomic", "lease"])
def test_a_duplicate_while_the_first_request_runs_gets_409_while_the_replica_lags(
    replica: Replica, mode: str
) -> None:
    replica.lag()
    running, finish = threading.Event(), threading.Event()
    first: list[Any] = []

    def hold_the_first(**kwargs: Any) -> None:
        if threading.current_thread() is first_request:
            running.set()
            finish.wait(10)

    def send_the_first() -> None:
        try:
            first.append(post(Client(), URL))
        finally:
            connections.close_all()

    first_request = threading.Thread(target=send_the_first)
    signals.claimed.connect(hold_the_first)
    try:
        with override_settings(IDEMPOTENCY_MODE=mode):
            first_request.start()
            assert running.wait(10)  # Claimed (committed, in lease mode), the view not yet run.
            with CaptureQueriesContext(connections["replica"]) as on_the_replica:
                duplicate = post(Client(), URL)
            # Read now: the next request through the test client empties the query log.
            sent_to_the_replica = on_the_replica.captured_queries
            finish.set()
            first_request.join(10)
            retry = post(Client(), URL)
    finally:
        finish.set()
        signals.claimed.disconnect(hold_the_first)

    assert duplicate.status_code == 409
    assert duplicate["Content-Type"] == "application/problem+json"
    assert sent_to_the_replica == []
    assert first[0].status_code == 201
    assert not seen_by_the_router("key-1")  # Still lagging behind the first request's commit.
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.using("default").count() == 1


def test_the_admins_purge_selects_and_deletes_on_the_primary_while_the_replica_lags(
    replica: Replica,
) -> None:
    IdempotencyRecordFactory.create_batch(3)
    replica.catch_up()
    replica.lag()
    listed = IdempotencyRecord.objects.all()  # Where the admin lists them: the replica.

    with CaptureQueriesContext(connections["default"]) as on_the_primary:
        purged = delete_and_forget(listed, batch_size=1)

    assert purged == 3
    deletes = [q for q in on_the_primary.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3  # One a batch, none sent again for a record already gone.
    assert not IdempotencyRecord.objects.using("default").exists()
    # Done while the replica still shows every record: no batch waited for it to catch up.
    assert IdempotencyRecord.objects.using("replica").count() == 3
