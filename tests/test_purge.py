"""The purge service: what it deletes, what it keeps, and how it reports."""

from __future__ import annotations

import dataclasses
import logging
import threading
from datetime import datetime, timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_idempotency.core.outcomes import Outcome, Scope
from django_idempotency.exceptions import PurgeConflict
from django_idempotency.models import IdempotencyRecord
from django_idempotency.purge import PurgeReport, purge_expired_records
from django_idempotency.stores import PurgeOptions, PurgeResult, StoreUnavailable, get_store
from tests.factories import IdempotencyRecordFactory
from tests.stores import claim_request
from tests.utils import lose_database

pytestmark = pytest.mark.django_db


def _past() -> datetime:
    return timezone.now() - timedelta(minutes=5)


def _make_expired(count: int, **kwargs: object) -> list[IdempotencyRecord]:
    return IdempotencyRecordFactory.create_batch(count, expires_at=_past(), **kwargs)


def _make_abandoned(count: int, **kwargs: object) -> list[IdempotencyRecord]:
    """In-progress claims whose lease ran out, their records expired: the purge deletes them."""
    return IdempotencyRecordFactory.create_batch(
        count, in_progress=True, lease_expires_at=_past(), expires_at=_past(), **kwargs
    )


def _make_live() -> set[int]:
    """A completed record still replaying, a leased claim still running, an atomic claim, and a
    crashed claim (its lease ran out) whose record has not expired: its retry may still come."""
    records = [
        IdempotencyRecordFactory(),
        IdempotencyRecordFactory(in_progress=True),
        IdempotencyRecordFactory(in_progress=True, lease_expires_at=None),
        IdempotencyRecordFactory(in_progress=True, lease_expires_at=_past()),
    ]
    return {record.pk for record in records}


def _remaining() -> set[int]:
    return set(IdempotencyRecord.objects.values_list("pk", flat=True))


def test_expired_records_and_abandoned_claims_are_purged_and_counted_apart() -> None:
    _make_expired(3)
    _make_abandoned(2)
    live = _make_live()

    report = purge_expired_records()

    assert (report.expired, report.abandoned, report.total) == (3, 2, 5)
    assert report.batches == 1
    assert report.dry_run is False
    assert report.seconds >= 0
    assert _remaining() == live


def test_a_live_lease_is_kept_past_its_expiry() -> None:
    # A TTL shorter than the lease: the request holding the key may still be running, and
    # deleting its claim would let a retry run the work a second time.
    running = IdempotencyRecordFactory(in_progress=True, expires_at=_past())

    report = purge_expired_records()

    assert report.total == 0
    assert IdempotencyRecord.objects.get() == running


def test_nothing_to_purge_reports_zero_and_keeps_everything() -> None:
    live = _make_live()

    report = purge_expired_records()

    assert (report.expired, report.abandoned, report.total, report.batches) == (0, 0, 0, 0)
    assert _remaining() == live


def test_a_record_expiring_later_is_kept() -> None:
    IdempotencyRecordFactory(expires_at=timezone.now() + timedelta(seconds=30))

    assert purge_expired_records().total == 0
    assert IdempotencyRecord.objects.count() == 1


def test_namespace_limits_the_purge_to_that_namespace() -> None:
    _make_expired(2, namespace="payments")
    _make_abandoned(1, namespace="payments")
    others = {r.pk for r in _make_expired(2, namespace="refunds") + _make_abandoned(1)}

    report = purge_expired_records(namespace="payments")

    assert (report.expired, report.abandoned) == (2, 1)
    assert _remaining() == others


def test_a_dry_run_counts_what_would_go_and_deletes_nothing() -> None:
    _make_expired(4)
    _make_abandoned(1)
    _make_live()
    before = _remaining()

    report = purge_expired_records(dry_run=True)

    assert (report.expired, report.abandoned, report.total) == (4, 1, 5)
    assert report.dry_run is True
    assert report.batches == 0
    assert _remaining() == before


def test_a_dry_run_honours_the_namespace() -> None:
    _make_expired(2, namespace="payments")
    _make_expired(3, namespace="refunds")

    assert purge_expired_records(dry_run=True, namespace="refunds").total == 3
    assert IdempotencyRecord.objects.count() == 5


def test_records_go_in_batches_of_batch_size() -> None:
    _make_expired(5)
    _make_abandoned(2)
    live = _make_live()

    report = purge_expired_records(batch_size=3)

    assert report.batches == 3  # 3 + 3 + 1
    assert report.total == 7
    assert _remaining() == live


