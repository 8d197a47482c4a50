"""One claim from begin to complete: its log lines, a lease outlived, a store lost at the end."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import DataError, connection, connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.test.client import AsyncClient
from django.urls import path

from django_idempotency import attempts, idempotent, idempotent_function
from django_idempotency.attempts import Attempt, current_attempt
from django_idempotency.core.outcomes import (
    NOT_STORED_HEADER,
    Claim,
    Outcome,
    StoredResponse,
    is_not_stored,
)
from django_idempotency.exceptions import KeyInProgress, LeaseLost
from django_idempotency.leases import heartbeat
from django_idempotency.models import IdempotencyRecord
from django_idempotency.steps import step
from django_idempotency.stores import UnstorableResponse, get_store
from django_idempotency.stores.database import DatabaseStore
from tests.models import Charge
from tests.stores import claim_request, take_over_running, the_record
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


# The failure paths of one attempt: a claim lost or left held, a result the store refuses, a
# lease that cannot be renewed before a step, a step's result refused.

runs: Counter[str] = Counter()  # How many times each piece of work ran.
new_owners: list[Claim] = []  # The claims of the retries that took a running operation over.


@pytest.fixture(autouse=True)
def nothing_ran_yet() -> None:
    runs.clear()
    new_owners.clear()


def count(name: str) -> str:
    runs[name] += 1
    return name


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def taken_over_after_its_last_step(key: str) -> str:
    step("charge", count, "charge")
    new_owners.append(take_over_running())
    heartbeat().beat()  # The stalled process's heartbeat runs again: its renewal is refused.
    return "charged"


def test_work_whose_renewal_found_its_key_taken_over_returns_but_stores_nothing(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        # No step follows to stop it: the caller gets what the work returned.
        assert taken_over_after_its_last_step(key="lost-1") == "charged"

    assert any(
        r.getMessage().startswith(
            "A renewal of this lease found the key taken over by another caller; this result"
            " was not stored."
        )
        for r in caplog.records
    )
    # The key is the new owner's: a retry waits for its answer, never gets this one's.
    assert the_record().status == "in_progress"
    with pytest.raises(KeyInProgress):
        taken_over_after_its_last_step(key="lost-1")
    [new_owner] = new_owners
    done = StoredResponse(200, [("Content-Type", "application/json")], b'"resumed"')
    assert get_store().complete(new_owner, done, get_store().now())
    assert taken_over_after_its_last_step(key="lost-1") == "resumed"
    assert runs == {"charge": 1}


def test_an_attempt_completed_then_completed_or_released_again_keeps_its_first_result(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    attempt = Attempt(atomic=False, on_conflict="reject")
    with caplog.at_level(logging.INFO, logger="django_idempotency"):
        assert attempt.begin(claim_request()).outcome is Outcome.FRESH
        assert attempt.complete(StoredResponse(201, [], b"first"))
        assert not attempt.complete(StoredResponse(201, [], b"second"))  # No claim to complete.
        attempt.release()  # Nor to give back: the stored result stays for every retry.

    outcomes = [getattr(r, "idempotency_outcome", None) for r in caplog.records]
    assert [outcome for outcome in outcomes if outcome] == ["claimed", "completed"]
    record = the_record()
    assert (record.status, record.response_body) == ("completed", b"first")


def test_leaving_an_attempts_block_with_its_claim_held_ends_its_work_there_not_its_claim(
    store: str,
) -> None:
    with Attempt(atomic=False, on_conflict="reject") as attempt:
        assert attempt.begin(claim_request()).outcome is Outcome.FRESH
        assert current_attempt() is attempt

    # Code after the block is no part of the operation: its step just runs, and is not stored.
    assert current_attempt() is None
    assert step("after", count, "after") == "after"
    assert attempt.steps == {}
    # The claim is still held until the attempt completes it, later.
    assert get_store().begin(claim_request()).outcome is Outcome.IN_PROGRESS
    assert attempt.complete(StoredResponse(201, [], b"late"))
    assert current_attempt() is None
    replay = get_store().begin(claim_request())
    assert replay.outcome is Outcome.REPLAY
    assert replay.response is not None and replay.response.body == b"late"
    assert runs == {"after": 1}


class RefusesTheResponse(DatabaseStore):
    """The database store, refusing a response with an error it could not foresee (a value its
    driver rejects); a record that the work ran, it takes."""

    why = "invalid byte sequence for encoding UTF8"

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        if not is_not_stored(response):
            raise DataError(self.why)
        return super().complete(claim, response, now)


class RefusesEverything(DatabaseStore):
    """The database store, refusing every response, a record that the work ran included."""

    refusal: Exception = UnstorableResponse("this store refuses every response")

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        raise self.refusal


@override_settings(
    IDEMPOTENCY_STORE="tests.test_attempts.RefusesTheResponse", IDEMPOTENCY_MODE="lease"
)
def test_a_response_refused_with_an_unforeseen_error_is_kept_as_not_stored_and_never_run_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="django_idempotency"):
        first = post(Client(), URL, key="refused-1")
    retry = post(Client(), URL, key="refused-1")

    assert first.status_code == 201  # The work ran: the client gets its answer.
    problem = assert_problem(retry, 410, "response-not-stored")
    assert "completed with status 201" in problem["detail"]
    assert "could not be stored" in problem["detail"]
    assert Charge.objects.count() == 1
    [warning] = [r.getMessage() for r in caplog.records if r.name == "django_idempotency"]
    assert warning.startswith(
        "The result could not be stored (invalid byte sequence for encoding UTF8); a record"
        " that it ran was kept instead"
    )


@override_settings(
    IDEMPOTENCY_STORE="tests.test_attempts.RefusesTheResponse", IDEMPOTENCY_MODE="lease"
)
def test_the_record_of_a_refused_response_keeps_the_first_200_characters_of_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(RefusesTheResponse, "why", "0123456789" * 30)
    post(Client(), URL, key="refused-3")

    [(name, why)] = IdempotencyRecord.objects.get().response_headers
    assert (name, why) == (NOT_STORED_HEADER, ("0123456789" * 30)[:200])


@pytest.mark.parametrize(
    "refusal",
    [UnstorableResponse("refused: too odd to keep"), DataError("refused: out of range")],
    ids=["foreseen", "unforeseen"],
)
@override_settings(
    IDEMPOTENCY_STORE="tests.test_attempts.RefusesEverything", IDEMPOTENCY_MODE="lease"
)
def test_a_store_refusing_even_the_record_that_the_work_ran_holds_the_key_until_the_lease_ends(
    refusal: Exception, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(RefusesEverything, "refusal", refusal)
    with caplog.at_level(logging.ERROR, logger="django_idempotency"):
        first = post(Client(), URL, key="refused-2")
    retry = post(Client(), URL, key="refused-2")

    assert first.status_code == 201  # The work ran: the client gets its answer.
    [logged] = [r for r in caplog.records if r.name == "django_idempotency"]
    assert logged.getMessage() == "The response could not be stored, nor a record that it ran"
    assert logged.exc_info is not None and logged.exc_info[1] is refusal
    # Never given back, which would run the work again at once: held until the lease ends.
    assert_problem(retry, 409, "request-in-progress")
    assert IdempotencyRecord.objects.get().status == "in_progress"
    assert Charge.objects.count() == 1


def _lease_left(seconds: float) -> None:
    """What a slow process leaves: the running claim's lease ends `seconds` from now, by the
    store's clock (less than half the lease: the next step renews it first)."""
    attempt = current_attempt()
    assert attempt is not None and attempt.claim is not None
    store = attempt.store
    assert isinstance(store, DatabaseStore)
    # The database store's own renew: the store under test may refuse it.
    assert DatabaseStore.renew(store, attempt.claim, store.now() + timedelta(seconds=seconds))


