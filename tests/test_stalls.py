"""A process paused past its lease learns it before its next side effect: its next step renews
the lease first (fenced by its token), and stops with LeaseLost if the key was taken over."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import override_settings

from django_idempotency import idempotent_function
from django_idempotency.attempts import current_attempt
from django_idempotency.core.outcomes import Outcome
from django_idempotency.exceptions import KeyInProgress, LeaseLost
from django_idempotency.steps import astep, step
from django_idempotency.stores import get_store
from tests.clock_processes import LEASE, environment, pay_in_two_steps, traces
from tests.stores import SHARED_STORES, claim_request
from tests.utils import lose_database, wait_for

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("shared_store", SHARED_STORES, indirect=True)
def test_a_process_stopped_past_its_lease_does_not_run_its_next_step(
    shared_store: str, tmp_path: Path
) -> None:
    env = environment(shared_store)
    paying = subprocess.Popen(
        [sys.executable, "-m", "tests.clock_processes", "two-steps", "stalled-1", str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for((tmp_path / "between").exists, 60)
        os.kill(paying.pid, signal.SIGSTOP)  # Between its steps, its heartbeat thread too.
        (tmp_path / "go").touch()  # Its next step, the moment it wakes up.

        # The client's retry: refused while the lease lives, then it takes the key over and
        # resumes after the stored step.
        def the_retry_runs() -> bool:
            try:
                return pay_in_two_steps("stalled-1", str(tmp_path)) == "done"
            except KeyInProgress:
                return False

        wait_for(the_retry_runs, 30 * LEASE)
    finally:
        os.kill(paying.pid, signal.SIGCONT)
    said, _ = paying.communicate(timeout=60)

    assert said.strip() == "lease-lost"
    assert traces(tmp_path, "charge") == [paying.pid]  # Skipped by the retry: it was stored.
    assert traces(tmp_path, "ship") == [os.getpid()]  # Once: by the retry, never by the stalled.


# The same, in one process: the heartbeat silenced, the stall played by ending the lease.

runs: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def no_runs() -> Iterator[None]:
    runs.clear()
    with override_settings(IDEMPOTENCY_LEASE_RENEWAL=False):  # As if paused with the process.
        yield


def _ship(name: str) -> str:
    runs[name] += 1
    return name


def _the_lease_runs_out(*, taken_over: bool) -> None:
    """What a stall past the lease leaves: the lease ended by the store's clock, and perhaps
    the client's retry holding the key since."""
    attempt = current_attempt()
    assert attempt is not None and attempt.claim is not None
    store = get_store()
    assert store.renew(attempt.claim, store.now())
    if taken_over:
        assert attempt.claim.scope is not None
        retry = store.begin(replace(claim_request(attempt.claim.scope), now=store.now()))
        assert retry.outcome is Outcome.FRESH


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def ship_after_a_stall(key: str, taken_over: bool) -> str:
    step("charge", _ship, "charge")
    _the_lease_runs_out(taken_over=taken_over)
    return step("ship", _ship, "ship")


@pytest.mark.django_db(transaction=True)
def test_a_step_after_a_stall_whose_key_was_taken_over_stops_before_its_effect(
    store: str,
) -> None:
    with pytest.raises(LeaseLost, match="taken over by another caller"):
        ship_after_a_stall("stall-1", True)

    assert runs == {"charge": 1}


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def ship_after_a_stall_with_the_database_gone(key: str) -> str:
    step("charge", _ship, "charge")
    _the_lease_runs_out(taken_over=False)
    original = lose_database(connection)
    try:
        return step("ship", _ship, "ship")
    finally:
        connection.close()
        connection.settings_dict.update(original)


@pytest.mark.django_db(transaction=True)
def test_a_step_after_a_stall_that_cannot_renew_its_ended_lease_stops_before_its_effect() -> None:
    # Whether the key was taken over meanwhile cannot be known: the work stops, unstored.
    with pytest.raises(LeaseLost, match="could not be renewed"):
        ship_after_a_stall_with_the_database_gone("stall-5")

    assert runs == {"charge": 1}


def _a_retry_now() -> str:
    """What the client's retry of the work running now would meet."""
    attempt = current_attempt()
    assert attempt is not None and attempt.claim is not None
    claim, store = attempt.claim, get_store()
    assert claim.scope is not None and claim.fingerprint is not None
    retry = replace(
        claim_request(claim.scope, fingerprint=claim.fingerprint, path=claim.path),
        method=claim.method,
        now=store.now(),
    )
    return store.begin(retry).outcome.value


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
def ship_and_retry_after_a_stall(key: str) -> str:
    step("charge", _ship, "charge")
    _the_lease_runs_out(taken_over=False)
    step("ship", _ship, "ship")
    return _a_retry_now()


@pytest.mark.django_db(transaction=True)
def test_a_step_after_a_stall_nobody_took_advantage_of_renews_the_lease_and_runs(
    store: str,
) -> None:
    # The lease is the work's again: the retry is refused, not run.
    assert ship_and_retry_after_a_stall("stall-2") == Outcome.IN_PROGRESS.value
    assert runs == {"charge": 1, "ship": 1}


@idempotent_function(key="key", payload=["key"], mode="lease", lease=60)
async def ship_async_after_a_stall(key: str, taken_over: bool) -> str:
    await astep("charge", _aship, "charge")
    await sync_to_async(_the_lease_runs_out)(taken_over=taken_over)
    await astep("ship", _aship, "ship")
    return await sync_to_async(_a_retry_now)()


async def _aship(name: str) -> str:
    return _ship(name)


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run a scenario on a new event loop; close the shared sync thread's connection after it."""

    async def closing() -> T:
        try:
            return await scenario()
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(closing())


@pytest.mark.django_db(transaction=True)
def test_an_async_step_after_a_stall_stops_before_its_effect(store: str) -> None:
    with pytest.raises(LeaseLost, match="taken over by another caller"):
        run(lambda: ship_async_after_a_stall("stall-3", True))

    assert runs == {"charge": 1}


@pytest.mark.django_db(transaction=True)
def test_an_async_step_after_a_stall_nobody_took_advantage_of_runs(store: str) -> None:
    # The lease is the work's again: the retry is refused, not run.
    assert run(lambda: ship_async_after_a_stall("stall-4", False)) == Outcome.IN_PROGRESS.value

    assert runs == {"charge": 1, "ship": 1}