def test_the_stores_purge_called_with_the_time_alone_deletes_in_batches_of_a_thousand() -> None:
    # The store interface's defaults, for code that calls the store directly.
    IdempotencyRecord.objects.bulk_create(
        IdempotencyRecordFactory.build_batch(1001, expires_at=_past())
    )
    seen: list[int] = []

    result = get_store().purge(
        timezone.now(), PurgeOptions(progress=lambda done: seen.append(done.total))
    )

    assert seen == [1000, 1001]
    assert result == PurgeResult(expired=1001, abandoned=0, batches=2)
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_the_purge_leaves_a_row_another_transaction_holds_and_does_not_wait_for_it() -> None:
    held, _ = _make_expired(2)
    # Another connection holds a lock on one expired row, as a claim taking it over does.
    other = connections.create_connection("default")
    other.set_autocommit(False)
    table = IdempotencyRecord._meta.db_table
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [held.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # Waiting for it would fail, not hang.
        report = purge_expired_records()
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    assert report.total == 1
    assert _remaining() == {held.pk}


@pytest.mark.postgresql
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_a_purge_never_waits_for_a_row_a_live_request_holds_nor_holds_up_claims() -> None:
    # A request in atomic mode is taking over an expired record: its transaction holds the
    # row. The purge skips it and ends at once, and meanwhile a new claim of a key the purge
    # deleted is fresh (a purge waiting on the held row would keep the deleted rows locked,
    # and answer such claims 409 until it failed).
    purged = _make_expired(3)
    (held,) = _make_expired(1)  # The last row of the batch.
    other = connections.create_connection("default")
    other.set_autocommit(False)
    table = IdempotencyRecord._meta.db_table
    reports: list[PurgeReport] = []

    def purge() -> None:
        try:
            reports.append(purge_expired_records())
        finally:
            connections.close_all()

    thread = threading.Thread(target=purge)
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [held.pk])
        thread.start()
        thread.join(10)  # Far below the databases' lock wait timeouts.
        purging = thread.is_alive()
        gone = purged[0]
        claim = get_store().begin(claim_request(Scope(gone.namespace, gone.owner, gone.key)))
    finally:
        other.rollback()
        other.close()
        thread.join()

    assert claim.outcome is Outcome.FRESH
    assert not purging
    assert reports[0].total == 3
    assert _remaining() == {held.pk, claim.record_id}


@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_a_batch_refused_a_row_lock_is_reported_as_such_not_as_an_outage() -> None:
    # A batch that meets a lock wait timeout (1205) is rolled back; the database is there, so
    # the report says to run the purge again, not that the database cannot be reached.
    def refused(result: PurgeResult) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = 1205, MESSAGE_TEXT = %s",
                ["Lock wait timeout exceeded; try restarting transaction"],
            )

    _make_expired(2)
    with pytest.raises(PurgeConflict) as raised:
        purge_expired_records(batch_size=1, progress=refused)

    assert str(raised.value) == (
        "A purge batch of idempotency records was refused a row lock and rolled back: Lock wait "
        "timeout exceeded; try restarting transaction. 1 record purged before it. Run the "
        "purge again; if this repeats, look for a long transaction holding idempotency records."
    )


def test_progress_is_called_after_each_batch_with_the_running_counts() -> None:
    _make_expired(5)
    seen: list[tuple[int, int]] = []

    def progress(result: PurgeResult) -> None:
        seen.append((result.batches, result.total))

    purge_expired_records(batch_size=2, progress=progress)

    assert seen == [(1, 2), (2, 4), (3, 5)]


def test_a_dry_run_reports_no_progress() -> None:
    _make_expired(3)
    seen: list[PurgeResult] = []

    purge_expired_records(batch_size=1, dry_run=True, progress=seen.append)

    assert seen == []


def test_one_log_line_gives_the_counts_and_duration(caplog: pytest.LogCaptureFixture) -> None:
    _make_expired(2)
    _make_abandoned(1)

    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        purge_expired_records(namespace="default")

    [record] = [r for r in caplog.records if r.name == "django_idempotency"]
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert message.startswith(
        "Purged 3 idempotency records (2 expired, 1 abandoned) in namespace 'default' in "
    )
    assert message.endswith(" s, 1 batch of up to 1000")


def test_a_dry_run_logs_what_it_would_purge(caplog: pytest.LogCaptureFixture) -> None:
    _make_expired(1)

    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        purge_expired_records(dry_run=True)

    assert "Would purge 1 idempotency record (1 expired, 0 abandoned) in " in caplog.text
    assert "0 batches" in caplog.text


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(batch_size: object) -> None:
    _make_expired(1)

    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        purge_expired_records(batch_size=batch_size)  # type: ignore[arg-type]

    assert IdempotencyRecord.objects.count() == 1


def test_the_report_is_a_frozen_value() -> None:
    report = purge_expired_records()

    assert isinstance(report, PurgeReport)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.total = 1  # type: ignore[misc]


@pytest.mark.django_db(transaction=True)
def test_a_database_lost_mid_purge_says_what_went_and_what_to_do() -> None:
    _make_expired(5)
    original: dict[str, object] = {}

    def lose_after_the_first_batch(result: PurgeResult) -> None:
        original.update(lose_database(connection))

    try:
        with pytest.raises(StoreUnavailable) as error:
            purge_expired_records(batch_size=2, progress=lose_after_the_first_batch)
    finally:
        connection.close()
        connection.settings_dict.update(original)

    message = str(error.value)
    assert message.startswith("The database holding idempotency records cannot be reached: ")
    assert message.endswith(
        "2 records purged before it was lost. Retry the purge when the database is back."
    )
    assert IdempotencyRecord.objects.count() == 3  # The committed batch stays purged.


@pytest.mark.usefixtures("database_down")
def test_a_lost_database_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match="Retry the purge when the database is back"):
        purge_expired_records()


# A crashed lease-mode attempt may have charged a provider: its record (its operation's
# identity, from which its outbound keys derive, and its steps) stays until it expires, so that
# the client's retry after a purge resumes it and sends the same keys.
