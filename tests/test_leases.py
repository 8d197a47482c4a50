"""Leases renewed while the work runs: a long view keeps its key, and lost work learns it."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path
from django.utils import timezone
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from django_idempotency import idempotent, idempotent_function, threads
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.core.outcomes import Claim, Outcome, StoredResponse
from django_idempotency.exceptions import LeaseLost, StoreUnavailable
from django_idempotency.leases import COMPACT_AFTER, Heartbeat, Hold, heartbeat
from django_idempotency.models import IdempotencyRecord
from django_idempotency.steps import step
from django_idempotency.stores import BaseStore, RecordLocked, get_store
from tests.stores import take_over_running, the_record
from tests.utils import in_a_forked_child, lose_database, post, wait_for

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

LEASE = 1.0  # Seconds: short, so that the view below outlives it three times over.
runs: Counter[str] = Counter()
started, finish = threading.Event(), threading.Event()


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    runs.clear()
    started.clear()
    finish.clear()
    yield
    finish.set()  # Never leave a view waiting.


@idempotent(mode="lease", lease=LEASE)
def long_view(request: HttpRequest) -> HttpResponse:
    runs["long"] += 1
    if runs["long"] == 1:  # A second run (the key taken over) answers at once.
        started.set()
        assert finish.wait(30), "the test never let the view finish"
    return JsonResponse({"run": runs["long"]}, status=201)


urlpatterns = [path("long/", long_view)]


def test_a_view_running_three_times_its_lease_keeps_its_claim(store: str) -> None:
    answers: dict[str, Any] = {}

    def first_request() -> None:
        try:
            answers["first"] = post(Client(), "/long/", key="long-1")
        finally:
            connections.close_all()  # This thread's own connections.

    first = threading.Thread(target=first_request)
    first.start()
    assert started.wait(10)
    began = time.monotonic()
    duplicates = []
    # Time itself is what is tested: retries until one is sent after the lease would have run
    # out three times (however long each takes on a loaded machine).
    while True:
        sent = time.monotonic() - began
        duplicates.append(post(Client(), "/long/", key="long-1").status_code)
        if sent >= 3 * LEASE:
            break
        time.sleep(LEASE / 4)
    finish.set()
    first.join(10)
    replay = post(Client(), "/long/", key="long-1")

    assert set(duplicates) == {409}, duplicates  # Never taken over: the lease was renewed.
    assert answers["first"].status_code == 201
    assert replay["Idempotent-Replayed"] == "true" and replay.json() == {"run": 1}
    assert runs == {"long": 1}


def count(name: str) -> str:
    runs[name] += 1
    return name


taken_over: list[Claim] = []


@idempotent_function(key="key", mode="lease", lease=60)
def stalled_then_resumed(key: str) -> str:
    step("charge", count, "charge")
    taken_over.append(take_over_running())
    heartbeat().beat()  # The stalled process's heartbeat runs again: its renewal is refused.
    step("ship", count, "ship")
    return "done"


def test_a_renewal_after_a_take_over_stops_the_work_at_its_next_step_and_stores_nothing(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    taken_over.clear()
    with (
        caplog.at_level(logging.WARNING, logger="django_idempotency"),
        pytest.raises(LeaseLost, match="taken over by another caller"),
    ):
        stalled_then_resumed(key="stalled-1")

    assert runs == {"charge": 1}  # The next step's side effect never happened.
    [new_owner] = taken_over
    assert set(new_owner.steps) == {"charge"}  # The new owner resumes after the charge.
    assert any("could not be renewed" in r.getMessage() for r in caplog.records)
    # The first call stored nothing and gave back nothing: the key is the new owner's.
    assert the_record().status == "in_progress"
    done = StoredResponse(200, [("Content-Type", "application/json")], b'"done"')
    assert get_store().complete(new_owner, done, timezone.now())
    assert stalled_then_resumed(key="stalled-1") == "done"  # Replayed.
    assert runs == {"charge": 1}


@idempotent_function(key="key", mode="lease", lease=60)
def renewed_while_the_database_is_away(key: str) -> str:
    step("charge", count, "charge")
    original = lose_database(connection)
    try:
        heartbeat().beat()  # The renewal cannot reach the store: the work goes on.
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(original)
    step("ship", count, "ship")
    return "done"


def test_a_renewal_that_cannot_reach_the_store_is_retried_and_the_work_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        assert renewed_while_the_database_is_away(key="away-1") == "done"

    assert runs == {"charge": 1, "ship": 1}
    assert any(r.getMessage().startswith("Could not renew") for r in caplog.records)
    assert the_record().status == "completed"


class LeasedViewSet(IdempotencyMixin, viewsets.ViewSet):
    idempotency_mode = "lease"
    idempotency_lease = 7

    def create(self, request: Request) -> Response:
        record = IdempotencyRecord.objects.get()  # In progress, as the claim wrote it.
        assert record.lease_expires_at is not None
        return Response({"lease": (record.lease_expires_at - record.created_at).total_seconds()})


@idempotent(mode="lease", lease=timedelta(seconds=9))
def leased_view(request: HttpRequest) -> HttpResponse:
    record = IdempotencyRecord.objects.get()
    assert record.lease_expires_at is not None
    return JsonResponse({"lease": (record.lease_expires_at - record.created_at).total_seconds()})


@idempotent(mode="lease", lease=0.15)
def slow_under_atomic_requests(request: HttpRequest) -> HttpResponse:
    time.sleep(0.5)  # Past three renewals' due times: the heartbeat would have run.
    return JsonResponse({"done": True}, status=201)


urlpatterns += [
    path("viewset/", LeasedViewSet.as_view({"post": "create"})),
    path("leased/", leased_view),
    path("atomic-requests/", slow_under_atomic_requests),
]


@pytest.mark.parametrize(("url", "lease"), [("/viewset/", 7), ("/leased/", 9)])
def test_a_views_lease_is_the_one_it_asks_for(url: str, lease: float) -> None:
    response = post(Client(), url, key="lease-1")

    assert response.json() == {"lease": lease}


@pytest.mark.postgresql
@pytest.mark.usefixtures("atomic_requests")
def test_a_lease_mode_claim_inside_the_requests_transaction_is_not_renewed_from_outside(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Another connection cannot see the uncommitted claim: its renewal would find nothing and
    # take the claim for lost. Nobody can take it over before it commits, so none is needed.
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        assert post(Client(), "/atomic-requests/", key="ar-1").status_code == 201
    replay = post(Client(), "/atomic-requests/", key="ar-1")

    assert replay["Idempotent-Replayed"] == "true"
    assert not [r for r in caplog.records if "renew" in r.getMessage()]


@idempotent(mode="lease", lease=60)
def stalled_view(request: HttpRequest) -> HttpResponse:
    step("charge", count, "charge")
    taken_over.append(take_over_running())
    heartbeat().beat()  # The stalled process's heartbeat runs again: its renewal is refused.
    step("ship", count, "ship")
    return JsonResponse({"shipped": True}, status=201)


@idempotent(mode="lease", lease=60)
async def stalled_async_view(request: HttpRequest) -> HttpResponse:
    from asgiref.sync import sync_to_async

    await sync_to_async(step)("charge", count, "charge")
    await sync_to_async(_take_over_and_beat)()
    await sync_to_async(step)("ship", count, "ship")
    return JsonResponse({"shipped": True}, status=201)


def _take_over_and_beat() -> None:
    taken_over.append(take_over_running())
    heartbeat().beat()


urlpatterns += [path("stalled/", stalled_view), path("stalled-async/", stalled_async_view)]


@pytest.mark.parametrize("url", ["/stalled/", "/stalled-async/"])
def test_a_view_whose_key_was_taken_over_answers_409_and_the_retry_gets_the_new_owners_answer(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    taken_over.clear()
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        stalled = post(Client(), url, key="stalled-view")

    assert stalled.status_code == 409  # Not a 500: the work is the new owner's now.
    assert stalled["Content-Type"] == "application/problem+json"
    assert stalled["Retry-After"] == "1"
    assert stalled.json()["type"].endswith("request-in-progress")
    assert runs == {"charge": 1}  # Stopped before its next side effect.
    assert any("A guarded view stopped" in r.getMessage() for r in caplog.records)
    [new_owner] = taken_over
    done = StoredResponse(201, [("Content-Type", "application/json")], b'{"shipped": true}')
    assert get_store().complete(new_owner, done, timezone.now())
    retry = post(Client(), url, key="stalled-view")
    assert (retry.status_code, retry["Idempotent-Replayed"]) == (201, "true")


in_transaction, beside_started = threading.Event(), threading.Event()


@idempotent(mode="lease", lease=LEASE)
def step_in_a_transaction(request: HttpRequest) -> HttpResponse:
    runs["in-transaction"] += 1
    if runs["in-transaction"] == 1:  # A second run (the key taken over) answers at once.
        with transaction.atomic():
            # The step's write keeps the record's row locked until this transaction ends.
            step("charge", count, "charge")
            in_transaction.set()
            assert finish.wait(30), "the test never let the view finish"
    return JsonResponse({"run": runs["in-transaction"]}, status=201)


@idempotent(mode="lease", lease=LEASE)
def beside(request: HttpRequest) -> HttpResponse:
    runs["beside"] += 1
    if runs["beside"] == 1:
        beside_started.set()
        assert finish.wait(30), "the test never let the view finish"
    return JsonResponse({"run": runs["beside"]}, status=201)


urlpatterns += [path("in-transaction/", step_in_a_transaction), path("beside/", beside)]


def _posted(url: str, key: str, answers: list[tuple[str, int, bool]]) -> threading.Thread:
    """POST in a thread of its own (its own connections); the answer is noted with whether the
    work was still running when it came."""

    def request() -> None:
        try:
            response = post(Client(), url, key=key)
            answers.append((url, response.status_code, not finish.is_set()))
        finally:
            connections.close_all()

    thread = threading.Thread(target=request)
    thread.start()
    return thread


@pytest.mark.postgresql
@pytest.mark.mariadb
def test_a_step_saved_inside_the_views_transaction_stalls_no_lease() -> None:
    in_transaction.clear()
    beside_started.clear()
    firsts: list[tuple[str, int, bool]] = []
    first = [
        _posted("/in-transaction/", "locked-1", firsts),
        _posted("/beside/", "beside-1", firsts),
    ]
    assert in_transaction.wait(10) and beside_started.wait(10)
    retries: list[tuple[str, int, bool]] = []
    threads = []
    began = time.monotonic()
    # Time itself is what is tested: retries until a pair is sent after both leases would have
    # run out three times (however slowly a loaded machine sends them).
    while True:
        sent = time.monotonic() - began
        threads.append(_posted("/in-transaction/", "locked-1", retries))
        threads.append(_posted("/beside/", "beside-1", retries))
        if sent >= 3 * LEASE:
            break
        time.sleep(LEASE / 4)
    for thread in threads[-2:]:
        thread.join(30)  # The last pair answered while the work still runs.
    finish.set()
    for thread in [*first, *threads]:
        thread.join(30)

    assert len(retries) == len(threads)  # Every retry was answered.
    # Each retry was answered 409 while the work ran: neither key was taken over.
    assert {(status, during) for _, status, during in retries} == {(409, True)}, retries
    assert sorted(firsts) == [("/beside/", 201, False), ("/in-transaction/", 201, False)]
    assert runs == {"in-transaction": 1, "beside": 1, "charge": 1}
    for url, key in [("/in-transaction/", "locked-1"), ("/beside/", "beside-1")]:
        assert post(Client(), url, key=key)["Idempotent-Replayed"] == "true"


committing, committed = threading.Event(), threading.Event()


@idempotent(mode="lease", lease=LEASE)
def committed_past_the_lease(request: HttpRequest) -> HttpResponse:
    runs["committed-late"] += 1
    if runs["committed-late"] == 1:
        with transaction.atomic():
            step("charge", count, "charge")
            in_transaction.set()
            assert committing.wait(30), "the test never let the transaction commit"
        committed.set()
        assert finish.wait(30), "the test never let the view finish"
    return JsonResponse({"run": runs["committed-late"]}, status=201)


urlpatterns += [path("committed-late/", committed_past_the_lease)]


@pytest.mark.postgresql
@pytest.mark.mariadb
def test_a_transaction_that_saved_a_step_renews_the_lease_as_it_commits() -> None:
    in_transaction.clear()
    committing.clear()
    committed.clear()
    firsts: list[tuple[str, int, bool]] = []
    first = _posted("/committed-late/", "late-1", firsts)
    assert in_transaction.wait(10)
    retries: list[tuple[str, int, bool]] = []
    threads = []
    began = time.monotonic()
    # The transaction stays open twice the lease after its step: the lease that step's write
    # committed has ended by the time it commits.
    while time.monotonic() - began < 2 * LEASE:
        threads.append(_posted("/committed-late/", "late-1", retries))
        time.sleep(LEASE / 4)
    committing.set()
    assert committed.wait(10)
    after_commit: list[tuple[str, int, bool]] = []
    began = time.monotonic()
    while time.monotonic() - began < LEASE:
        _posted("/committed-late/", "late-1", after_commit).join(30)
        time.sleep(LEASE / 4)
    finish.set()
    for thread in [first, *threads]:
        thread.join(30)

    assert {(status, during) for _, status, during in retries} == {(409, True)}, retries
    assert {(status, during) for _, status, during in after_commit} == {(409, True)}, after_commit
    assert firsts == [("/committed-late/", 201, False)]
    assert runs == {"committed-late": 1, "charge": 1}


# What the heartbeat does under gevent or eventlet, in this process (which neither patched: gevent
# hands back the functions it would have saved): tests/test_leases_gevent.py runs it in processes
# that gevent patched.


class RenewalsNoted(BaseStore):
    """A store that notes in which thread each renewal ran."""

    def __init__(self) -> None:
        self.renewed_in: list[str] = []

    def renew(self, claim: Claim, until: datetime) -> bool:
        self.renewed_in.append(threading.current_thread().name)
        return True


class BoundToGreenlets(RenewalsNoted):
    greenlet_bound_connections = True  # A store whose pooled connections are the greenlets'.


class Holding:
    claim: Claim | None  # As a `leases.Holder`'s.

    def __init__(self, store: BaseStore) -> None:
        self.store, self.claim = store, Claim(Outcome.FRESH)

    def lose(self) -> None:
        raise AssertionError("never lost")


def test_under_gevent_a_store_bound_to_the_greenlets_is_renewed_by_a_heartbeat_of_its_own(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    importlib.import_module("gevent.monkey")  # Imported, as under gevent; not patching.
    monkeypatch.setattr(threads, "green", lambda: "gevent")
    beating, native, bound = Heartbeat(), RenewalsNoted(), BoundToGreenlets()
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        holds = [beating.hold(Holding(store), timedelta(minutes=1)) for store in (native, bound)]
        beating.hold(Holding(BoundToGreenlets()), timedelta(minutes=1))  # Warned once.

    beating.beat()
    for hold in holds:
        beating.end(hold)
    beating.beat()  # Ended: renewed no more.

    assert native.renewed_in == bound.renewed_in == ["MainThread"]
    assert holds[0].schedule is beating and holds[1].schedule is not beating
    assert all(hold.ended for hold in holds)
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("Under gevent, the leases of BoundToGreenlets are renewed by a")


def test_under_eventlet_the_heartbeat_says_that_it_is_a_green_thread(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(threads, "green", lambda: "eventlet")
    beating, store = Heartbeat(), RenewalsNoted()
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        hold = beating.hold(Holding(store), timedelta(minutes=1))
        beating.end(beating.hold(Holding(store), timedelta(minutes=1)))

    beating.beat()
    beating.end(hold)

    assert store.renewed_in == ["MainThread"]
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("Under eventlet, idempotency leases are renewed by a green thread")


def test_a_greenlet_waits_for_a_lock_a_native_thread_holds_without_blocking_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    importlib.import_module("gevent.monkey")  # Imported, as under gevent; not patching.
    monkeypatch.setattr(threads, "green", lambda: "gevent")
    lock, released = threads.Lock(), threading.Event()
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:  # The greenlets ran three times: the native thread lets go.
            lock.release()
            released.set()

    monkeypatch.setattr("django_idempotency.threads.time.sleep", nap)

    assert lock.acquire()
    assert not lock.acquire(blocking=False)
    assert not lock.acquire(timeout=0)
    assert lock.acquire(timeout=30)  # Polled, yielding (time.sleep is gevent's) in between.

    assert released.is_set() and naps == [threads.POLL] * 3
    lock.release()


class LockedOnce(RenewalsNoted):
    """A store whose record another transaction holds at the first renewal."""

    def renew(self, claim: Claim, until: datetime) -> bool:
        if not self.renewed_in:
            self.renewed_in.append("locked")
            raise RecordLocked("The record is locked by another transaction.")
        claim.lease_expires_at = until
        return super().renew(claim, until)


def test_a_renewal_that_met_a_locked_record_is_not_announced_and_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    beating, store = Heartbeat(), LockedOnce()
    holding = Holding(store)
    hold = beating.hold(holding, timedelta(minutes=1))

    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        beating.beat()
    assert holding.claim is not None
    assert holding.claim.lease_expires_at is None  # Not renewed, and not said to be.
    [note] = [r for r in caplog.records if r.name == "django_idempotency"]
    assert (note.levelno, note.getMessage()) == (
        logging.INFO,
        "An idempotency lease was not renewed now (retried in 20.0 s): The record is locked by"
        " another transaction.",
    )
    beating.beat()  # The next beat.
    beating.end(hold)

    assert store.renewed_in == ["locked", "MainThread"]
    assert holding.claim.lease_expires_at is not None


def test_green_names_the_library_that_made_threads_greenlets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def patched(*names: str) -> SimpleNamespace:
        return SimpleNamespace(
            is_module_patched=lambda name: name in names,
            is_monkey_patched=lambda name: name in names,
        )

    monkeypatch.setitem(sys.modules, "gevent.monkey", patched("socket"))
    monkeypatch.setitem(sys.modules, "eventlet.patcher", patched("socket"))
    assert threads.green() is None  # Imported, or patching something else: threads are threads.
    monkeypatch.setitem(sys.modules, "eventlet.patcher", patched("thread"))
    assert threads.green() == "eventlet"
    monkeypatch.setitem(sys.modules, "gevent.monkey", patched("threading"))
    assert threads.green() == "gevent"


# The heartbeat's own failure paths, each driven by a store that fails one way.


class RenewNotImplemented(RenewalsNoted):
    """A store of the project's that does not implement renew(), as the store contract allows."""

    def renew(self, claim: Claim, until: datetime) -> bool:
        self.renewed_in.append(threading.current_thread().name)
        raise NotImplementedError


