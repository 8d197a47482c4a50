"""`@idempotent_function` on ``async def`` callables: the sync one's semantics, awaited."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import override_settings

from django_idempotency import functions, idempotent_function, signals
from django_idempotency.exceptions import KeyInProgress, KeyMismatch
from tests.models import Charge
from tests.stores import stored

pytestmark = [pytest.mark.usefixtures("store"), pytest.mark.django_db(transaction=True)]

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run a scenario on a new event loop; close the shared sync thread's connection after it."""

    async def closing() -> T:
        try:
            return await scenario()
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(closing())


@idempotent_function(key="reference", namespace="async-charges", payload=["reference", "amount"])
async def charge(reference: str, amount: int, note: str = "") -> dict[str, Any]:
    created = await sync_to_async(Charge.objects.create)(reference=reference, amount=amount)
    return {"id": created.pk, "amount": amount}


@idempotent_function(key="reference", mode="atomic")
async def failing_charge(reference: str, fail: bool) -> int:
    await sync_to_async(Charge.objects.create)(reference=reference, amount=1)
    if fail:
        raise RuntimeError("the bank said no")
    return await sync_to_async(Charge.objects.filter(reference=reference).count)()


def test_the_decorated_callable_stays_a_coroutine_function() -> None:
    assert inspect.iscoroutinefunction(charge)
    assert charge.__name__ == "charge"


def test_a_repeat_returns_the_stored_result_without_running_again() -> None:
    async def scenario() -> tuple[Any, Any, Any]:
        first = await charge("order-1", 10)
        again = await charge("order-1", 10, note="ignored: not in the payload")
        with pytest.raises(KeyMismatch, match="different payload"):
            await charge("order-1", 99)
        return first, again, await charge("order-2", 5)

    first, again, other = run(scenario)

    assert again == first
    assert other["id"] != first["id"]
    assert Charge.objects.count() == 2
    assert stored()


def test_signals_report_each_outcome_as_for_a_sync_function() -> None:
    seen: list[str] = []
    names = {signal: name for name, signal in signals.BY_OUTCOME.items()}

    def receiver(signal: Any, **kwargs: Any) -> None:
        seen.append(names[signal])

    for signal in names:
        signal.connect(receiver)

    async def scenario() -> None:
        await charge("order-3", 1)
        await charge("order-3", 1)
        with pytest.raises(KeyMismatch):
            await charge("order-3", 2)

    try:
        run(scenario)
    finally:
        for signal in names:
            signal.disconnect(receiver)
    assert seen == ["claimed", "completed", "replayed", "mismatch"]


def test_an_exception_releases_the_key_so_a_retry_runs() -> None:
    async def scenario() -> tuple[int, int]:
        with pytest.raises(RuntimeError):
            await failing_charge("order-4", True)
        return await failing_charge("order-4", False), await failing_charge("order-4", False)

    retried, replayed = run(scenario)

    # Leased whatever the mode (no transaction spans an await): the failed call's write stays.
    assert retried == replayed == 2
    assert Charge.objects.count() == 2


def test_a_duplicate_while_the_first_runs_is_told_it_is_in_progress() -> None:
    async def scenario() -> tuple[Any, BaseException | None]:
        started, gate = asyncio.Event(), asyncio.Event()

        @idempotent_function(key="reference", namespace="slow")
        async def slow(reference: str) -> str:
            started.set()
            await gate.wait()
            return "done"

        first = asyncio.ensure_future(slow("order-5"))
        await started.wait()  # The first call holds the key now.
        try:
            await slow("order-5")
            error = None
        except KeyInProgress as exc:
            error = exc
        gate.set()
        return await first, error

    result, error = run(scenario)

    assert result == "done"
    assert isinstance(error, KeyInProgress)
    assert "on_conflict='wait'" in str(error)


@override_settings(IDEMPOTENCY_WAIT_TIMEOUT=5)
def test_a_waiting_duplicate_gets_the_stored_result_without_blocking_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    async def scenario() -> tuple[str, str]:
        started, gate = asyncio.Event(), asyncio.Event()
        backoff = functions.next_delay

        def open_gate_after_one_wait(delay: float) -> float:
            gate.set()  # The duplicate found the key in progress and slept once: let it finish.
            return backoff(delay)

        monkeypatch.setattr(functions, "next_delay", open_gate_after_one_wait)

        @idempotent_function(key="reference", namespace="slow", on_conflict="wait")
        async def slow(reference: str) -> str:
            calls.append(reference)
            started.set()
            await gate.wait()  # Only an event loop left free by the waiting duplicate opens it.
            return f"done {reference}"

        first = asyncio.ensure_future(slow("order-6"))
        await started.wait()
        duplicate = await slow("order-6")
        return await first, duplicate

    first, duplicate = run(scenario)

    assert first == duplicate == "done order-6"
    assert calls == ["order-6"]


def test_disabled_awaits_the_function_every_time() -> None:
    async def scenario() -> None:
        await charge("order-7", 1)
        await charge("order-7", 1)

    with override_settings(IDEMPOTENCY_ENABLED=False):
        run(scenario)
    assert Charge.objects.count() == 2
    assert not stored()
