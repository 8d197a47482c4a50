"""One clock decides when a lease ends, the store's: a server whose own clock runs ahead never
takes over a live lease, and the store's clock is read once a minute, not once a request."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_idempotency.exceptions import StoreUnavailable
from django_idempotency.models import IdempotencyRecord
from django_idempotency.purge import purge_expired_records
from django_idempotency.stores import get_store
from django_idempotency.stores.clocks import REFRESH, RETRY, StoreClock, as_now, later
from tests.clock_processes import HOLD_LEASE, environment, hold
from tests.factories import IdempotencyRecordFactory
from tests.stores import SHARED_STORES, using_store
from tests.utils import wait_for

ROOT = Path(__file__).resolve().parent.parent
SKEW = 3 * HOLD_LEASE  # Seconds the second server's clock runs ahead.
HOUR = timedelta(hours=1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shared_store", SHARED_STORES, indirect=True)
def test_a_server_whose_clock_runs_ahead_never_takes_over_a_live_lease(
    shared_store: str, tmp_path: Path
) -> None:
    held, taken = tmp_path / "held", tmp_path / "taken"
    env = environment(shared_store)

    def holder() -> None:
        try:
            hold("skewed-1", str(held), 120)
        finally:
            connections.close_all()  # This thread's own.

    holding = threading.Thread(target=holder)
    holding.start()
    try:
        wait_for(held.exists, 30)
        # Four tries, a third of a lease apart: across the holder's renewals, whatever is left
        # of its lease at each, the other server's clock says it ended seconds ago.
        tries = ["ahead", "skewed-1", str(taken), str(SKEW), "4"]
        ahead = subprocess.run(
            [sys.executable, "-m", "tests.clock_processes", *tries],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        Path(f"{held}.done").touch()
        holding.join()

    assert ahead.returncode == 0, ahead.stderr
    # Never "ran": the work never ran on the server whose clock runs ahead.
    assert json.loads(ahead.stdout) == ["in-progress"] * 4


@pytest.mark.django_db
def test_a_purge_on_a_machine_whose_clock_runs_ahead_keeps_every_live_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    completed = IdempotencyRecordFactory(key="replays", expires_at=timezone.now() + HOUR)
    running = IdempotencyRecordFactory(key="running", in_progress=True, expires_at=timezone.now())
    ahead = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: ahead() + 2 * HOUR)  # A cron host's clock.

    report = purge_expired_records()

    assert report.total == 0
    assert set(IdempotencyRecord.objects.values_list("pk", flat=True)) == {
        completed.pk,
        running.pk,
    }


# The store clock itself: read once, then counted by the local monotonic clock.


class Store:
    """A store's clock that the test sets, and counts the readings of."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.readings = 0
        self.down = False

    def read(self) -> float:
        self.readings += 1
        if self.down:
            raise StoreUnavailable("connection refused")
        return self.seconds


