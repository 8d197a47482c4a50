"""Atomic and lease modes: rollback on failure, fenced completion, takeover of stale leases."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection, connections
from django.test import Client, override_settings
from django.utils import timezone

from django_idempotency import signals
from django_idempotency.attempts import Attempt
from django_idempotency.core.outcomes import Outcome, Scope, StoredResponse
from django_idempotency.exceptions import KeyInProgress
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores import ClaimRequest, StoreUnavailable, get_store
from django_idempotency.stores.database import DatabaseStore
from tests.models import Charge
from tests.stores import the_record
from tests.utils import ViewKind, assert_problem, lose_database, post, wait_for

pytestmark = pytest.mark.django_db


def _claim_request(lease: float | None = 30, now_offset: float = 0) -> ClaimRequest:
    return ClaimRequest(
        scope=Scope("default", "", "key-1"),
        fingerprint="f" * 64,
        method="POST",
        path="/function/charges/",
        now=timezone.now() + timedelta(seconds=now_offset),
        ttl=timedelta(hours=1),
        lease=None if lease is None else timedelta(seconds=lease),
    )


# The store contract, on every store.


@pytest.mark.usefixtures("store")
def test_a_taken_over_lease_cannot_overwrite_or_delete_the_new_owners_record() -> None:
    store = get_store()
    slow = store.begin(_claim_request(lease=1))
    # Two seconds later the slow request's lease has run out; a retry takes the key over.
    retry = store.begin(_claim_request(lease=30, now_offset=2))

    assert slow.outcome is retry.outcome is Outcome.FRESH
    assert retry.lease_token != slow.lease_token

    assert store.complete(slow, StoredResponse(201, [], b"slow"), timezone.now()) is False
    assert store.release(slow) is False
    assert the_record().status == "in_progress"
    assert store.begin(_claim_request(now_offset=3)).outcome is Outcome.IN_PROGRESS

    assert store.complete(retry, StoredResponse(201, [], b"retry"), timezone.now()) is True
    replayed = store.begin(_claim_request(now_offset=3))
    assert replayed.outcome is Outcome.REPLAY
    assert replayed.response is not None
    assert replayed.response.body == b"retry"


@pytest.mark.usefixtures("store")
def test_a_live_lease_is_not_taken_over() -> None:
    store = get_store()
    first = store.begin(_claim_request(lease=30))
    second = store.begin(_claim_request(lease=30, now_offset=5))

    assert first.outcome is Outcome.FRESH
    assert second.outcome is Outcome.IN_PROGRESS
    assert store.release(first) is True  # Still the first request's claim.


@pytest.mark.usefixtures("store")
def test_an_expired_completed_record_is_claimed_afresh() -> None:
    store = get_store()
    first = store.begin(_claim_request())
    store.complete(first, StoredResponse(201, [], b"old"), timezone.now())

    later = store.begin(replace(_claim_request(), now=timezone.now() + timedelta(hours=2)))

    assert later.outcome is Outcome.FRESH
    record = the_record()
    assert record.status == "in_progress"
    assert record.response_body is None


@pytest.mark.usefixtures("store")
def test_an_expired_record_taken_over_by_another_request_is_that_requests_from_then_on() -> None:
    store = get_store()
    first = store.begin(_claim_request())
    response = StoredResponse(201, [("X-Old", "1")], b"old", "Old Reason")
    assert store.complete(first, response, timezone.now())
    # Two hours on, the record has expired: the key goes to another request, a PUT elsewhere.
    other = replace(
        _claim_request(lease=30, now_offset=2 * 3600),
        fingerprint="e" * 64,
        method="PUT",
        path="/elsewhere/",
    )

    taken = store.begin(other)

    assert taken.outcome is Outcome.FRESH
    assert store.begin(other).outcome is Outcome.IN_PROGRESS  # Its own duplicate waits.
    record = the_record()
    assert (record.status, record.method, record.path) == ("in_progress", "PUT", "/elsewhere/")
    assert (record.response_status, record.response_body) == (None, None)
    assert abs(record.created_at - other.now) < timedelta(milliseconds=1)  # Redis keeps ms.
    if isinstance(store, DatabaseStore):  # What the admin shows of it.
        row = IdempotencyRecord.objects.get()
        assert (row.fingerprint, row.response_reason, row.response_headers) == ("e" * 64, "", [])
        assert row.completed_at is None
    # Its lease runs out in turn: a later retry takes the key over again.
    assert store.begin(replace(other, now=other.now + timedelta(seconds=31))).outcome is (
        Outcome.FRESH
    )


@pytest.mark.usefixtures("store")
def test_an_expired_record_taken_over_and_completed_replays_its_new_answer() -> None:
    store = get_store()
    first = store.begin(_claim_request())
    assert store.complete(
        first, StoredResponse(201, [("X-Old", "1")], b"old", "Old"), timezone.now()
    )
    other = replace(
        _claim_request(now_offset=2 * 3600), fingerprint="e" * 64, method="PUT", path="/else/"
    )
    taken = store.begin(other)
    assert store.complete(taken, StoredResponse(202, [], b"new"), other.now)

    replayed = store.begin(other)

    assert replayed.outcome is Outcome.REPLAY
    assert replayed.response == StoredResponse(202, [], b"new")  # Nothing of the old one.
    assert store.begin(replace(other, method="POST")).outcome is Outcome.MISMATCH


@pytest.mark.usefixtures("store")
def test_a_released_claim_lets_the_next_request_run() -> None:
    store = get_store()
    first = store.begin(_claim_request())
    assert store.release(first) is True
    assert store.begin(_claim_request()).outcome is Outcome.FRESH


def test_lease_mode_commits_the_claim_and_records_the_lease(client: Client) -> None:
    with override_settings(IDEMPOTENCY_MODE="lease", IDEMPOTENCY_LEASE=timedelta(seconds=45)):
        post(client, "/function/charges/")

    record = IdempotencyRecord.objects.get()
    assert record.status == IdempotencyRecord.Status.COMPLETED
    assert len(record.lease_token) == 32
    assert record.lease_expires_at is None  # Completed: nothing left to lease.


def test_view_class_attributes_choose_the_mode_and_methods(client: Client) -> None:
    """LeasedChargeViewSet sets idempotency_mode = "lease" and guards POST and PUT."""
    first = post(client, "/leased/charges/")
    retry = post(client, "/leased/charges/")

    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Charge.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_atomic_mode_crash_leaves_neither_the_row_nor_a_record() -> None:
    client = Client(raise_request_exception=False)

    assert post(client, "/function/charges/", outcome="raise").status_code == 500

    assert Charge.objects.count() == 0
    assert not IdempotencyRecord.objects.exists()
    assert post(client, "/function/charges/").status_code == 201
    assert post(client, "/function/charges/")["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_lease_mode_crash_releases_the_key_at_once() -> None:
    client = Client(raise_request_exception=False)
    with override_settings(IDEMPOTENCY_MODE="lease"):
        assert post(client, "/function/charges/", outcome="raise").status_code == 500
        assert not IdempotencyRecord.objects.exists()
        assert post(client, "/function/charges/").status_code == 201


# The store's database lost while a lease-mode view runs (tests/reliability: PostgreSQL stopped).


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "view_kind",
    [ViewKind.FUNCTION, ViewKind.VIEWSET_MIXIN, ViewKind.ASYNC_FUNCTION],
    ids=lambda kind: kind.name.lower(),
)
def test_lease_mode_a_view_that_loses_the_database_is_503_and_keeps_its_claim(
    view_kind: ViewKind,
) -> None:
    lost: list[tuple[Any, dict[str, Any]]] = []

    def database_goes_away(**kwargs: Any) -> None:  # Right after the claim committed.
        lost.append((connections["default"], lose_database(connections["default"])))

    signals.claimed.connect(database_goes_away)
    try:
        with override_settings(IDEMPOTENCY_MODE="lease"):
            response = post(Client(raise_request_exception=False), view_kind.url)
    finally:
        signals.claimed.disconnect(database_goes_away)
        for connection, original in lost:
            connection.close()
            connection.settings_dict.update(original)

    # The view's own query failed: a 503 to retry later, not a 500. Its claim could not be
    # released, so it ends with its lease; nothing was charged.
    assert_problem(response, 503, "store-unavailable")
    assert IdempotencyRecord.objects.get().status == IdempotencyRecord.Status.IN_PROGRESS
    assert Charge.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_lease_mode_a_result_is_stored_when_the_database_is_back_before_the_lease_ends() -> None:
    attempt = Attempt(atomic=False, on_conflict="reject")
    assert attempt.begin(_claim_request(lease=30)).outcome is Outcome.FRESH
    original = lose_database(connection)
    back = threading.Timer(0.3, connection.settings_dict.update, [original])
    back.start()
    try:
        kept = attempt.complete(StoredResponse(201, [], b"stored"))
    finally:
        back.join()

    assert kept
    record = IdempotencyRecord.objects.get()
    assert (record.status, bytes(record.response_body)) == ("completed", b"stored")


@pytest.mark.django_db(transaction=True)
def test_lease_mode_storing_a_result_gives_up_when_the_lease_ends() -> None:
    attempt = Attempt(atomic=False, on_conflict="reject")
    assert attempt.begin(_claim_request(lease=0.3)).outcome is Outcome.FRESH
    original = lose_database(connection)
    try:
        with pytest.raises(StoreUnavailable):
            attempt.complete(StoredResponse(201, [], b"lost"))
    finally:
        connection.close()
        connection.settings_dict.update(original)

    assert IdempotencyRecord.objects.get().status == IdempotencyRecord.Status.IN_PROGRESS


def _database_url() -> str:
    """The test database, for another process to use."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    user = quote(settings["USER"]) + (
        f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
    )
    scheme = "mysql" if connection.vendor == "mysql" else "postgres"
    return f"{scheme}://{user}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"


