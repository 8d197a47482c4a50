"""Idempotent Celery tasks the tests send to real workers; each run writes a `Charge`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django_idempotency.contrib.celery import idempotent_task
from tests.models import Charge


@idempotent_task(acks_late=True)
def record_payment(reference: str, amount: int, pause_marker: str = "") -> dict[str, Any]:
    """Keyed by the message id. With a marker, the first run pauses there so it can be killed."""
    charge = Charge.objects.create(reference=reference, amount=amount)
    if pause_marker and not Path(pause_marker).exists():
        Path(pause_marker).touch()
        time.sleep(60)
    return {"charge": charge.pk, "reference": reference}


@idempotent_task(key="reference", namespace="refund-tasks")
def refund(reference: str, amount: int) -> int:
    """Keyed by an argument: another message for the same refund is a duplicate."""
    return Charge.objects.create(reference=reference, amount=-amount).pk


class FlakyBank(ConnectionError):
    """The downstream call failed: worth retrying."""


@idempotent_task(
    bind=True,
    autoretry_for=(FlakyBank,),
    max_retries=3,
    default_retry_delay=0,
)
def flaky_payment(self: Any, reference: str, failures: int) -> dict[str, Any]:
    """Writes, then fails its first `failures` attempts: each retry must run, once."""
    charge = Charge.objects.create(reference=reference, amount=self.request.retries)
    if self.request.retries < failures:
        raise FlakyBank(f"attempt {self.request.retries} failed")
    return {"charge": charge.pk, "attempt": self.request.retries}
