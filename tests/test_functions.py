"""`@idempotent_function`: one execution per key, stored results, mismatches and races."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pydantic
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

from django_idempotency import idempotent_function, mint_key, signals
from django_idempotency.exceptions import KeyInProgress, KeyMismatch, StoreUnavailable
from django_idempotency.models import IdempotencyRecord
from tests.models import Charge


@dataclass
class Receipt:
    charge_id: int
    amount: int


@dataclass
class Statement:
    receipt: Receipt
    lines: list[str]


class Invoice(pydantic.BaseModel):
    number: str
    total: int


@idempotent_function(key="reference", namespace="charges", payload=["reference", "amount"])
def charge(reference: str, amount: int, note: str = "") -> dict[str, Any]:
    created = Charge.objects.create(reference=reference, amount=amount)
    return {"id": created.pk, "amount": amount}


@idempotent_function(key=lambda reference, amount: f"receipt:{reference}")
def charge_with_receipt(reference: str, amount: int) -> Receipt:
    created = Charge.objects.create(reference=reference, amount=amount)
    return Receipt(charge_id=created.pk, amount=amount)


@idempotent_function(key="number")
def statement(number: str) -> Statement:
    Charge.objects.create(reference=number, amount=0)
    return Statement(receipt=Receipt(1, 2), lines=["a", "b"])


@idempotent_function(key="number")
def invoice(number: str, total: int) -> Invoice:
    Charge.objects.create(reference=number, amount=total)
    return Invoice(number=number, total=total)


@idempotent_function(key="reference", mode="lease")
def failing_charge(reference: str, fail: bool) -> int:
    Charge.objects.create(reference=reference, amount=1)
    if fail:
        raise RuntimeError("the bank said no")
    return Charge.objects.filter(reference=reference).count()


@idempotent_function(key="reference")
def failing_atomic_charge(reference: str, fail: bool) -> int:
    Charge.objects.create(reference=reference, amount=1)
    if fail:
        raise RuntimeError("the bank said no")
    return Charge.objects.filter(reference=reference).count()


@idempotent_function(key="reference", owner="tenant")
def tenant_charge(reference: str, tenant: str) -> int:
    return Charge.objects.create(reference=f"{tenant}:{reference}", amount=1).pk


@pytest.mark.django_db
def test_a_repeat_returns_the_stored_result_without_running_again() -> None:
    first = charge("order-1", 500)
    second = charge("order-1", 500)

    assert second == first
    assert Charge.objects.filter(reference="order-1").count() == 1
    record = IdempotencyRecord.objects.get(namespace="charges", key="order-1")
    assert record.status == "completed"
    assert record.method == "CALL"
    assert record.path == "tests.test_functions.charge"


@pytest.mark.django_db
def test_arguments_left_out_of_the_payload_do_not_make_a_mismatch() -> None:
    charge("order-2", 500, note="first")
    assert charge("order-2", 500, note="retry")["amount"] == 500
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_a_different_payload_under_the_same_key_is_a_mismatch_and_overwrites_nothing() -> None:
    first = charge("order-3", 500)

    with pytest.raises(KeyMismatch, match="different payload"):
        charge("order-3", 700)

    assert charge("order-3", 500) == first
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_dataclass_results_round_trip_including_nested_ones() -> None:
    first = charge_with_receipt("order-4", 900)
    replayed = charge_with_receipt("order-4", 900)
    assert isinstance(replayed, Receipt)
    assert replayed == first

    statement("s-1")
    again = statement("s-1")
    assert again == Statement(receipt=Receipt(1, 2), lines=["a", "b"])
    assert isinstance(again.receipt, Receipt)
    assert Charge.objects.count() == 2


@pytest.mark.django_db
def test_pydantic_results_round_trip() -> None:
    assert invoice("inv-1", 30) == Invoice(number="inv-1", total=30)
    replayed = invoice("inv-1", 30)
    assert isinstance(replayed, Invoice)
    assert replayed == Invoice(number="inv-1", total=30)
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_a_custom_serializer_stores_and_restores_the_result() -> None:
    class Upper:
        content_type = "text/plain"

        def dumps(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def loads(self, data: bytes) -> Any:
            return data.decode()

    @idempotent_function(key="name", serializer=Upper())
    def greet(name: str) -> str:
        Charge.objects.create(reference=name, amount=0)
        return f"hello {name}"

    assert greet("ada") == "hello ada"
    assert greet("ada") == "HELLO ADA"  # What the serializer stored.
    assert Charge.objects.count() == 1


@pytest.mark.django_db
def test_a_result_that_is_not_json_is_refused_and_the_key_released() -> None:
    @idempotent_function(key="name")
    def opaque(name: str) -> object:
        return object()

    with pytest.raises(TypeError, match="pass serializer="):
        opaque("x")
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("function", [failing_charge, failing_atomic_charge])
def test_an_exception_releases_the_key_so_a_retry_runs(function: Any) -> None:
    with pytest.raises(RuntimeError):
        function("order-5", True)
    assert not IdempotencyRecord.objects.exists()

    count = function("order-5", False)

    # Atomic mode rolled the failed attempt's write back; lease mode could not.
    expected = 2 if function is failing_charge else 1
    assert count == expected
    assert function("order-5", False) == expected  # Stored now: no third write.


@pytest.mark.django_db
def test_owners_scope_keys() -> None:
    first = tenant_charge("r", "acme")
    other = tenant_charge("r", "globex")
    assert first != other
    assert tenant_charge("r", "acme") == first
    assert Charge.objects.count() == 2


@pytest.mark.django_db
def test_mint_key_makes_a_deterministic_function_key() -> None:
    @idempotent_function(key=lambda order_id: mint_key("refund", order_id, namespace="shop"))
    def refund(order_id: int) -> int:
        return Charge.objects.create(reference=f"refund-{order_id}", amount=-1).pk

    assert refund(7) == refund(7)
    assert IdempotencyRecord.objects.get().key == mint_key("refund", 7, namespace="shop")


@pytest.mark.django_db
def test_signals_report_each_outcome() -> None:
    seen: list[tuple[str, str]] = []

    def receiver(signal: Any, **kwargs: Any) -> None:
        seen.append((names[signal], kwargs["key"]))

    names = {
        signals.claimed: "claimed",
        signals.replayed: "replayed",
        signals.mismatch: "mismatch",
        signals.completed: "completed",
        signals.released: "released",
    }
    for signal in names:
        signal.connect(receiver)
    try:
        charge("order-6", 1)
        charge("order-6", 1)
        with pytest.raises(KeyMismatch):
            charge("order-6", 2)
    finally:
        for signal in names:
            signal.disconnect(receiver)

    assert seen == [
        ("claimed", "order-6"),
        ("completed", "order-6"),
        ("replayed", "order-6"),
        ("mismatch", "order-6"),
    ]


@pytest.mark.django_db
def test_disabled_runs_the_function_every_time() -> None:
    with override_settings(IDEMPOTENCY_ENABLED=False):
        charge("order-7", 1)
        charge("order-7", 1)
    assert Charge.objects.count() == 2
    assert not IdempotencyRecord.objects.exists()


def test_bad_keys_and_declarations_fail_clearly() -> None:
    with pytest.raises(ImproperlyConfigured, match="no parameter 'missing'"):

        @idempotent_function(key="missing")
        def f(reference: str) -> None: ...

    @idempotent_function(key="reference")
    def g(reference: Any) -> None: ...

    with pytest.raises(ValueError, match="non-empty string"):
        g("")
    with pytest.raises(ValueError, match="at most 255"):
        g("x" * 256)
    with pytest.raises(ImproperlyConfigured, match="mode must be one of"):
        idempotent_function(key="reference", mode="eager")  # type: ignore[arg-type]


@pytest.mark.django_db
def test_a_payload_that_is_not_json_is_refused() -> None:
    @idempotent_function(key="reference")
    def h(reference: str, thing: object) -> None: ...

    with pytest.raises(TypeError, match="pass payload="):
        h("r", object())


@pytest.mark.django_db
def test_a_lost_database_raises_store_unavailable_and_runs_nothing(database_down: None) -> None:
    with pytest.raises(StoreUnavailable):
        charge("order-8", 1)


# Races on PostgreSQL: twenty threads, one key.

THREADS = 20


def _race(function: Any, key: str) -> list[Any]:
    barrier = threading.Barrier(THREADS)

    def call() -> Any:
        barrier.wait()
        try:
            return function(key)
        except KeyInProgress as exc:
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda _: call(), range(THREADS)))


@idempotent_function(key="reference", on_conflict="wait")
def slow_waiting_charge(reference: str) -> int:
    time.sleep(0.3)
    return Charge.objects.create(reference=reference, amount=1).pk


@idempotent_function(key="reference")
def slow_rejecting_charge(reference: str) -> int:
    time.sleep(0.3)
    return Charge.objects.create(reference=reference, amount=1).pk


@idempotent_function(key="reference", mode="lease", on_conflict="wait")
def slow_leased_charge(reference: str) -> int:
    time.sleep(0.3)
    return Charge.objects.create(reference=reference, amount=1).pk


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("function", [slow_waiting_charge, slow_leased_charge])
def test_twenty_threads_waiting_all_get_the_one_stored_result(function: Any) -> None:
    results = _race(function, "race-wait")

    assert Charge.objects.filter(reference="race-wait").count() == 1
    charge_id = Charge.objects.get(reference="race-wait").pk
    assert results == [charge_id] * THREADS


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_twenty_threads_rejecting_run_once_and_the_rest_are_told_it_is_in_progress() -> None:
    results = _race(slow_rejecting_charge, "race-reject")

    assert Charge.objects.filter(reference="race-reject").count() == 1
    charge_id = Charge.objects.get(reference="race-reject").pk
    kinds = Counter("result" if r == charge_id else type(r).__name__ for r in results)
    assert kinds["result"] >= 1
    assert kinds["result"] + kinds["KeyInProgress"] == THREADS, kinds
    assert slow_rejecting_charge("race-reject") == charge_id
