"""Signals: each carries the request (None outside HTTP); a failing receiver fails nothing.

Also the cache tier's hit or miss and the purge report, which metrics of any kind can count.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.cache import caches
from django.core.management import call_command
from django.dispatch import Signal
from django.http import HttpRequest
from django.test import Client, override_settings
from django.test.client import AsyncClient
from django.utils import timezone

from django_idempotency import idempotent_function, signals
from django_idempotency.core.outcomes import Claim, Scope
from django_idempotency.purge import PurgeReport, purge_expired_records
from django_idempotency.stores.cache import CacheTier
from tests.factories import IdempotencyRecordFactory
from tests.models import Charge
from tests.stores import hold, take_over_running, the_record
from tests.utils import ViewKind, assert_problem, post, redis_caches


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """(outcome, keyword arguments) of every signal sent during the test."""
    seen: list[tuple[str, dict[str, Any]]] = []
    receivers = {}
    for outcome, signal in signals.BY_OUTCOME.items():

        def receiver(sender: Any, outcome: str = outcome, **kwargs: Any) -> None:
            seen.append((outcome, kwargs))

        receivers[outcome] = receiver
        signal.connect(receiver)
    yield seen
    for outcome, signal in signals.BY_OUTCOME.items():
        signal.disconnect(receivers[outcome])


@pytest.mark.django_db
@pytest.mark.parametrize(
    "view_kind",
    [ViewKind.FUNCTION, ViewKind.DRF_APIVIEW, ViewKind.VIEWSET_MIXIN],
    ids=lambda kind: kind.name.lower(),
)
def test_every_signal_of_a_request_carries_its_http_request(
    client: Client, received: list[tuple[str, dict[str, Any]]], view_kind: ViewKind
) -> None:
    post(client, view_kind.url)
    post(client, view_kind.url)
    post(client, view_kind.url, {"amount": 99})

    assert [outcome for outcome, _ in received] == ["claimed", "completed", "replayed", "mismatch"]
    for _, kwargs in received:
        request = kwargs["request"]
        assert isinstance(request, HttpRequest)
        assert (request.method, request.path) == ("POST", view_kind.url)
        assert request.headers["Idempotency-Key"] == kwargs["key"] == "key-1"


@pytest.mark.django_db
def test_a_released_key_signals_with_its_request(
    client: Client, received: list[tuple[str, dict[str, Any]]]
) -> None:
    post(client, "/function/charges/", outcome="invalid")

    assert [outcome for outcome, _ in received] == ["claimed", "released"]
    assert received[1][1]["request"].path == "/function/charges/"


@idempotent_function(key="invoice")
def send_invoice(invoice: str) -> str:
    return f"sent {invoice}"


@pytest.mark.django_db
def test_signals_outside_http_carry_no_request(
    received: list[tuple[str, dict[str, Any]]],
) -> None:
    send_invoice("inv-1")
    send_invoice("inv-1")

    assert [outcome for outcome, _ in received] == ["claimed", "completed", "replayed"]
    assert [kwargs["request"] for _, kwargs in received] == [None, None, None]


def duplicate_of_a_held_request() -> Any:
    """An async view's duplicate of a request still running (its key held): the response."""
    hold(Scope("default", "", "held"), ViewKind.ASYNC_FUNCTION.url, {"amount": 10})
    return async_to_sync(AsyncClient().post)(
        ViewKind.ASYNC_FUNCTION.url,
        {"amount": 10},
        "application/json",
        headers={"Idempotency-Key": "held"},
    )


