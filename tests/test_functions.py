"""`@idempotent_function`: one execution per key, stored results, mismatches and races."""

from __future__ import annotations

import collections
import enum
import math
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
from django_idempotency.results import JSONSerializer
from tests.models import Charge
from tests.stores import stored, the_record

# Everything here but the lost database runs on every store.
pytestmark = pytest.mark.usefixtures("store")


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
    record = the_record()
    assert (record.namespace, record.key) == ("charges", "order-1")
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
    assert not stored()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("function", [failing_charge, failing_atomic_charge])
def test_an_exception_releases_the_key_so_a_retry_runs(function: Any, store: str) -> None:
    with pytest.raises(RuntimeError):
        function("order-5", True)
    assert not stored()

    count = function("order-5", False)

    # Atomic mode rolled the failed attempt's write back; lease mode (the only mode of the
    # stores other than the database's) could not.
    expected = 1 if function is failing_atomic_charge and store == "database" else 2
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
    assert the_record().key == mint_key("refund", 7, namespace="shop")


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
    assert not stored()


def test_bad_keys_and_declarations_fail_clearly() -> None:
    with pytest.raises(ImproperlyConfigured, match="no parameter 'missing'"):

        @idempotent_function(key="missing")
        def f(reference: str) -> None: ...

    @idempotent_function(key="reference")
    def g(reference: Any) -> None: ...

    with pytest.raises(ValueError, match="non-empty string"):
        g("")
    with pytest.raises(ValueError, match="the limit is 255"):
        g("x" * 256)
    with pytest.raises(ImproperlyConfigured, match="mode must be one of"):
        idempotent_function(key="reference", mode="eager")  # type: ignore[arg-type]


def test_a_default_namespace_too_long_for_its_column_asks_for_one() -> None:
    def settle_the_invoices_of_every_customer_of_every_region_before_the_month_closes() -> None:
        """Its dotted path, this test's with `<locals>`, is over the namespace column's 100."""

    with pytest.raises(ImproperlyConfigured, match="pass namespace= to @idempotent_function"):
        idempotent_function(key=lambda: "k")(
            settle_the_invoices_of_every_customer_of_every_region_before_the_month_closes
        )
    idempotent_function(key=lambda: "k", namespace="settlements")(
        settle_the_invoices_of_every_customer_of_every_region_before_the_month_closes
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "payload",
    ["order", lambda reference, order, note="": order["sku"]],
    ids=["argument-name", "callable"],
)
def test_the_payload_can_be_one_argument_or_what_a_callable_picks(payload: Any) -> None:
    calls: list[str] = []

    @idempotent_function(key="reference", namespace="shipments", payload=payload)
    def ship(reference: str, order: dict[str, int], note: str = "") -> str:
        calls.append(note)
        return f"shipped {order['sku']}"

    assert ship("r-1", {"sku": 1}, note="first") == "shipped 1"
    assert ship("r-1", {"sku": 1}, note="second") == "shipped 1"  # The note is not the payload.
    with pytest.raises(KeyMismatch):
        ship("r-1", {"sku": 2})
    assert calls == ["first"]


@pytest.mark.django_db
def test_a_payload_that_is_not_json_is_refused() -> None:
    @idempotent_function(key="reference")
    def h(reference: str, thing: object) -> None: ...

    with pytest.raises(TypeError, match="pass payload="):
        h("r", object())


@pytest.mark.django_db
@pytest.mark.parametrize("store", ["database"], indirect=True)
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
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("function", [slow_waiting_charge, slow_leased_charge])
def test_twenty_threads_waiting_all_get_the_one_stored_result(function: Any) -> None:
    results = _race(function, "race-wait")

    assert Charge.objects.filter(reference="race-wait").count() == 1
    charge_id = Charge.objects.get(reference="race-wait").pk
    assert results == [charge_id] * THREADS


@pytest.mark.postgresql
@pytest.mark.mariadb
@pytest.mark.django_db(transaction=True)
def test_twenty_threads_rejecting_run_once_and_the_rest_are_told_it_is_in_progress() -> None:
    results = _race(slow_rejecting_charge, "race-reject")

    assert Charge.objects.filter(reference="race-reject").count() == 1
    charge_id = Charge.objects.get(reference="race-reject").pk
    kinds = Counter("result" if r == charge_id else type(r).__name__ for r in results)
    assert kinds["result"] >= 1
    assert kinds["result"] + kinds["KeyInProgress"] == THREADS, kinds
    assert slow_rejecting_charge("race-reject") == charge_id


