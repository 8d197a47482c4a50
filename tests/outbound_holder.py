"""A process that charges a downstream API from a lease-mode operation, then works until killed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx

from django_idempotency import idempotent_function

LEASE = 1.0  # Seconds: renewed while the process lives, run out within one once it is killed.


@idempotent_function(key="order", payload=["order", "amount"], mode="lease", lease=LEASE)
def charge_then_work(order: str, amount: int, url: str, marker: str, seconds: float) -> int:
    """Charge `amount` at `url` in step "charge", say so (by creating `marker`), then work for
    `seconds`; the downstream's charge id."""
    from django_idempotency.outbound import IdempotentTransport  # Its models need Django set up.

    step = {"idempotency_step": "charge"}
    with httpx.Client(transport=IdempotentTransport(namespace="bank")) as client:
        charged = client.post(url, json={"amount": amount}, extensions=step)
    Path(marker).touch()
    time.sleep(seconds)
    return int(charged.json()["id"])


if __name__ == "__main__":
    import django

    django.setup()
    # Imported by its name, not run as __main__: the label of the function, and with it the
    # record's path, is then the one the test process calls it by.
    from tests.outbound_holder import charge_then_work as holder

    order, amount, url, marker, seconds = sys.argv[1:]
    holder(order, int(amount), url, marker, float(seconds))