@pytest.mark.django_db(transaction=True)
@override_settings(IDEMPOTENCY_ON_CONFLICT="wait", IDEMPOTENCY_WAIT_TIMEOUT=0.3)
def test_an_async_duplicate_that_gives_up_waiting_signals_one_conflict_with_its_wait(
    received: list[tuple[str, dict[str, Any]]],
) -> None:
    response = duplicate_of_a_held_request()

    assert response.status_code == 409
    [(outcome, kwargs)] = received  # Not one per try: one for the request.
    assert outcome == "conflict"
    # The time it waited (0.3 s and what the tries took), not a clock reading.
    assert 0.3 <= kwargs["duration"] < 60
    assert kwargs["request"].path == ViewKind.ASYNC_FUNCTION.url
    assert Charge.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("on_conflict", "wait_timeout"),
    [("wait", 0), ("reject", 30)],
    ids=["no-time-to-wait", "reject"],
)
def test_an_async_duplicate_that_does_not_wait_is_409_at_once_and_signalled(
    received: list[tuple[str, dict[str, Any]]], on_conflict: str, wait_timeout: int
) -> None:
    with override_settings(
        IDEMPOTENCY_ON_CONFLICT=on_conflict, IDEMPOTENCY_WAIT_TIMEOUT=wait_timeout
    ):
        response = duplicate_of_a_held_request()

    assert_problem(response, 409, "request-in-progress")
    [(outcome, kwargs)] = received
    assert outcome == "conflict"
    assert kwargs["duration"] < 30  # Answered without waiting out a wait timeout.
    assert Charge.objects.count() == 0


