"""The key an outbound call sends: derived from the operation and step, the same after a crash."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.db.models import QuerySet
from django.test import Client
from django.utils import timezone

from django_idempotency import idempotent_function, mint_key
from django_idempotency.attempts import Attempt, _current, current_attempt
from django_idempotency.contrib.celery import idempotent_task
from django_idempotency.exceptions import KeyInProgress, KeyMismatch, LeaseLost
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
from tests.test_modes import _database_url
from tests.utils import wait_for

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
    owner, operation = f"owner:{record.owner}", f"operation:{record.operation_id}"
    return mint_key(record.namespace, owner, record.key, operation, step, namespace=namespace)


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


def test_atomic_mode_derives_no_key_and_refuses_before_anything_is_sent(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    # Its record is rolled back with a failure, the operation's identity with it: the retry
    # would send another key for a charge already made.
    path = downstream.script("atomic")

    @idempotent_function(key="order", namespace="orders", mode="atomic")
    def settle(order: int) -> None:
        with httpx.Client(transport=IdempotentTransport()) as client:
            client.post(url(path), extensions={"idempotency_step": "charge"})

    with pytest.raises(ImproperlyConfigured, match="mode='lease'"):
        settle(1)

    assert downstream.seen["atomic"] == []
    assert not OutboundCall.objects.exists()
    assert not IdempotencyRecord.objects.exists()  # Rolled back: a retry runs it afresh.


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


# Operations: a reused client key is a new operation after expiry, a release or another
# request's take-over, and the same one when the same request resumes its crashed attempt.


def pay(client: Client, url: str, amount: int, **order: Any) -> Any:
    body = {"url": url, "amount": amount, **order}
    return client.post("/caller/pay/", body, "application/json", HTTP_IDEMPOTENCY_KEY="o-1")


def operation(key: str = "o-1") -> QuerySet[IdempotencyRecord]:
    """The caller's record of its operation (the downstream keeps records of its own)."""
    return IdempotencyRecord.objects.filter(key=key)


def charged() -> list[int]:
    return list(Charge.objects.order_by("pk").values_list("amount", flat=True))