@pytest.mark.django_db(transaction=True)
def test_a_killed_process_frees_its_renewed_key_within_one_lease(tmp_path: Path) -> None:
    from tests.lease_holder import LEASE, hold_the_key

    marker = tmp_path / "claimed"
    connection.close()  # SQLite: let the other process write.
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",  # Unless the run names its own.
        **os.environ,
        "DATABASE_URL": _database_url(),
    }
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.lease_holder", "killed-1", str(marker), "60"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
    )
    try:
        wait_for(marker.exists, 30)
        claimed_at = time.monotonic()
        # Alive past two leases: renewed, so a retry meanwhile is refused, never run.
        while time.monotonic() - claimed_at < 2 * LEASE:
            with pytest.raises(KeyInProgress):
                hold_the_key("killed-1", str(marker), 0)
            time.sleep(LEASE / 4)
    finally:
        holder.kill()  # SIGKILL: no release, no last write; its heartbeat dies with it.
        holder.wait()
    killed_at = time.monotonic()

    def retry_runs() -> bool:
        try:
            return hold_the_key("killed-1", str(marker), 0) == "ran"
        except KeyInProgress:
            return False

    wait_for(retry_runs, 10 * LEASE)
    freed_after = time.monotonic() - killed_at

    # Within one lease of the kill (and a renewal interval's slack), not a default 60 s.
    assert freed_after <= LEASE + 0.5, freed_after
    assert IdempotencyRecord.objects.get().status == "completed"