def broken_receiver(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("the statsd host is gone")


@pytest.fixture
def broken_receivers() -> Iterator[None]:
    connected: list[Signal] = list(signals.BY_OUTCOME.values())
    for signal in connected:
        signal.connect(broken_receiver)
    yield
    for signal in connected:
        signal.disconnect(broken_receiver)


@pytest.mark.django_db
@pytest.mark.usefixtures("broken_receivers")
def test_a_failing_receiver_never_fails_the_request_and_is_logged(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django.dispatch"):
        first = post(client, "/viewset/charges/")
        retry = post(client, "/viewset/charges/")

    assert first.status_code == retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1
    failures = [record for record in caplog.records if record.name == "django.dispatch"]
    assert len(failures) == 3  # claimed, completed, replayed
    assert all("broken_receiver" in record.getMessage() for record in failures)
    assert all(
        record.exc_info and str(record.exc_info[1]) == "the statsd host is gone"
        for record in failures
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("broken_receivers")
def test_a_failing_receiver_never_fails_an_idempotent_function() -> None:
    assert send_invoice("inv-2") == send_invoice("inv-2") == "sent inv-2"


# The cache tier and purges.


@pytest.fixture
def cache_tier() -> Iterator[None]:
    """The cache tier on a local-memory cache of its own, empty at the start."""
    locmem = "django.core.cache.backends.locmem.LocMemCache"
    with override_settings(
        CACHES={
            "default": {"BACKEND": locmem},
            "idempotency": {"BACKEND": locmem, "LOCATION": "tier"},
        },
        IDEMPOTENCY_CACHE="idempotency",
    ):
        caches["idempotency"].clear()
        yield


def connected_to(signal: Signal) -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """(sender, keyword arguments) of every `signal` sent while the fixture is in use."""
    seen: list[tuple[Any, dict[str, Any]]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append((sender, kwargs))

    signal.connect(receiver)
    yield seen
    signal.disconnect(receiver)


@pytest.fixture
def lookups() -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    yield from connected_to(signals.cache_lookup)


@pytest.fixture
def purges() -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    yield from connected_to(signals.purged)


def hits(lookups: list[tuple[Any, dict[str, Any]]]) -> list[tuple[bool, str]]:
    return [(kwargs["hit"], kwargs["namespace"]) for _, kwargs in lookups]


@pytest.mark.django_db(transaction=True)  # Records reach the cache after their commit.
@pytest.mark.usefixtures("cache_tier")
def test_each_lookup_of_the_cache_tier_signals_a_hit_or_a_miss(
    client: Client, lookups: list[tuple[Any, dict[str, Any]]]
) -> None:
    post(client, "/function/charges/")  # A new key: a miss.
    assert post(client, "/function/charges/")["Idempotent-Replayed"] == "true"
    assert post(client, "/function/charges/", {"amount": 2}).status_code == 422
    post(client, "/viewset/charges/refund/")

    assert hits(lookups) == [
        (False, "default"),
        (True, "default"),  # The replay, from the cache.
        (True, "default"),  # The mismatch, from the cache too.
        (False, "refunds"),
    ]
    assert {sender for sender, _ in lookups} == {CacheTier}


@pytest.mark.django_db(transaction=True)
def test_a_cache_error_signals_a_miss(
    client: Client, lookups: list[tuple[Any, dict[str, Any]]]
) -> None:
    # Nothing listens on port 9: every cache call fails, and the store answers.
    with override_settings(
        CACHES=redis_caches("redis://127.0.0.1:9/0"), IDEMPOTENCY_CACHE="idempotency"
    ):
        post(client, "/function/charges/")
        assert post(client, "/function/charges/")["Idempotent-Replayed"] == "true"

    assert hits(lookups) == [(False, "default"), (False, "default")]


@pytest.mark.django_db
def test_without_the_cache_tier_no_lookup_is_signalled(
    client: Client, lookups: list[tuple[Any, dict[str, Any]]]
) -> None:
    post(client, "/function/charges/")
    post(client, "/function/charges/")

    assert lookups == []


@pytest.fixture
def leftovers() -> None:
    past = timezone.now() - timedelta(minutes=5)
    IdempotencyRecordFactory.create_batch(3, expires_at=past)
    # Abandoned claims past their expiry (a crashed claim within its TTL stays for its retry).
    IdempotencyRecordFactory.create_batch(
        2, in_progress=True, lease_expires_at=past, expires_at=past
    )
    IdempotencyRecordFactory(namespace="refunds", expires_at=past)
    IdempotencyRecordFactory()  # Live: never purged.


@pytest.mark.django_db
@pytest.mark.usefixtures("leftovers")
def test_a_purge_signals_its_report(purges: list[tuple[Any, dict[str, Any]]]) -> None:
    report = purge_expired_records(batch_size=2)

    assert purges == [
        (PurgeReport, {"signal": signals.purged, "report": report, "namespace": None})
    ]
    assert (report.expired, report.abandoned, report.total) == (4, 2, 6)
    assert report.batches >= 3
    assert not report.dry_run


@pytest.mark.django_db
@pytest.mark.usefixtures("leftovers")
def test_a_dry_run_and_a_namespace_are_in_the_signal(
    purges: list[tuple[Any, dict[str, Any]]],
) -> None:
    call_command("idempotency_purge", "--dry-run", stdout=StringIO())
    call_command("idempotency_purge", "--namespace", "refunds", stdout=StringIO())

    dry, refunds = (kwargs for _, kwargs in purges)
    assert (dry["report"].dry_run, dry["report"].total, dry["namespace"]) == (True, 6, None)
    assert (refunds["report"].dry_run, refunds["report"].expired) == (False, 1)
    assert refunds["namespace"] == "refunds"


@pytest.fixture
def broken_store_receivers() -> Iterator[None]:
    for signal in (signals.cache_lookup, signals.purged):
        signal.connect(broken_receiver)
    yield
    for signal in (signals.cache_lookup, signals.purged):
        signal.disconnect(broken_receiver)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("cache_tier", "broken_store_receivers", "leftovers")
def test_a_failing_receiver_never_fails_a_lookup_or_a_purge_and_is_logged(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="django.dispatch"):
        first = post(client, "/viewset/charges/")
        retry = post(client, "/viewset/charges/")  # From the cache.
        report = purge_expired_records()

    assert first.status_code == retry.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1
    assert report.total == 6
    failures = [record for record in caplog.records if record.name == "django.dispatch"]
    assert len(failures) == 3  # The miss, the hit and the purge.
    assert all("broken_receiver" in record.getMessage() for record in failures)


class Interrupted(Exception):
    """The work failed after its key was taken over."""


@idempotent_function(key="key", mode="lease", lease=60)
def taken_over_then_failing(key: str) -> None:
    new_owners.append(take_over_running())
    raise Interrupted


new_owners: list[Claim] = []


@pytest.mark.django_db(transaction=True)
def test_a_release_that_matched_nothing_is_not_announced(
    store: str, received: list[tuple[str, dict[str, Any]]]
) -> None:
    # Its claim was taken over: the fenced release left the new owner's record as it is, and
    # `released` would have ended the new owner's span and counted a release that never was.
    new_owners.clear()
    with pytest.raises(Interrupted):
        taken_over_then_failing(key="taken-1")

    assert [outcome for outcome, _ in received] == ["claimed"]
    assert the_record().status == "in_progress"  # The new owner's claim, untouched.