def _database_back(original: dict[str, Any]) -> None:
    connection.close()
    connection.settings_dict.clear()
    connection.settings_dict.update(original)


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def ship_through_an_outage(key: str) -> str:
    step("charge", count, "charge")
    _lease_left(10)
    original = lose_database(connection)

    def ship() -> str:  # The database is back by the time the shipment is made.
        _database_back(original)
        return count("ship")

    return step("ship", ship)


def test_a_step_that_cannot_reach_the_store_to_renew_a_live_lease_runs_and_is_stored(
    restore_database: Callable[[], None],
) -> None:
    # The lease is still this attempt's: nobody can take the key over before it ends.
    assert ship_through_an_outage(key="outage-1") == "ship"
    assert ship_through_an_outage(key="outage-1") == "ship"  # Replayed.

    assert runs == {"charge": 1, "ship": 1}
    assert the_record().status == "completed"


class WithoutRenew(DatabaseStore):
    """A store of the project's that does not implement renew(), as the store contract allows."""

    def renew(self, claim: Claim, until: datetime) -> bool:
        raise NotImplementedError


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def ship_with_a_lease_left(key: str, left: float) -> str:
    step("charge", count, "charge")
    _lease_left(left)
    return step("ship", count, "ship")


@override_settings(IDEMPOTENCY_STORE="tests.test_attempts.WithoutRenew")
def test_a_step_on_a_store_without_renew_runs_while_its_lease_lives() -> None:
    assert ship_with_a_lease_left("left-1", 10) == "ship"

    assert runs == {"charge": 1, "ship": 1}
    assert the_record().status == "completed"