def test_a_key_used_again_after_its_record_expired_is_a_new_charge(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    client = Client()
    first = pay(client, url("/downstream/guarded/"), 100)
    operation().update(expires_at=timezone.now() - timedelta(seconds=1))

    second = pay(client, url("/downstream/guarded/"), 5000)

    assert (first.status_code, second.status_code) == (201, 201)
    assert charged() == [100, 5000]  # Not the first charge replayed to the second operation.
    assert second.json()["id"] != first.json()["id"]
    keys = downstream.keys("guarded")
    assert len(keys) == len(set(keys)) == 2
    assert keys[1] == expected_key(operation().get(), "charge", namespace="bank")
    journal = OutboundCall.objects.order_by("pk").values_list("key", "operation_key", "outcome")
    assert list(journal) == [(keys[0], "o-1", "confirmed"), (keys[1], "o-1", "confirmed")]


def test_after_a_4xx_the_same_request_charges_once_and_a_corrected_one_again(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    client = Client()
    # Charged, then answered 409, which gives the key back to the client.
    refused = pay(client, url("/downstream/guarded/"), 100, answer=409)
    same = pay(client, url("/downstream/guarded/"), 100, answer=409)
    corrected = pay(client, url("/downstream/guarded/"), 5000)

    assert (refused.status_code, same.status_code, corrected.status_code) == (409, 409, 201)
    assert "Idempotent-Replayed" not in same  # Run again: the key was given back.
    # The same request is the same operation, sending the same key: the downstream replayed
    # its charge. The corrected request is another operation, with keys of its own.
    assert charged() == [100, 5000]
    first, other = downstream.keys("guarded")
    assert first != other
    calls = OutboundCall.objects.order_by("pk").values_list("key", "attempts", "replayed")
    assert list(calls) == [(first, 2, True), (other, 1, False)]


def test_another_request_taking_over_a_crashed_attempt_is_a_new_charge(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    client = Client(raise_request_exception=False)
    service.CRASHES[:] = [True, False]

    crashed = pay(client, url("/downstream/guarded/"), 100)
    other = pay(client, url("/downstream/guarded/"), 5000)

    assert (crashed.status_code, other.status_code) == (500, 201)
    assert charged() == [100, 5000]
    first, second = downstream.keys("guarded")
    assert first != second


def _kill_after_the_charge(
    tmp_path: Path, order: str, amount: int, url: str
) -> subprocess.Popen[bytes]:
    """A process of its own that charges `amount` for `order`, then is SIGKILLed holding its
    lease-mode claim: no release, no last write."""
    marker = tmp_path / f"charged-{amount}"
    connection.close()  # SQLite: let the other process write.
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        **os.environ,
        "DATABASE_URL": _database_url(),
    }
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.outbound_holder", order, str(amount), url, str(marker), "60"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
    )
    try:
        wait_for(marker.exists, 30)
    finally:
        holder.kill()
        holder.wait()
    return holder


def _once_free(call: Callable[[], int]) -> int:
    """`call`'s result once the killed process's lease has run out."""
    results: list[int] = []

    def runs() -> bool:
        try:
            results.append(call())
        except (KeyInProgress, KeyMismatch):  # Until the lease runs out.
            return False
        return True

    wait_for(runs, 30)
    return results[0]


def test_a_killed_attempts_same_request_resumes_its_operation_and_charges_once(
    downstream: Downstream, url: Callable[[str], str], tmp_path: Path
) -> None:
    from tests.outbound_holder import charge_then_work

    guarded = url("/downstream/guarded/")
    _kill_after_the_charge(tmp_path, "order-1", 100, guarded)
    crashed = operation("order-1").get().operation_id

    charge = _once_free(lambda: charge_then_work("order-1", 100, guarded, str(tmp_path / "m"), 0))

    assert Charge.objects.get().pk == charge  # The downstream's answer to the first attempt.
    record = operation("order-1").get()
    assert (record.status, record.operation_id) == ("completed", crashed)
    key = expected_key(record, "charge", namespace="bank")
    assert downstream.keys("guarded") == [key]  # Then the same key again, replayed.
    call = OutboundCall.objects.get()
    assert (call.key, call.attempts, call.replayed, call.outcome) == (key, 2, True, "confirmed")


def test_another_request_taking_over_a_killed_attempt_is_a_new_operation(
    downstream: Downstream, url: Callable[[str], str], tmp_path: Path
) -> None:
    from tests.outbound_holder import charge_then_work

    guarded = url("/downstream/guarded/")
    _kill_after_the_charge(tmp_path, "order-1", 100, guarded)
    crashed = operation("order-1").get().operation_id

    _once_free(lambda: charge_then_work("order-1", 5000, guarded, str(tmp_path / "m"), 0))

    assert charged() == [100, 5000]
    first, second = downstream.keys("guarded")
    assert first != second
    assert operation("order-1").get().operation_id not in ("", crashed)


@idempotent_task(payload=["url"], mode="lease")
def settle_by_message(url: str, crash: bool) -> int:
    """Keyed by its message: charges in step "charge", then crashes if told to."""
    with httpx.Client(transport=IdempotentTransport(namespace="bank")) as client:
        answer = client.post(url, extensions={"idempotency_step": "charge"})
    if crash:
        raise RuntimeError("crashed after the call")
    return answer.status_code


def test_a_task_redelivered_after_a_crash_resumes_and_another_message_is_new(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    path = url(downstream.script("tasks"))

    crashed = settle_by_message.apply(args=[path, True], task_id="message-1")
    redelivered = settle_by_message.apply(args=[path, False], task_id="message-1")
    other = settle_by_message.apply(args=[path, False], task_id="message-2")

    assert crashed.failed() and redelivered.get() == other.get() == 201
    first, again, new = downstream.keys("tasks")
    assert first == again != new


def test_the_journal_row_names_the_operation(
    downstream: Downstream, url: Callable[[str], str]
) -> None:
    pay(Client(), url("/downstream/guarded/"), 100)

    record = operation().get()
    call = OutboundCall.objects.get()
    assert record.operation_id and call.operation_id == record.operation_id


def test_an_attempt_keeps_its_operation_once_its_claim_ended() -> None:
    seen: list[Attempt] = []

    @idempotent_function(key="order", mode="lease")
    def settle(order: int) -> None:
        attempt = current_attempt()
        assert attempt is not None
        seen.append(attempt)

    settle(1)

    (record,) = IdempotencyRecord.objects.all()
    assert seen[0].claim is None and seen[0].operation_id == record.operation_id


def test_a_record_made_before_operations_had_an_identity_derives_keys_as_before() -> None:
    keys: list[str] = []

    @idempotent_function(key="order", namespace="orders", mode="lease")
    def settle(order: int) -> None:
        keys.append(key_for("charge"))
        if len(keys) == 1:
            raise RuntimeError("crashed after the call")

    with pytest.raises(RuntimeError):
        settle(7)
    # The crashed attempt's record, as a version that kept no identity wrote it.
    IdempotencyRecord.objects.update(operation_id="")
    settle(7)

    assert IdempotencyRecord.objects.get().operation_id == ""  # Resumed: still that operation.
    assert keys[1] == mint_key("orders", "owner:", "7", "charge")


def test_idempotent_session_keys_http_and_https_and_warns_once_of_a_step_sent_unkeyed(
    downstream: Downstream, url: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    import requests
    from requests.adapters import HTTPAdapter

    from django_idempotency.outbound import IdempotentAdapter, idempotent_session

    keyed, plain = downstream.script("keyed"), downstream.script("plain")

    @idempotent_function(key="order", namespace="orders", mode="lease")
    def settle(order: int) -> None:
        with idempotent_session(namespace="bank") as session:
            # A prefix mounted later, more specific: its requests bypass the adapter.
            session.mount(url(plain), HTTPAdapter())
            step = {"Idempotency-Step": "charge"}
            session.post(url(keyed), headers=step)
            session.post(url(plain), headers=step)
            session.post(url(plain), headers=step)

    with caplog.at_level("WARNING", logger="django_idempotency"):
        settle(7)

    session = idempotent_session()
    assert all(
        isinstance(session.get_adapter(s), IdempotentAdapter) for s in ("http://a", "https://a")
    )
    assert isinstance(session, requests.Session)
    [seen] = downstream.seen["keyed"]
    assert seen.key is not None and seen.step_header is None  # Keyed; the step's header kept.
    assert [seen.step_header for seen in downstream.seen["plain"]] == ["charge", "charge"]
    [warning] = [r.getMessage() for r in caplog.records if "Idempotency-Step" in r.getMessage()]
    assert "by another adapter of its session than IdempotentAdapter" in warning