# Keys and owners the database could not store are refused before it is asked.


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("reference", "tenant", "error"),
    [
        ("a\x00b", "acme", "key of tests.test_functions.tenant_charge contains a NUL"),
        ("\ud800", "acme", "key of tests.test_functions.tenant_charge is not valid Unicode"),
        ("x" * 256, "acme", "key of tests.test_functions.tenant_charge is 256 characters long"),
        ("r", "ac\x00me", "owner of tests.test_functions.tenant_charge contains a NUL"),
        ("r", "\udfff", "owner of tests.test_functions.tenant_charge is not valid Unicode"),
        ("r", "t" * 256, "owner of tests.test_functions.tenant_charge is 256 characters long"),
    ],
    ids=["nul-key", "surrogate-key", "long-key", "nul-owner", "surrogate-owner", "long-owner"],
)
def test_a_key_or_owner_the_database_cannot_store_is_refused_before_it_is_asked(
    reference: str,
    tenant: str,
    error: str,
    django_assert_num_queries: Any,
) -> None:
    with django_assert_num_queries(0), pytest.raises(ValueError, match=error) as refused:
        tenant_charge(reference, tenant)

    assert "mint_key()" in str(refused.value)  # What to do about it.
    assert not stored()
    assert not Charge.objects.exists()


@pytest.mark.django_db
def test_the_longest_key_and_owner_are_accepted() -> None:
    @idempotent_function(key="reference", owner="tenant", namespace="longest")
    def count(reference: str, tenant: str) -> int:
        return Charge.objects.create(reference="longest", amount=1).pk

    first = count("k" * 255, "o" * 255)

    assert count("k" * 255, "o" * 255) == first
    assert Charge.objects.count() == 1


# A replay returns what the first call returned: same values, same types.


class Colour(enum.IntEnum):
    RED = 1


@dataclass
class Point:
    x: int
    y: int


@dataclass
class Route:
    points: tuple[Point, ...]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("result", "error"),
    [
        ((1, 2), "The result is of type tuple but would replay as list"),
        ({"ids": (1, 2)}, r"The result\['ids'\] is of type tuple but would replay as list"),
        ({1: "one"}, "The result has the key 1 of type int; a replay has only str keys"),
        ([{None: 1}], r"The result\[0\] has the key None of type NoneType"),
        (Colour.RED, "The result is of type Colour but would replay as int"),
        (Point(1, 2), "The result is of type Point but would replay as dict"),
        (Route((Point(1, 2),)), "The result is of type Route but would replay as dict"),
        (
            collections.OrderedDict(a=1),
            "The result is of type OrderedDict but would replay as dict",
        ),
    ],
    ids=["tuple", "nested-tuple", "int-key", "none-key", "int-enum", "dataclass", "route", "od"],
)
def test_a_result_that_would_replay_differently_is_refused_at_the_first_call(
    result: Any, error: str, store: str
) -> None:
    @idempotent_function(key="reference", namespace="unfaithful")
    def unfaithful(reference: str) -> Any:  # No annotation to rebuild a dataclass from.
        Charge.objects.create(reference=reference, amount=1)
        return result

    with pytest.raises(TypeError, match=error) as refused:
        unfaithful("r-1")

    assert "serializer=" in str(refused.value)
    assert not stored()  # Released: a fixed function runs again.
    # Atomic mode rolled the function's write back; lease mode cannot.
    assert Charge.objects.count() == (0 if store == "database" else 1)


@pytest.mark.django_db(transaction=True)
def test_a_dataclass_field_that_would_replay_differently_is_refused() -> None:
    @idempotent_function(key="reference", mode="lease")
    def route(reference: str) -> Route:
        Charge.objects.create(reference=reference, amount=1)
        return Route(points=(Point(1, 2),))

    with pytest.raises(
        TypeError, match=r"The result.points is of type tuple but would replay as list"
    ):
        route("r-2")

    assert not stored()  # Released in lease mode too.
    assert Charge.objects.count() == 1  # Lease mode cannot undo the function's write.


@pytest.mark.django_db
@pytest.mark.parametrize(
    "result",
    [
        None,
        True,
        0,
        -1.5,
        float("inf"),
        "text \x00 with a NUL",
        [1, 2.0, "3", None, False],
        {"nested": {"list": [{"a": 1}], "empty": {}}},
    ],
    ids=repr,
)
def test_json_results_replay_with_the_same_values_and_types(result: Any) -> None:
    calls = Counter[str]()

    @idempotent_function(key="reference")
    def plain(reference: str) -> Any:
        calls[reference] += 1
        return result

    first = plain("r-3")
    replay = plain("r-3")

    assert calls["r-3"] == 1
    assert replay == first == result
    assert repr(replay) == repr(result)  # Same types all the way down (1 is not 1.0).


@pytest.mark.django_db
def test_a_nan_result_replays_as_nan() -> None:
    @idempotent_function(key="reference")
    def ratio(reference: str) -> float:
        return math.nan

    assert math.isnan(ratio("r-4"))
    assert math.isnan(ratio("r-4"))


@pytest.mark.django_db
def test_a_lenient_json_serializer_accepts_what_replays_differently() -> None:
    @idempotent_function(key="reference", serializer=JSONSerializer(strict=False))
    def pair(reference: str) -> tuple[int, int]:
        return (1, 2)

    assert pair("r-5") == (1, 2)
    assert pair("r-5") == [1, 2]  # The JSON form, as asked for.
