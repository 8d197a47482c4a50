"""The outbox in one process: written with the caller's transaction, relayed once per message
to a real receiver (the live server), in order per aggregate, retried, dead-lettered, fenced
against a relay that stalled, purged."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.utils import timezone

from django_idempotency import crashes, idempotent_function, signals
from django_idempotency.models import OutboundCall, OutboxMessage
from django_idempotency.outbound import IdempotentTransport, RetryPolicy
from django_idempotency.outbox import Relay, enqueue_request, enqueue_task, relay_due
from django_idempotency.purge import purge_expired_records
from django_idempotency.testing import crash_at
from tests.downstream import Downstream, reset_downstream
from tests.models import Charge

pytestmark = [pytest.mark.urls("tests.downstream"), pytest.mark.django_db(transaction=True)]

State = OutboxMessage.State
# Between two deliveries of a message: none, so that a test's next pass finds it due.
NO_BACKOFF = RetryPolicy(max_attempts=3, base_delay=0, max_delay=0, deadline=float("inf"))


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


@pytest.fixture
def url(live_server: Any) -> Callable[[str], str]:
    return lambda path: f"{live_server.url}{path}"


def one_try_client() -> httpx.Client:
    """The outbound client sending each delivery once: the relay's own retries are tested."""
    return httpx.Client(transport=IdempotentTransport(policy=RetryPolicy(max_attempts=1)))


def relay(**options: Any) -> Any:
    options.setdefault("policy", NO_BACKOFF)
    options.setdefault("http_client", one_try_client())
    return relay_due(**options)