@pytest.fixture
def elapsed(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The clock that counts between readings, moved on by the test (seconds)."""
    moment = [1000.0]
    monkeypatch.setattr("django_idempotency.stores.clocks.elapsed", lambda: moment[0])
    return moment


def test_the_store_clock_is_read_once_then_counted_locally(elapsed: list[float]) -> None:
    store = Store(seconds=1_800_000_000.0)
    clock = StoreClock(store.read)

    first = clock.seconds()
    elapsed[0] += REFRESH - 1
    later_on = clock.seconds()

    assert store.readings == 1
    assert first == 1_800_000_000.0
    assert later_on == 1_800_000_000.0 + REFRESH - 1
    assert clock.uncertainty == 0.0


def test_a_slow_first_reading_is_read_again(elapsed: list[float]) -> None:
    started = elapsed[0]
    readings: list[float] = []

    def read() -> float:
        if not readings:
            elapsed[0] += 1.2  # The first opens the connection; the store answers at its end.
        readings.append(elapsed[0])
        return 1_800_000_000.0 + (elapsed[0] - started)

    clock = StoreClock(read)

    # Not 0.6 s ahead, the middle of the first reading's 1.2 s: the second, tight, is kept.
    assert clock.seconds() == 1_800_000_000.0 + 1.2
    assert len(readings) == 2 and clock.uncertainty == 0.0


def test_the_store_clock_is_read_again_every_refresh(elapsed: list[float]) -> None:
    store = Store(seconds=1_800_000_000.0)
    clock = StoreClock(store.read)
    clock.seconds()

    store.seconds += 5.0  # The store's server stepped its clock (an NTP correction).
    elapsed[0] += REFRESH

    assert clock.seconds() == 1_800_000_005.0
    assert store.readings == 2


def test_a_store_clock_that_cannot_be_read_keeps_counting_from_its_last_reading(
    elapsed: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="django_idempotency")
    store = Store(seconds=1_800_000_000.0)
    clock = StoreClock(store.read)
    clock.seconds()
    store.down = True
    elapsed[0] += REFRESH

    assert clock.seconds() == 1_800_000_000.0 + REFRESH
    assert clock.seconds() == 1_800_000_000.0 + REFRESH  # Not tried again at once.
    elapsed[0] += RETRY
    store.down = False
    store.seconds += REFRESH + RETRY

    assert clock.seconds() == 1_800_000_000.0 + REFRESH + RETRY
    assert store.readings == 3
    assert "Could not read the idempotency store's clock" in caplog.text


def test_a_store_clock_never_read_answers_store_unavailable(elapsed: list[float]) -> None:
    store = Store(seconds=1_800_000_000.0)
    store.down = True

    with pytest.raises(StoreUnavailable):
        StoreClock(store.read).now()


@pytest.mark.django_db
def test_the_database_clock_costs_one_statement_a_minute(elapsed: list[float]) -> None:
    store = get_store()

    with CaptureQueriesContext(connection) as first:
        store.now()
    with CaptureQueriesContext(connection) as within_the_minute:
        for _ in range(100):
            store.now()
    elapsed[0] += REFRESH
    with CaptureQueriesContext(connection) as a_minute_later:
        store.now()

    assert (len(first), len(within_the_minute), len(a_minute_later)) == (1, 0, 1)


@pytest.mark.django_db
def test_the_database_clock_is_the_databases(monkeypatch: pytest.MonkeyPatch) -> None:
    # This process's clock an hour ahead, as Django reads it: the database's is not.
    ahead = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: ahead() + timedelta(hours=1))

    moment = get_store().now()

    assert abs(moment.timestamp() - time.time()) < 60


def test_the_database_clock_never_read_and_gone_is_store_unavailable(database_down: None) -> None:
    with pytest.raises(StoreUnavailable):  # Answered 503, as the claim would be.
        get_store().now()


@pytest.mark.django_db
def test_a_backend_without_a_known_clock_keeps_this_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Refused by the system checks; should a project silence them, its requests still run.
    monkeypatch.setattr(connection, "vendor", "another")
    ahead = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: ahead() + timedelta(hours=1))

    assert abs(get_store().now() - timezone.now()) < timedelta(minutes=1)


@pytest.mark.redis
def test_the_redis_clock_is_redis_time() -> None:
    with using_store("redis"):
        store = get_store()
        seconds, microseconds = store.connection().time()  # type: ignore[attr-defined]

        moment = store.now()

    assert abs(moment.timestamp() - (seconds + microseconds / 1e6)) < 1


def test_a_moment_reads_as_timezone_now_gives_it() -> None:
    with override_settings(USE_TZ=True):
        assert as_now(0.0) == datetime(1970, 1, 1, tzinfo=UTC)
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        repeated = as_now(datetime(2026, 10, 25, 1, 30, tzinfo=UTC).timestamp())
        assert (repeated, repeated.fold) == (datetime(2026, 10, 25, 2, 30), 1)


def test_a_naive_end_across_the_hour_the_clocks_skip_is_its_length_in_fact() -> None:
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        # 01:59:30, then the clocks jump from 02:00 to 03:00.
        assert later(datetime(2026, 3, 29, 1, 59, 30), timedelta(minutes=1)) == datetime(
            2026, 3, 29, 3, 0, 30
        )
        # Away from a change, and when the clocks go back: the naive sum.
        assert later(datetime(2026, 3, 28, 1, 59), timedelta(minutes=1)) == datetime(
            2026, 3, 28, 2, 0
        )
        assert later(datetime(2026, 10, 25, 2, 59), timedelta(minutes=2)) == datetime(
            2026, 10, 25, 3, 1
        )
    aware = datetime(2026, 3, 29, 0, 59, 30, tzinfo=UTC)
    assert later(aware, timedelta(minutes=1)) == aware + timedelta(minutes=1)
