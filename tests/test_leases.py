"""Leases renewed while the work runs: a long view keeps its key, and lost work learns it."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.urls import path
from django.utils import timezone
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from django_idempotency import idempotent, idempotent_function
from django_idempotency.attempts import current_attempt
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.core.outcomes import Claim, Outcome, StoredResponse
from django_idempotency.exceptions import LeaseLost
from django_idempotency.leases import heartbeat
from django_idempotency.models import IdempotencyRecord
from django_idempotency.steps import step
from django_idempotency.stores import ClaimRequest, get_store
from tests.stores import the_record
from tests.utils import lose_database, post

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
    # Time itself is what is tested: the lease would have run out three times by the end.
    while time.monotonic() - began < 3 * LEASE:
        duplicates.append(post(Client(), "/long/", key="long-1").status_code)
        time.sleep(LEASE / 4)
    finish.set()
    first.join(10)
    replay = post(Client(), "/long/", key="long-1")

    assert set(duplicates) == {409}, duplicates  # Never taken over: the lease was renewed.
    assert len(duplicates) >= 10
    assert answers["first"].status_code == 201
    assert replay["Idempotent-Replayed"] == "true" and replay.json() == {"run": 1}
    assert runs == {"long": 1}


def _take_over() -> Claim:
    """Another caller takes the running call's key over, as if its lease had run out (the
    process stalled two minutes, its heartbeat too)."""
    attempt = current_attempt()
    assert attempt is not None and attempt.claim is not None and attempt.scope is not None
    held = attempt.claim
    assert held.fingerprint is not None
    request = ClaimRequest(
        scope=attempt.scope,
        fingerprint=held.fingerprint,
        method=held.method,
        path=held.path,
        now=timezone.now() + timedelta(minutes=2),
        ttl=timedelta(hours=1),
        lease=timedelta(seconds=60),
    )
    claim = get_store().begin(request)
    assert claim.outcome is Outcome.FRESH
    return claim


def count(name: str) -> str:
    runs[name] += 1
    return name


taken_over: list[Claim] = []


@idempotent_function(key="key", mode="lease", lease=60)
def stalled_then_resumed(key: str) -> str:
    step("charge", count, "charge")
    taken_over.append(_take_over())
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
    taken_over.append(_take_over())
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
    taken_over.append(_take_over())
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
