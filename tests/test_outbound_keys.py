"""The key an outbound call sends: derived from the operation and step, the same after a crash."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from django_idempotency import idempotent_function, mint_key
from django_idempotency.attempts import Attempt, _current, current_attempt
from django_idempotency.exceptions import LeaseLost
from django_idempotency.models import IdempotencyRecord, OutboundCall
from django_idempotency.outbound import (
    AsyncIdempotentTransport,
    IdempotentTransport,
    OutsideOperation,
    key_for,
    was_replayed,
)
from django_idempotency.steps import _current_step
from tests import downstream as service
from tests.downstream import Downstream, reset_downstream
from tests.factories import UserFactory
from tests.models import Charge
from tests.outbound_clients import CALLERS, Clock

pytestmark = [pytest.mark.urls("tests.downstream"), pytest.mark.django_db(transaction=True)]


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    yield from reset_downstream()


@pytest.fixture
def url(live_server: Any) -> Callable[[str], str]:
    return lambda path: f"{live_server.url}{path}"


@contextmanager
def in_step(name: str) -> Iterator[None]:
    """What steps.step does around its function: the step's name is the current one."""
    token = _current_step.set(name)
    try:
        yield
    finally:
        _current_step.reset(token)


def expected_key(record: IdempotencyRecord, step: str, namespace: str = "default") -> str:
    """The documented derivation, from the operation's stored record."""
    owner = f"owner:{record.owner}"
    return mint_key(record.namespace, owner, record.key, step, namespace=namespace)