@override_settings(IDEMPOTENCY_STORE="tests.test_attempts.WithoutRenew")
def test_a_step_on_a_store_without_renew_stops_before_its_effect_once_its_lease_ran_out() -> None:
    # The key may have been taken over meanwhile, which cannot be known without renew().
    with pytest.raises(LeaseLost, match="lease ran out and could not be renewed"):
        ship_with_a_lease_left("left-2", 0)

    assert runs == {"charge": 1}


@override_settings(IDEMPOTENCY_STORE="tests.test_attempts.WithoutRenew")
def test_a_lease_a_store_without_renew_could_not_renew_says_why() -> None:
    with pytest.raises(LeaseLost, match=r"could not be renewed \(NotImplementedError\)"):
        ship_with_a_lease_left("left-3", 0)


@override_settings(IDEMPOTENCY_STORE="tests.test_attempts.WithoutRenew")
def test_a_retry_after_a_lease_a_store_without_renew_could_not_renew_resumes_after_its_step() -> (
    None
):
    # LeaseLost says "a retry runs the work from its last stored step"; docs/steps.md: once a
    # step is stored, a failing attempt keeps its record for the retry to resume.
    with pytest.raises(LeaseLost):
        ship_with_a_lease_left("left-4", 0)

    assert ship_with_a_lease_left("left-4", 10) == "ship"
    assert runs == {"charge": 1, "ship": 1}


class RenewalUnderWay(DatabaseStore):
    """The database store, whose renewals from another thread than the work's (the heartbeat's)
    wait, once under way, for the work's next reading of the store's clock: the step checking
    its lease then finds a renewal of the heartbeat's under way."""

    def __init__(self) -> None:
        super().__init__()
        self.under_way, self.clock_read = threading.Event(), threading.Event()
        self.renewed_in: list[str] = []

    def now(self) -> datetime:
        if self.under_way.is_set():
            self.clock_read.set()
        return super().now()

    def renew(self, claim: Claim, until: datetime) -> bool:
        if threading.current_thread() is not threading.main_thread():
            self.under_way.set()
            assert self.clock_read.wait(30), "the work never read the clock"
        self.renewed_in.append(threading.current_thread().name)
        return super().renew(claim, until)


