"""Recovery without a client: a `recover=True` call abandoned mid-way is called again by the
sweep, resumes after its stored steps, and is given up (failed) after the sweep's attempts."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import time
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from celery import Celery
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_idempotency import KeyState, idempotent_function, lookup
from django_idempotency.contrib.celery import idempotent_task
from django_idempotency.models import IdempotencyRecord, RecoverableOperation
from django_idempotency.outbound import RetryPolicy
from django_idempotency.recovery import recover_operations, retry_failed
from django_idempotency.steps import step
from django_idempotency.testing import CrashPoint, crash_at, crash_environment
from tests import clock_processes
from tests.models import Charge
from tests.stores import using_store

pytestmark = pytest.mark.django_db(transaction=True)

NAMESPACE = "tests.test_recovery.fulfil"
NO_BACKOFF = RetryPolicy(max_attempts=2, base_delay=0, max_delay=0, deadline=float("inf"))
FAILS: list[bool] = []


def long_ago() -> datetime:
    """A moment long past, aware or naive as USE_TZ has it."""
    return timezone.now() - timedelta(days=1)


# Each call of `fulfil` pops one: True raises after its first step.


def charge(order: int, amount: int) -> int:
    return Charge.objects.create(reference=f"order-{order}", amount=amount).pk


@idempotent_function(key="order", recover=True, lease=timedelta(seconds=1))
def fulfil(order: int, amount: int) -> dict[str, int]:
    charged = step("charge", charge, order, amount)
    if FAILS and FAILS.pop(0):
        raise ConnectionError("the warehouse did not answer")
    shipped = step("ship", charge, order, 0)
    return {"charge": charged, "shipment": shipped}


def kept() -> list[tuple[str, str, int]]:
    return list(RecoverableOperation.objects.values_list("key", "state", "attempts"))


def test_a_completed_call_leaves_nothing_to_recover() -> None:
    assert fulfil(1, 500)["charge"] == Charge.objects.get(amount=500).pk
    assert kept() == []
    assert recover_operations().cleared == 0


def test_an_abandoned_call_is_called_again_and_resumes_after_its_steps() -> None:
    FAILS[:] = [True]
    with pytest.raises(ConnectionError):
        fulfil(2, 700)
    assert lookup("2", namespace=NAMESPACE).state is KeyState.ABANDONED
    assert kept() == [("2", "running", 0)]

    report = recover_operations()

    assert report.recovered == 1
    status = lookup("2", namespace=NAMESPACE)
    assert status.state is KeyState.COMPLETED
    assert status.result()["charge"] == Charge.objects.get(amount=700).pk  # Charged once.
    assert Charge.objects.count() == 2 and kept() == []


def test_a_call_whose_worker_was_killed_is_recovered_by_the_sweep() -> None:
    env = {**clock_processes.environment("database"), **crash_environment("step.saved:charge")}
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); import tests.test_recovery as t; t.fulfil(3, 900)",
        ],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == -9, child.stderr.decode()
    assert recover_operations().waiting == 1  # Its lease still runs: nobody takes it yet.

    time.sleep(1.2)  # The lease (1 s) ends: the worker is gone, nobody renews it.
    assert recover_operations().recovered == 1

    assert list(Charge.objects.values_list("amount", flat=True).order_by("pk")) == [900, 0]
    assert lookup("3", namespace=NAMESPACE).state is KeyState.COMPLETED


def test_a_call_that_keeps_failing_is_given_up_then_retried_on_request() -> None:
    FAILS[:] = [True, True, True]
    with pytest.raises(ConnectionError):
        fulfil(4, 100)

    reports = [recover_operations(policy=NO_BACKOFF) for _ in range(3)]

    assert [(r.retried, r.failed) for r in reports] == [(1, 0), (1, 0), (0, 1)]
    assert kept() == [("4", "failed", 2)]
    assert lookup("4", namespace=NAMESPACE).state is KeyState.FAILED
    assert RecoverableOperation.objects.get().last_error.startswith("ConnectionError")

    assert retry_failed(list(RecoverableOperation.objects.values_list("pk", flat=True))) == 1
    assert recover_operations(policy=NO_BACKOFF).recovered == 1
    assert lookup("4", namespace=NAMESPACE).state is KeyState.COMPLETED
    assert Charge.objects.filter(amount=100).count() == 1


def test_a_call_given_back_or_completed_by_its_caller_is_cleared() -> None:
    FAILS[:] = [True]
    with pytest.raises(ConnectionError):
        fulfil(5, 100)
    fulfil(5, 100)  # The caller retried it itself.
    RecoverableOperation.objects.create(  # Kept by a call whose record has since gone.
        namespace=NAMESPACE,
        key="6",
        kind="function",
        target="tests.test_recovery:fulfil",
        arguments=b"P{}",
        next_attempt_at=long_ago(),
        created_at=long_ago(),
        updated_at=long_ago(),
    )

    assert recover_operations().cleared == 1
    assert kept() == []


def test_the_arguments_are_kept_encrypted_when_encryption_is_on() -> None:
    FAILS[:] = [True]
    with override_settings(IDEMPOTENCY_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        with pytest.raises(ConnectionError):
            fulfil(7, 4242)
        assert b"4242" not in bytes(RecoverableOperation.objects.get().arguments)
        assert recover_operations().recovered == 1
    assert Charge.objects.filter(amount=4242).count() == 1


def test_a_crash_right_after_the_claim_is_recovered_too() -> None:
    with crash_at("claimed"), pytest.raises(CrashPoint):
        fulfil(8, 10)
    IdempotencyRecord.objects.update(lease_expires_at=long_ago())

    recover_operations()

    assert lookup("8", namespace=NAMESPACE).state in (KeyState.COMPLETED, KeyState.ABSENT)


tasks_app = Celery("tests.test_recovery", set_as_current=False)


@idempotent_task(app=tasks_app, recover=True, lease=timedelta(seconds=1), bind=True)
def ship_order(self: Any, order: int) -> int:
    charged = step("charge", charge, order, 1)
    if FAILS and FAILS.pop(0):
        raise ConnectionError("the courier did not answer")
    return charged


def test_a_task_is_recovered_under_its_own_task_id() -> None:
    FAILS[:] = [True]
    with pytest.raises(ConnectionError):
        ship_order.apply(args=(9,), task_id="message-9", throw=True)

    assert recover_operations(app=tasks_app).recovered == 1

    status = lookup("message-9", namespace="tests.test_recovery.ship_order")
    assert status.result() == Charge.objects.get().pk


def test_the_command_runs_one_sweep() -> None:
    FAILS[:] = [True]
    with pytest.raises(ConnectionError):
        fulfil(10, 1)
    out = StringIO()

    call_command("idempotency_recover", stdout=out)

    assert out.getvalue().startswith("Recovered 1 call(s)")


def test_what_cannot_be_recovered_is_refused_before_it_runs() -> None:
    with pytest.raises(TypeError, match="JSON"):
        fulfil(object(), 1)
    with pytest.raises(ImproperlyConfigured, match="atomic"):
        idempotent_function(key="order", recover=True, mode="atomic")(charge)
    with pytest.raises(ImproperlyConfigured, match="top level"):

        @idempotent_function(key="order", recover=True)
        def local(order: int) -> None: ...

    with pytest.raises(ImproperlyConfigured, match="synchronous"):

        @idempotent_function(key="order", recover=True)
        async def later(order: int) -> None: ...

    with using_store("memory"), pytest.raises(ImproperlyConfigured, match="database store"):
        fulfil(11, 1)
    assert not Charge.objects.exists()


def test_arguments_that_would_come_back_changed_are_refused_before_it_runs() -> None:
    """A tuple kept as JSON comes back a list: the sweep's call would name another key."""
    with pytest.raises(TypeError, match="JSON"):
        fulfil_by_callable_key((7, 8), 100)
    assert not Charge.objects.exists() and kept() == []


TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="")


@idempotent_function(
    key=lambda order, amount: f"order-{order}",
    owner=lambda order, amount: TENANT.get(),
    recover=True,
    lease=timedelta(seconds=1),
)
def fulfil_by_callable_key(order: Any, amount: int) -> int:
    charged = step("charge", charge, 0, amount)
    if FAILS and FAILS.pop(0):
        raise ConnectionError("the warehouse did not answer")
    return charged


def test_a_call_whose_arguments_no_longer_name_its_key_is_failed_not_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An owner read from the context (not the arguments) is not there in the sweep: called
    again, it would run as another operation. It is given up instead, and said why."""
    FAILS[:] = [True]
    TENANT.set("acme")
    try:
        with pytest.raises(ConnectionError):
            fulfil_by_callable_key(12, 300)
    finally:
        TENANT.set("")

    report = recover_operations()

    assert (report.recovered, report.failed) == (0, 1)
    assert Charge.objects.count() == 1
    (row,) = RecoverableOperation.objects.all()
    assert (row.state, row.owner) == ("failed", "acme")
    assert "another key or owner" in row.last_error
    assert "order-12" not in caplog.text  # Logs name a key by its hash only.


def test_keys_that_differ_only_by_case_are_two_calls() -> None:
    """On MariaDB too: "Order-A" completing must not forget "order-a"'s kept call."""
    FAILS[:] = [True]
    with pytest.raises(ConnectionError):
        fulfil_named("Order-A")
    fulfil_named("order-a")

    assert recover_operations().recovered == 1
    assert lookup("Order-A", namespace="tests.test_recovery.fulfil_named").state is (
        KeyState.COMPLETED
    )


@idempotent_function(key="name", recover=True, lease=timedelta(seconds=1))
def fulfil_named(name: str) -> int:
    charged = step("charge", charge, 0, 1)
    if FAILS and FAILS.pop(0):
        raise ConnectionError("the warehouse did not answer")
    return charged


@pytest.mark.parametrize("batch_size", [0, -1, 1.5])
def test_a_sweep_of_no_calls_is_refused(batch_size: Any) -> None:
    with pytest.raises(ValueError):
        recover_operations(batch_size=batch_size)