def test_a_store_without_renew_is_warned_about_once_and_never_asked_to_renew_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    beating, store, another = Heartbeat(), RenewNotImplemented(), RenewNotImplemented()
    holds = [beating.hold(Holding(store), timedelta(minutes=1)) for _ in range(2)]

    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        beating.beat()
        holds.append(beating.hold(Holding(another), timedelta(minutes=1)))
        beating.beat()
    for hold in holds:
        beating.end(hold)

    # Asked once, for one hold; no store of its kind was asked since.
    assert (store.renewed_in, another.renewed_in) == (["MainThread"], [])
    [warning] = [r.getMessage() for r in caplog.records if r.name == "django_idempotency"]
    assert warning == (
        "RenewNotImplemented does not implement renew(): leases are not renewed, so work longer"
        " than its lease may run twice. Implement renew() (see the store contract)."
    )


class FailsOnce(RenewalsNoted):
    """A store whose first renewal fails with `failure`; the next ones succeed."""

    def __init__(self, failure: Exception) -> None:
        super().__init__()
        self.failure = failure

    def renew(self, claim: Claim, until: datetime) -> bool:
        if not self.renewed_in:
            self.renewed_in.append("failed")
            raise self.failure
        return super().renew(claim, until)


@pytest.mark.parametrize(
    ("failure", "level", "message"),
    [
        (
            StoreUnavailable("connection refused"),
            logging.WARNING,
            "Could not renew an idempotency lease (retried in 20.0 s): connection refused",
        ),
        (
            ValueError("a bug in the store"),
            logging.ERROR,
            "Could not renew an idempotency lease; retried at the next beat",
        ),
    ],
    ids=["store-unavailable", "unexpected"],
)
def test_a_renewal_that_failed_is_logged_and_tried_again_at_the_next_beat_the_work_going_on(
    failure: Exception, level: int, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    beating, store = Heartbeat(), FailsOnce(failure)
    hold = beating.hold(Holding(store), timedelta(minutes=1))  # Holding: never lost.

    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        beating.beat()
    beating.beat()  # The next beat.
    beating.end(hold)

    assert store.renewed_in == ["failed", "MainThread"]
    [logged] = [r for r in caplog.records if r.name == "django_idempotency"]
    assert (logged.levelno, logged.getMessage()) == (level, message)
    # An unexpected error is a bug somewhere: its traceback goes with it.
    assert (logged.exc_info is not None) is (level == logging.ERROR)


class EndsOthers(RenewalsNoted):
    """A store during whose renewals the work of other holds ends (`ending`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ending: list[Hold] = []

    def renew(self, claim: Claim, until: datetime) -> bool:
        while self.ending:
            hold = self.ending.pop()
            assert hold.schedule is not None
            hold.schedule.end(hold)
        return super().renew(claim, until)


def test_a_hold_that_ends_while_a_beat_renews_another_is_not_renewed() -> None:
    beating, first, second = Heartbeat(), EndsOthers(), RenewalsNoted()
    holds = [beating.hold(Holding(store), timedelta(minutes=1)) for store in (first, second)]
    first.ending.append(holds[1])

    beating.beat()
    beating.end(holds[0])

    assert first.renewed_in == ["MainThread"]
    assert second.renewed_in == []  # Its work ended before its turn came.


def test_holds_that_end_before_or_during_the_threads_round_are_not_renewed() -> None:
    beating, first, others = Heartbeat(), EndsOthers(), RenewalsNoted()
    # Due together, in 0.5 s: long after the holds below ended (in a few microseconds).
    lease = timedelta(seconds=1.5)
    renewed, during, before = (beating.hold(Holding(s), lease) for s in (first, others, others))
    beating.end(before)  # Behind the first, kept in the schedule until it comes due.
    first.ending.append(during)  # Ends while the round renews the first.

    wait_for(lambda: bool(first.renewed_in), 10)
    beating.end(renewed)

    assert set(first.renewed_in) == {"django-idempotency-heartbeat"}
    assert others.renewed_in == []


def test_the_schedule_drops_ended_holds_kept_behind_a_long_one_once_they_are_most_of_it() -> None:
    beating, store = Heartbeat(), RenewalsNoted()
    long = beating.hold(Holding(store), timedelta(minutes=1))  # Due first: at the head.
    behind = [beating.hold(Holding(store), timedelta(minutes=2)) for _ in range(COMPACT_AFTER + 1)]
    for hold in behind[:-1]:
        beating.end(hold)
        beating.end(hold)  # Ended again: counted once.
    assert len(beating._due) == COMPACT_AFTER + 2  # Up to COMPACT_AFTER are kept.

    beating.end(behind[-1])  # One more: rebuilt without them, as large as the work running.
    assert len(beating._due) == 1
    beating.beat()
    beating.end(long)

    assert store.renewed_in == ["MainThread"]  # The long one, still renewed.


class Killed(BaseException):
    """What ends a thread short of any Exception (as GreenletExit ends a greenlet killed)."""


class KillsOnce(RenewalsNoted):
    """A store whose first renewal kills the thread making it."""

    def renew(self, claim: Claim, until: datetime) -> bool:
        if not self.renewed_in:
            self.renewed_in.append("killed")
            raise Killed
        return super().renew(claim, until)


def test_a_heartbeat_thread_that_died_is_started_again_by_the_next_hold() -> None:
    died: list[BaseException | None] = []
    hook, threading.excepthook = threading.excepthook, lambda args: died.append(args.exc_value)
    try:
        beating, store = Heartbeat(), KillsOnce()
        lease = timedelta(seconds=0.3)  # Due in 0.1 s.
        killed = beating.hold(Holding(store), lease)
        wait_for(lambda: bool(died), 10)
        hold = beating.hold(Holding(store), lease)
        wait_for(lambda: "django-idempotency-heartbeat" in store.renewed_in, 10)
        beating.end(hold)
        beating.end(killed)
    finally:
        threading.excepthook = hook

    assert [type(exc) for exc in died] == [Killed]
    assert store.renewed_in[0] == "killed"


def test_a_hold_made_after_a_fork_goes_to_a_schedule_of_the_childs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    beating, parents, childs = Heartbeat(), RenewalsNoted(), RenewalsNoted()
    parent_hold = beating.hold(Holding(parents), timedelta(minutes=1))
    # A fork as the heartbeat sees it, another process id, in this process: a forked child's
    # own lines are not measured (it leaves with os._exit). The next test forks for real.
    pid = os.getpid()
    with monkeypatch.context() as forked:
        forked.setattr(os, "getpid", lambda: pid + 1)
        child_hold = beating.hold(Holding(childs), timedelta(minutes=1))

    beating.beat()
    for hold in (child_hold, parent_hold):
        beating.end(hold)

    assert (parents.renewed_in, childs.renewed_in) == ([], ["MainThread"])


def test_a_forked_worker_renews_its_own_holds_in_a_heartbeat_thread_of_its_own() -> None:
    # A server forks its workers from a process that may hold claims: the parent's thread is
    # not the child's, and the parent's holds are not the child's to renew.
    beating, parents = Heartbeat(), RenewalsNoted()
    parent_hold = beating.hold(Holding(parents), timedelta(minutes=1))  # Its thread started.

    def in_the_worker() -> dict[str, list[str]]:
        childs = RenewalsNoted()
        child_hold = beating.hold(Holding(childs), timedelta(seconds=0.3))  # Due in 0.1 s.
        wait_for(lambda: bool(childs.renewed_in), 10)
        beating.beat()
        beating.end(child_hold)
        return {"child": childs.renewed_in, "parent": parents.renewed_in}

    renewed = in_a_forked_child(in_the_worker)
    beating.end(parent_hold)

    assert renewed["child"][0] == "django-idempotency-heartbeat"
    assert renewed["child"][-1] == "MainThread"  # Its beat: its own hold only.
    assert renewed["parent"] == []
    assert parents.renewed_in == []  # Nor renewed here: due in 20 s.


def test_a_short_lease_held_while_the_thread_sleeps_toward_a_long_one_is_renewed_in_time() -> None:
    beating, store = Heartbeat(), RenewalsNoted()
    long = beating.hold(Holding(store), timedelta(minutes=1))  # The thread sleeps 20 s for it.
    ended = beating.hold(Holding(store), timedelta(minutes=2))
    beating.end(ended)
    wait_for(lambda: beating._wakes_at > time.monotonic() + 10, 10)  # Asleep toward `long`.
    short = beating.hold(Holding(store), timedelta(seconds=0.3))  # Due in 0.1 s: wakes it.

    wait_for(lambda: "django-idempotency-heartbeat" in store.renewed_in, 2)
    beating.end(short)
    beating.end(long)

    assert store.renewed_in[0] == "django-idempotency-heartbeat"