def _beat_elsewhere() -> None:
    try:
        heartbeat().beat()
    finally:
        connections.close_all()  # This thread's own connections.


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def ship_as_the_heartbeat_renews(key: str, taken_over: bool) -> str:
    step("charge", count, "charge")
    _lease_left(10)  # A renewal is due: the heartbeat's, and the step's if the heartbeat's fails.
    if taken_over:
        new_owners.append(take_over_running())
    store = get_store()
    assert isinstance(store, RenewalUnderWay)
    beating = threading.Thread(target=_beat_elsewhere, name="heartbeat")
    beating.start()
    try:
        assert store.under_way.wait(30)
        return step("ship", count, "ship")
    finally:
        beating.join(30)


@pytest.fixture
def renewals_under_way(monkeypatch: pytest.MonkeyPatch) -> Iterator[RenewalUnderWay]:
    # However slow the heartbeat's renewal on this machine, the step waits it out.
    monkeypatch.setattr(attempts, "HEARTBEAT_WAIT", 30.0)
    with override_settings(IDEMPOTENCY_STORE="tests.test_attempts.RenewalUnderWay"):
        store = get_store()
        assert isinstance(store, RenewalUnderWay)
        yield store


def test_a_step_that_finds_the_heartbeats_renewal_under_way_waits_for_it_and_renews_no_more(
    renewals_under_way: RenewalUnderWay,
) -> None:
    assert ship_as_the_heartbeat_renews("beat-1", False) == "ship"

    assert renewals_under_way.renewed_in == ["heartbeat"]  # The step did not renew it again.
    assert runs == {"charge": 1, "ship": 1}
    assert the_record().status == "completed"


def test_a_step_that_finds_the_heartbeats_renewal_under_way_stops_if_it_found_the_key_taken(
    renewals_under_way: RenewalUnderWay, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="django_idempotency"),
        pytest.raises(LeaseLost, match="taken over by another caller"),
    ):
        ship_as_the_heartbeat_renews("beat-2", True)

    assert runs == {"charge": 1}  # Stopped before the shipment.
    # The heartbeat's renewal, refused; then the failing attempt ending its lease, refused too:
    # the step itself renewed nothing.
    assert renewals_under_way.renewed_in == ["heartbeat", "MainThread"]
    assert any("could not be renewed" in r.getMessage() for r in caplog.records)
    [new_owner] = new_owners
    assert set(new_owner.steps) == {"charge"}  # The new owner resumes after the charge.


def _taken_over_elsewhere() -> None:
    """Another process takes the running operation's key over, on a connection of its own."""
    context = contextvars.copy_context()  # The running operation, as take_over_running finds it.

    def take_over() -> None:
        try:
            new_owners.append(context.run(take_over_running))
        finally:
            connections.close_all()

    elsewhere = threading.Thread(target=take_over)
    elsewhere.start()
    elsewhere.join(30)


def ship_then_stall() -> str:
    """The shipment is made, then the process stalls past its lease, its heartbeat too: the
    client's retry takes the key over meanwhile."""
    runs["ship"] += 1
    _taken_over_elsewhere()
    return "ship"


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def ship_and_stall(key: str, in_transaction: bool) -> str:
    step("charge", count, "charge")
    with transaction.atomic() if in_transaction else contextlib.nullcontext():
        step("ship", ship_then_stall)
    return "shipped"


@pytest.mark.parametrize("in_transaction", [False, True], ids=["alone", "in-a-transaction"])
def test_a_step_whose_key_was_taken_over_while_it_ran_stores_nothing_and_stops_the_work(
    in_transaction: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="django_idempotency"),
        pytest.raises(
            LeaseLost,
            match=r"The result of step 'ship' was not stored: the idempotency claim was taken"
            " over by another caller",
        ),
    ):
        ship_and_stall("stall-1", in_transaction)

    assert runs == {"charge": 1, "ship": 1}
    [new_owner] = new_owners
    assert set(new_owner.steps) == {"charge"}  # The new owner ships again: it was not stored.
    # The failing attempt gave nothing back: the key is the new owner's.
    assert any("was not released: the key was taken over" in r.getMessage() for r in caplog.records)
    assert the_record().status == "in_progress"
