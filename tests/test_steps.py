"""Steps: recovery points of a lease-mode operation, which a retry after a crash skips."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_idempotency import idempotent, idempotent_function
from django_idempotency.attempts import current_attempt
from django_idempotency.encryption import UnreadableResponse
from django_idempotency.models import IdempotencyRecord
from django_idempotency.purge import purge_expired_records
from django_idempotency.steps import astep, current_step_name, step
from django_idempotency.stores import get_store
from tests.stores import expire_all, stored, the_record
from tests.utils import post

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]

calls: Counter[str] = Counter()  # How many times each step's work ran.
fail_at: set[str] = set()  # The steps whose work raises (a crash between two steps).


class Crash(Exception):
    """The work failed between two steps (a lost process, as a Python caller sees it)."""


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    calls.clear()
    fail_at.clear()
    yield
    calls.clear()
    fail_at.clear()


@dataclass
class Receipt:
    charge: int
    note: str


def charge_card(amount: int) -> Receipt:
    calls["charge"] += 1
    assert current_step_name() == "charge"  # Outbound calls derive their keys from it.
    return Receipt(charge=amount * 100, note="charged")


def ship(receipt: Receipt) -> dict[str, Any]:
    calls["ship"] += 1
    if "ship" in fail_at:
        raise Crash("the carrier is down")
    return {"shipped": receipt.charge}


@idempotent_function(key="key", payload=["amount"], mode="lease")
def order(key: str, amount: int) -> dict[str, Any]:
    receipt = step("charge", charge_card, amount)
    assert current_step_name() is None
    return step("ship", ship, receipt)


async def charge_card_async(amount: int) -> int:
    calls["charge"] += 1
    assert current_step_name() == "charge"
    return amount * 100


async def ship_async(charged: int) -> int:
    calls["ship"] += 1
    if "ship" in fail_at:
        raise Crash("the carrier is down")
    return charged + 1


@idempotent_function(key="key", payload=["amount"])
async def order_async(key: str, amount: int) -> int:
    charged = await astep("charge", charge_card_async, amount)
    return await astep("ship", ship_async, charged)


@idempotent(mode="lease")
def order_view(request: HttpRequest) -> HttpResponse:
    amount = json.loads(request.body)["amount"]
    receipt = step("charge", charge_card, amount)
    return JsonResponse(step("ship", ship, receipt), status=201)


@idempotent(mode="atomic")
def atomic_order_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"charge": step("charge", charge_card, 1).charge}, status=201)


urlpatterns = [path("orders/", order_view), path("atomic-orders/", atomic_order_view)]


def test_a_retry_skips_the_step_that_completed_and_resumes_at_the_one_that_failed(
    store: str,
) -> None:
    fail_at.add("ship")
    with pytest.raises(Crash):
        order(key="o-1", amount=3)
    assert calls == {"charge": 1, "ship": 1}
    fail_at.clear()

    result = order(key="o-1", amount=3)

    assert result == {"shipped": 300}  # From the charge step's stored result, a Receipt again.
    assert calls == {"charge": 1, "ship": 2}  # The charge was not made a second time.
    assert order(key="o-1", amount=3) == {"shipped": 300}  # Then replayed.
    assert calls == {"charge": 1, "ship": 2}


def test_the_failed_attempt_ends_its_lease_so_the_retry_need_not_wait(store: str) -> None:
    fail_at.add("ship")
    with pytest.raises(Crash):
        order(key="o-1", amount=3)

    # The record stays, in progress, its lease over: what the retry takes over and resumes.
    record = the_record()
    assert record.status == "in_progress"


def test_a_different_request_taking_over_the_abandoned_record_starts_without_its_steps(
    store: str,
) -> None:
    fail_at.add("ship")
    with pytest.raises(Crash):
        order(key="o-1", amount=3)
    fail_at.clear()

    assert order(key="o-1", amount=5) == {"shipped": 500}  # Another payload, the same key.

    assert calls == {"charge": 2, "ship": 2}  # Its own charge: the first's is not its.


@pytest.mark.parametrize("store", ["database", "memory"], indirect=True)
def test_the_stored_steps_stay_through_the_purge_for_the_retry_to_resume(store: str) -> None:
    # (The Redis store's records, steps included, are removed by Redis when they expire.)
    fail_at.add("ship")
    with pytest.raises(Crash):
        order(key="o-1", amount=3)
    fail_at.clear()

    purged = purge_expired_records()  # The attempt's lease is over, its record not expired.

    assert purged.total == 0
    assert order(key="o-1", amount=3) == {"shipped": 300}
    assert calls == {"charge": 1, "ship": 2}  # Resumed after the charge, not charged again.


@pytest.mark.parametrize("store", ["database", "memory"], indirect=True)
def test_the_stored_steps_go_with_the_purge_once_their_record_expired(store: str) -> None:
    fail_at.add("ship")
    with pytest.raises(Crash):
        order(key="o-1", amount=3)
    fail_at.clear()
    expire_all(get_store().now())  # By the purge's clock, the store's.

    purged = purge_expired_records()

    assert purged.abandoned == 1 and stored() == []
    assert order(key="o-1", amount=3) == {"shipped": 300}
    assert calls == {"charge": 2, "ship": 2}  # Expired: the key is a new operation.


def test_an_async_function_resumes_after_its_completed_astep(store: str) -> None:
    fail_at.add("ship")
    with pytest.raises(Crash):
        async_to_sync(order_async)(key="a-1", amount=2)
    fail_at.clear()

    assert async_to_sync(order_async)(key="a-1", amount=2) == 201

    assert calls == {"charge": 1, "ship": 2}


def test_a_view_retried_after_a_failure_resumes_after_its_completed_step(store: str) -> None:
    client = Client(raise_request_exception=False)
    fail_at.add("ship")
    assert post(client, "/orders/", {"amount": 4}, key="v-1").status_code == 500
    fail_at.clear()

    retry = post(client, "/orders/", {"amount": 4}, key="v-1")
    replay = post(client, "/orders/", {"amount": 4}, key="v-1")

    assert (retry.status_code, retry.json()) == (201, {"shipped": 400})
    assert replay["Idempotent-Replayed"] == "true"
    assert calls == {"charge": 1, "ship": 2}


def test_a_step_outside_any_operation_just_runs() -> None:
    assert current_attempt() is None

    assert step("charge", charge_card, 1) == Receipt(charge=100, note="charged")
    assert step("charge", charge_card, 1) == Receipt(charge=100, note="charged")

    assert calls == {"charge": 2}


def test_a_step_in_atomic_mode_is_refused_saying_to_use_lease_mode() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"step\('charge'\) runs inside an atomic-mode"):
        post(Client(), "/atomic-orders/", key="atomic-1")

    assert calls == {}
    assert not IdempotencyRecord.objects.exists()  # Rolled back with the view's transaction.


def test_a_steps_result_is_encrypted_at_rest_when_keys_are_set() -> None:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[Fernet.generate_key()]):
        fail_at.add("ship")
        with pytest.raises(Crash):
            order(key="secret-1", amount=7)
        fail_at.clear()
        steps = IdempotencyRecord.objects.get().steps
        assert isinstance(steps, dict) and list(steps) == ["charge"]
        assert b"charged" not in base64.b64decode(steps["charge"])

        assert order(key="secret-1", amount=7) == {"shipped": 700}

    assert calls == {"charge": 1, "ship": 2}


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ([Fernet.generate_key()], "keep a retired key in the list"),
        (None, "IDEMPOTENCY_ENCRYPTION_KEYS is not set: put the key it was encrypted with back"),
    ],
    ids=["key-removed", "encryption-off"],
)
def test_a_stored_step_no_configured_key_opens_is_an_error_not_a_second_run(
    keys: list[bytes] | None, says: str
) -> None:
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[Fernet.generate_key()]):
        fail_at.add("ship")
        with pytest.raises(Crash):
            order(key="secret-2", amount=7)
        fail_at.clear()

    with (
        override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=keys),
        pytest.raises(UnreadableResponse, match=says),
    ):
        order(key="secret-2", amount=7)

    assert calls == {"charge": 1, "ship": 1}  # The charge is never made again.


def test_a_step_sealed_with_a_key_this_server_lacks_is_a_problem_then_resumes_where_it_has_it(
    store: str,
) -> None:
    # A key rotation rolled out server by server: the new key is first on one server, which
    # sealed the step; the retry reaches a server still on the old list (a 500 until now).
    old, new = Fernet.generate_key(), Fernet.generate_key()
    fail_at.add("ship")
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[new, old]), pytest.raises(Crash):
        post(Client(), "/orders/", {"amount": 3}, key="rolled-1")
    fail_at.clear()

    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[old]):
        refused = post(Client(), "/orders/", {"amount": 3}, key="rolled-1")
    assert refused.status_code == 410
    assert refused["Content-Type"] == "application/problem+json"
    assert "not run again" in refused.json()["detail"]
    assert calls == {"charge": 1, "ship": 1}

    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[new, old]):
        resumed = post(Client(), "/orders/", {"amount": 3}, key="rolled-1")
    assert resumed.status_code == 201 and resumed.json() == {"shipped": 300}
    assert calls == {"charge": 1, "ship": 2}


@idempotent_function(key="key", payload=["amount"], mode="lease")
async def order_with_a_sync_step(key: str, amount: int) -> int:
    return step("charge", charge_card, amount).charge


def test_a_sync_step_in_async_code_is_refused_before_its_work_runs(store: str) -> None:
    # Its result could not be stored there (Django refuses queries in an event loop): the work
    # ran, the save failed, the key was released, and each retry ran the work again.
    for _ in range(2):
        with pytest.raises(SynchronousOnlyOperation, match="astep"):
            async_to_sync(order_with_a_sync_step)(key="s-1", amount=2)
    assert calls["charge"] == 0