def test_a_guarded_view_that_crashed_sends_the_same_key_again_and_gets_a_replay(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    user = UserFactory()
    client = Client(raise_request_exception=False)
    client.force_login(user)
    order = {"url": url("/downstream/guarded/"), "amount": 7}
    service.CRASHES[:] = [True, False]

    crashed = client.post("/caller/pay/", order, "application/json", HTTP_IDEMPOTENCY_KEY="o-1")
    retried = client.post("/caller/pay/", order, "application/json", HTTP_IDEMPOTENCY_KEY="o-1")

    assert (crashed.status_code, retried.status_code) == (500, 201)
    (record,) = IdempotencyRecord.objects.filter(key="o-1")
    key = expected_key(record, "charge", namespace="bank")
    assert record.owner == str(user.pk)
    assert downstream.keys("guarded") == [key]  # The retry was replayed by the downstream.
    assert Charge.objects.count() == 1
    call = OutboundCall.objects.get()
    assert (call.key, call.attempts, call.outcome, call.replayed) == (key, 2, "confirmed", True)
    assert (call.namespace, call.owner, call.operation_key, call.step) == (
        "default",
        str(user.pk),
        "o-1",
        "charge",
    )


@pytest.mark.parametrize("kind", list(CALLERS))
def test_an_idempotent_function_run_again_after_a_crash_sends_the_same_key(
    downstream: Downstream, url: Callable[[str], str], kind: str
) -> None:
    path = downstream.script("charges")
    runs = [True, False]

    @idempotent_function(key="order", namespace="orders", mode="lease")
    def settle(order: int) -> int:
        CALLERS[kind](Clock().policy(), namespace="bank").send("POST", url(path), step="charge")
        if runs.pop(0):
            raise RuntimeError("crashed after the call")
        return order

    with pytest.raises(RuntimeError):
        settle(7)
    assert settle(7) == 7

    record = IdempotencyRecord.objects.get(namespace="orders")
    key = expected_key(record, "charge", namespace="bank")
    assert downstream.keys("charges") == [key, key]
    assert [seen.step_header for seen in downstream.seen["charges"]] == [None, None]


def test_the_step_running_now_names_the_key(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("steps")

    @idempotent_function(key="order", mode="lease")
    def settle(order: int) -> None:
        with httpx.Client(transport=IdempotentTransport()) as client, in_step("transfer"):
            client.post(url(path))
        with httpx.Client(transport=IdempotentTransport()) as client, in_step("notify"):
            client.post(url(path))

    settle(8)

    record = IdempotencyRecord.objects.get()
    assert downstream.keys("steps") == [
        expected_key(record, "transfer"),
        expected_key(record, "notify"),
    ]


def test_an_async_function_derives_its_key_as_a_sync_one(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("async")

    @idempotent_function(key="order")
    async def settle(order: int) -> int:
        async with httpx.AsyncClient(transport=AsyncIdempotentTransport()) as client:
            answer = await client.post(url(path), extensions={"idempotency_step": "charge"})
        return answer.status_code

    assert async_to_sync(settle)(9) == 201

    record = IdempotencyRecord.objects.get()
    assert downstream.keys("async") == [expected_key(record, "charge")]


def test_a_key_the_request_carries_is_sent_as_it_is(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("own")

    @idempotent_function(key="order", mode="lease")
    def settle(order: int) -> None:
        with httpx.Client(transport=IdempotentTransport()) as client, in_step("transfer"):
            client.post(url(path), headers={"Idempotency-Key": "mine-1"})

    settle(1)

    assert downstream.keys("own") == ["mine-1"]


def test_outside_an_operation_a_step_alone_is_refused_before_anything_is_sent(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("outside")

    with (
        httpx.Client(transport=IdempotentTransport()) as client,
        pytest.raises(OutsideOperation, match=r"key_for\('charge', order.pk\)"),
    ):
        client.post(url(path), extensions={"idempotency_step": "charge"})

    assert downstream.seen["outside"] == []
    assert not OutboundCall.objects.exists()


def test_outside_an_operation_the_callers_parts_make_the_key(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("outside")
    key = key_for("charge", 42, namespace="bank")

    with httpx.Client(transport=IdempotentTransport()) as client:
        client.post(url(path), headers={"Idempotency-Key": key})

    assert key == mint_key("charge", 42, namespace="bank")
    assert downstream.keys("outside") == [key]
    with pytest.raises(OutsideOperation):
        key_for("charge")


def test_keys_differ_by_step_parts_namespace_and_operation() -> None:
    keys = set()

    @idempotent_function(key="order", mode="lease")
    def derive(order: int) -> None:
        keys.update(
            {
                key_for("charge"),
                key_for("charge", 1),
                key_for("refund"),
                key_for("charge", namespace="bank"),
            }
        )

    derive(1)
    derive(2)

    assert len(keys) == 8


def test_a_lost_claim_stops_the_call_before_it_is_sent(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = downstream.script("fenced")
    attempt = Attempt(atomic=False, on_conflict="reject")  # Holds no claim: as one that lost it.
    token = _current.set(attempt)
    try:
        with (
            httpx.Client(transport=IdempotentTransport()) as client,
            pytest.raises(LeaseLost),
        ):
            client.post(url(path), headers={"Idempotency-Key": "k-fenced"})
    finally:
        _current.reset(token)

    assert downstream.seen["fenced"] == []
    assert not OutboundCall.objects.exists()  # Never sent: no row.


@pytest.mark.parametrize("kind", list(CALLERS))
def test_a_claim_lost_between_attempts_stops_the_retries(
    downstream: Downstream, url: Callable[[str], str], kind: str
) -> None:
    path = downstream.script("fenced", 503, 503)
    clock = Clock()

    def claim_lost_while_waiting(seconds: float) -> None:
        clock.sleep(seconds)
        attempt = current_attempt()
        assert attempt is not None
        attempt.release(rollback=False)  # As when the lease ran out and another took it over.

    async def async_claim_lost_while_waiting(seconds: float) -> None:
        claim_lost_while_waiting(seconds)

    policy = dataclasses.replace(
        clock.policy(),
        sleep=claim_lost_while_waiting,
        async_sleep=async_claim_lost_while_waiting,
    )

    @idempotent_function(key="order", mode="lease")
    def settle(order: int) -> None:
        CALLERS[kind](policy).send("POST", url(path), step="charge")

    with pytest.raises(LeaseLost):
        settle(3)

    assert len(downstream.seen["fenced"]) == 1
    call = OutboundCall.objects.get()
    assert (call.attempts, call.last_status, call.outcome) == (1, 503, "sending")


def test_was_replayed_reads_the_header_of_either_library() -> None:
    import requests

    replayed = httpx.Response(201, headers={"idempotent-replayed": "true"})
    fresh = requests.Response()
    fresh.status_code = 201
    assert was_replayed(replayed)
    assert not was_replayed(fresh)
    fresh.headers["Idempotent-Replayed"] = "TRUE"
    assert was_replayed(fresh)