def test_a_rolled_back_transaction_sends_nothing(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        Charge.objects.create(reference="order-1", amount=5)
        enqueue_request("POST", url(path), json_body={"order": 1})
        raise ZeroDivisionError("the order could not be placed")

    report = relay()

    assert report.handled == 0
    assert downstream.keys("orders") == []
    assert not OutboxMessage.objects.exists()


def test_a_committed_message_is_delivered_once_with_its_key_body_and_headers(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    with transaction.atomic():
        Charge.objects.create(reference="order-1", amount=5)
        message = enqueue_request(
            "post", url(path), json_body={"order": 1}, headers={"X-Tenant": "acme"}
        )
    # Nothing leaves before a relay runs: the transaction is the only thing that happened.
    assert downstream.keys("orders") == []

    first, second = relay(), relay()

    assert (first.sent, second.handled) == (1, 0)
    (seen,) = downstream.seen["orders"]
    assert (seen.method, seen.key, json.loads(seen.body)) == ("POST", message.key, {"order": 1})
    message.refresh_from_db()
    assert (message.state, message.attempts, message.claim_token) == (State.SENT, 1, "")
    assert message.sent_at is not None
    # Sent through the outbound client: journaled under the message's key.
    assert OutboundCall.objects.get(key=message.key).outcome == "confirmed"


def test_outside_an_operation_every_message_has_a_key_of_its_own(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    keys = {enqueue_request("POST", url(path)).key for _ in range(3)}

    assert relay().sent == 3
    assert len(keys) == 3 and set(downstream.keys("orders")) == keys


def test_a_message_given_its_key_twice_is_written_once(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    first = enqueue_request("POST", url(path), key="order-1-confirmation", json_body={"n": 1})
    with transaction.atomic():  # The key taken must not abort the caller's transaction.
        again = enqueue_request("POST", url(path), key="order-1-confirmation", json_body={"n": 2})
        Charge.objects.create(reference="order-1", amount=5)

    assert again.pk == first.pk and Charge.objects.count() == 1
    assert relay().sent == 1
    assert [json.loads(s.body) for s in downstream.seen["orders"]] == [{"n": 1}]


def test_a_failed_delivery_is_retried_then_dead_after_the_policy_s_attempts(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders", 503, 503, 503, 503)
    message = enqueue_request("POST", url(path))

    reports = [relay() for _ in range(4)]

    assert [(r.retried, r.dead) for r in reports] == [(1, 0), (1, 0), (0, 1), (0, 0)]
    message.refresh_from_db()
    assert (message.state, message.attempts, message.last_error) == (
        State.DEAD,
        3,
        "answered 503",
    )
    # Every delivery carried the same key.
    assert downstream.keys("orders") == [message.key] * 3


def test_a_retried_message_waits_for_its_backoff(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders", 503)
    message = enqueue_request("POST", url(path))
    minute = RetryPolicy(max_attempts=3, base_delay=60, max_delay=60, random=lambda a, b: b)

    assert relay(policy=minute).retried == 1
    assert relay(policy=minute).handled == 0

    message.refresh_from_db()
    assert message.available_at - message.created_at >= timedelta(seconds=59)


def test_a_request_the_receiver_refuses_as_wrong_is_dead_at_once(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders", 400)
    message = enqueue_request("POST", url(path))

    assert relay().dead == 1
    message.refresh_from_db()
    assert (message.state, message.attempts) == (State.DEAD, 1)


def test_messages_of_one_aggregate_are_delivered_in_order_the_others_go_on(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    order_1 = downstream.script("order-1", 503)  # Its first message fails once.
    order_2 = downstream.script("order-2")
    first = enqueue_request("POST", url(order_1), aggregate="order-1", json_body={"n": 1})
    enqueue_request("POST", url(order_1), aggregate="order-1", json_body={"n": 2})
    enqueue_request("POST", url(order_2), aggregate="order-2", json_body={"n": 1})
    enqueue_request("POST", url(order_2), aggregate="order-2", json_body={"n": 2})

    def delivered(name: str) -> list[int]:
        return [json.loads(seen.body)["n"] for seen in downstream.seen[name]]

    # Each pass sends the oldest undelivered message of each aggregate, and no other.
    relay()
    assert (delivered("order-1"), delivered("order-2")) == ([1], [1])
    relay()
    assert (delivered("order-1"), delivered("order-2")) == ([1, 1], [1, 2])
    relay()
    # order-1's second message waited behind its first; order-2 went on, in its own order.
    assert (delivered("order-1"), delivered("order-2")) == ([1, 1, 2], [1, 2])
    assert downstream.keys("order-1")[:2] == [first.key, first.key]


def test_a_dead_message_holds_its_aggregate_back(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders", 400)
    enqueue_request("POST", url(path), aggregate="order-1", json_body={"n": 1})
    later = enqueue_request("POST", url(path), aggregate="order-1", json_body={"n": 2})

    relay(), relay()

    later.refresh_from_db()
    assert later.state == State.PENDING and len(downstream.seen["orders"]) == 1


def test_a_relay_that_stalled_past_its_lease_does_not_send_what_another_took_over(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    enqueue_request("POST", url(path))
    stalled = Relay(lease=timedelta(milliseconds=200), policy=NO_BACKOFF)
    other = Relay(policy=NO_BACKOFF, http_client=one_try_client())

    def stall_then_let_another_relay_run() -> None:
        time.sleep(0.5)  # Past the stalled relay's lease: the other one takes the message.
        assert other.run().sent == 1

    crashes.arm("outbox.claimed", stall_then_let_another_relay_run)
    try:
        report = stalled.run_batch()
    finally:
        crashes.disarm()

    assert (report.sent, report.lost) == (0, 1)
    assert len(downstream.seen["orders"]) == 1


def test_relays_side_by_side_never_send_one_message_twice(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    keys = {enqueue_request("POST", url(path)).key for _ in range(40)}
    reports: list[Any] = []
    errors: list[BaseException] = []

    def run_relay() -> None:
        try:
            reports.append(relay(batch_size=3))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run_relay) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert not errors
    assert sorted(downstream.keys("orders")) == sorted(keys)  # Each exactly once.
    assert sum(r.sent for r in reports) == 40
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {State.SENT}


CRASH: list[bool] = []  # A run of `confirm` or `confirm_atomically` pops one, if any.


@idempotent_function(key="order", mode="lease")
def confirm(order: str, target: str) -> str:
    enqueue_request("POST", target, json_body={"order": order})
    enqueue_request("POST", target, json_body={"order": order, "copy": "archive"})
    if CRASH and CRASH.pop():
        raise ConnectionError("lost after the messages committed")
    return "confirmed"


def test_a_resumed_operation_writes_its_messages_again_under_the_same_keys(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    target = url(downstream.script("orders"))
    CRASH[:] = [True]
    with pytest.raises(ConnectionError):
        confirm("order-1", target)
    written = list(OutboxMessage.objects.order_by("id").values_list("key", flat=True))

    assert confirm("order-1", target) == "confirmed"

    # Two messages of one operation: keys of their own, the same on the retry, so written once.
    assert len(set(written)) == 2
    assert list(OutboxMessage.objects.order_by("id").values_list("key", flat=True)) == written
    assert relay().sent == 2
    assert downstream.keys("orders") == written


@idempotent_function(key="order", mode="atomic")
def confirm_atomically(order: str, target: str) -> str:
    enqueue_request("POST", target, json_body={"order": order})
    if CRASH and CRASH.pop():
        raise ConnectionError("lost before the commit")
    return "confirmed"


def test_in_atomic_mode_the_message_commits_or_rolls_back_with_the_claim(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    target = url(downstream.script("orders"))
    CRASH[:] = [True]
    with pytest.raises(ConnectionError):
        confirm_atomically("order-1", target)
    assert not OutboxMessage.objects.exists()

    confirm_atomically("order-1", target)
    confirm_atomically("order-1", target)  # A replay: written once.

    assert OutboxMessage.objects.count() == 1
    assert relay().sent == 1


def test_each_delivery_is_signalled(downstream: Downstream, url: Callable[[str], str]) -> None:
    path = downstream.script("orders", 503)
    message = enqueue_request("POST", url(path))
    heard: list[tuple[str, str | None]] = []

    def listen(sender: Any, message: OutboxMessage, outcome: str, error: str | None, **_: Any):
        heard.append((outcome, error))

    signals.outbox_delivery.connect(listen)
    try:
        relay(), relay()
    finally:
        signals.outbox_delivery.disconnect(listen)

    assert heard == [("retried", "answered 503"), ("sent", None)]
    assert message.pk


def test_the_purge_deletes_sent_messages_older_than_the_ttl_only(
    downstream: Downstream, url: Callable[[str], str], settings: Any
) -> None:
    path = downstream.script("orders", 400)
    dead = enqueue_request("POST", url(path))
    relay()
    old = enqueue_request("POST", url(path))
    recent = enqueue_request("POST", url(path))
    pending = enqueue_request("POST", url(path), aggregate="blocked")
    relay()
    OutboxMessage.objects.filter(pk=old.pk).update(sent_at=timezone.now() - timedelta(days=2))
    OutboxMessage.objects.filter(pk=pending.pk).update(
        available_at=timezone.now() + timedelta(days=1)
    )
    settings.IDEMPOTENCY_TTL = timedelta(days=1)

    report = purge_expired_records()

    assert report.outbox_messages == 1
    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == {
        dead.pk,
        recent.pk,
        pending.pk,
    }


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: enqueue_task("tests.tasks.nothing", args=(object(),)), TypeError),
        (lambda: enqueue_task("tests.tasks.nothing", args=(float("nan"),)), TypeError),
        (lambda: enqueue_task("tests.\x00tasks"), TypeError),
        (lambda: enqueue_task(object()), TypeError),
        (lambda: enqueue_task("tests.tasks.nothing", options={"task_id": "x"}), ValueError),
        (lambda: enqueue_request("POST", "http://x/", aggregate="a" * 256), ValueError),
        (lambda: enqueue_request("POST", "http://x/", key=""), ValueError),
        (lambda: enqueue_request("POST", "http://x/", key="a\x00b"), ValueError),
        (lambda: enqueue_request("", "http://x/"), ValueError),
        (lambda: enqueue_request("POST", "http://x/", json_body={}, content=b"x"), ValueError),
    ],
)
def test_a_message_that_cannot_be_sent_as_given_is_refused_when_written(
    call: Callable[[], Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        call()
    assert not OutboxMessage.objects.exists()


def test_a_task_message_keeps_its_arguments_and_options_as_celery_sends_them() -> None:
    message = enqueue_task(
        "tests.tasks.nothing", args=(1, "a"), kwargs={"b": [2]}, options={"queue": "mail"}
    )

    message.refresh_from_db()
    assert (message.kind, message.destination, message.method) == (
        "task",
        "tests.tasks.nothing",
        "",
    )
    assert message.payload == {"args": [1, "a"], "kwargs": {"b": [2]}, "options": {"queue": "mail"}}


def test_a_receiver_that_moved_is_not_taken_for_a_delivery(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders", (308, {"Location": "https://elsewhere.example/orders/"}))
    message = enqueue_request("POST", url(path))

    assert relay().dead == 1
    message.refresh_from_db()
    assert message.last_error == "answered 308: moved to https://elsewhere.example/orders/"


def test_a_relay_told_to_stop_finishes_its_message_and_hands_the_rest_back(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    for _ in range(3):
        enqueue_request("POST", url(path))
    stopping = Relay(policy=NO_BACKOFF, http_client=one_try_client())

    with crash_at("outbox.marked", action=stopping.stop):
        report = stopping.run_batch()

    assert report.sent == 1 and len(downstream.seen["orders"]) == 1
    # The two left are free for any relay at once, not held until the stopped one's lease ends.
    assert relay().sent == 2


def test_a_relay_whose_message_was_taken_over_while_it_sent_counts_it_lost(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    message = enqueue_request("POST", url(path))

    def another_relay_takes_it_over() -> None:
        OutboxMessage.objects.filter(pk=message.pk).update(claim_token="another-relay")

    with crash_at("outbox.sent", action=another_relay_takes_it_over):
        report = relay()

    assert (report.sent, report.lost) == (0, 1)
    message.refresh_from_db()
    assert (message.state, message.claim_token) == (State.PENDING, "another-relay")


def test_keys_and_aggregates_that_differ_only_by_case_are_two(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    """On MariaDB too, whose default collation would take "Refund-1" for "refund-1"."""
    path = downstream.script("orders", 400)
    first = enqueue_request("POST", url(path), key="Refund-1", aggregate="Customer-A")
    second = enqueue_request("POST", url(path), key="refund-1", aggregate="customer-a")

    assert first.pk != second.pk
    report = relay()  # The first is dead at once; it holds back "Customer-A", not "customer-a".
    assert (report.dead, report.sent) == (1, 1)
    assert downstream.keys("orders") == ["Refund-1", "refund-1"]


@pytest.mark.parametrize("status", [408, 421, 423, 425])
def test_an_answer_that_says_not_now_is_retried_not_taken_for_a_delivery(
    downstream: Downstream, url: Callable[[str], str], status: int
) -> None:
    path = downstream.script("orders", status)
    message = enqueue_request("POST", url(path))

    assert relay().retried == 1
    assert relay().sent == 1
    message.refresh_from_db()
    assert (message.state, message.attempts) == (State.SENT, 2)


def test_a_relay_inside_a_transaction_is_refused_before_it_sends(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("orders")
    with pytest.raises(ImproperlyConfigured), transaction.atomic():
        enqueue_request("POST", url(path))
        relay()  # The message is not committed yet: it might still roll back.
    assert downstream.keys("orders") == []


@pytest.mark.parametrize(
    "request_args",
    [
        {"url": "http://[::1/x"},
        {"url": "http://host:99999/x"},
        {"url": "http://host:\uff18\uff10/x"},  # Fullwidth digits.
        {"url": "ftp://host/x"},
        {"url": "host/x"},
        {"url": "http://host/a b"},
        {"url": "http://host/\x00"},
        {"method": "GE T"},
        {"headers": {"Bad Name": "x"}},
        {"headers": {"X-Name": "Café"}},
        {"headers": {"X-Name": "a\r\nInjected: 1"}},
        {"headers": {"X-Name": "a\x00"}},
        {"json_body": {"amount": float("nan")}},
    ],
)
def test_a_request_that_could_never_be_sent_is_refused_when_written(
    request_args: dict[str, Any],
) -> None:
    arguments = {"method": "POST", "url": "http://host.example/x", **request_args}
    method, target = arguments.pop("method"), arguments.pop("url")
    with pytest.raises((ValueError, TypeError)):
        enqueue_request(method, target, **arguments)
    assert not OutboxMessage.objects.exists()


def test_a_body_over_the_size_cap_is_refused_when_written(settings: Any) -> None:
    settings.IDEMPOTENCY_MAX_STORED_BYTES = 1000
    with pytest.raises(ValueError, match="IDEMPOTENCY_MAX_STORED_BYTES"):
        enqueue_request("POST", "http://host.example/x", content=b"x" * 1001)
    assert enqueue_request("POST", "http://host.example/x", content=b"x" * 1000).pk


@pytest.mark.parametrize("lease", [timedelta(0), timedelta(seconds=-5)])
def test_a_relay_without_a_lease_is_refused(lease: timedelta) -> None:
    """Two live relays could then both send one message."""
    with pytest.raises(ValueError):
        Relay(lease=lease)
