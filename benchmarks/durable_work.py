"""The work benchmarks/durable.py measures: calls with and without steps, orders, recoveries."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from django.utils import timezone

from django_idempotency import KeyState, idempotent_function, lookup
from django_idempotency.models import IdempotencyRecord
from django_idempotency.steps import step
from tests.models import Charge

# Task messages are published to an in-memory broker: the relay's own cost, not a broker's.
celery_app = Celery("benchmarks", broker="memory://", set_as_current=False)
NAMESPACE = "benchmarks.durable_work.recoverable"


def echo(value: int) -> int:
    return value


@idempotent_function(key="key", mode="lease")
def call_without_steps(key: str) -> int:
    return 0


@idempotent_function(key="key", mode="lease")
def call_with_steps(key: str, steps: int) -> int:
    return sum(step(f"s{i}", echo, i) for i in range(steps))


@idempotent_function(key="key", recover=True)
def recoverable(key: str, steps: int) -> int:
    first = step("first", echo, 1)
    return first + sum(step(f"s{i}", echo, i) for i in range(1, steps))


def place_order(number: int) -> None:
    Charge.objects.create(reference=f"order-{number}", amount=number)


def expire_leases() -> None:
    """What the end of the crashed calls' leases does: their records are abandoned."""
    IdempotencyRecord.objects.update(lease_expires_at=timezone.now() - timedelta(days=1))


def completed(key: str) -> bool:
    return lookup(key, namespace=NAMESPACE).state is KeyState.COMPLETED
