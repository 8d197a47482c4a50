"""The downstream bank API: each transfer's key is minted from its payment, so retries are safe."""

from __future__ import annotations

import json
import urllib.request

from django.conf import settings

from django_idempotency import mint_key
from testproject.payments.models import Payment


def transfer(payment: Payment) -> str:
    """Send the payment's transfer to the bank and return the bank's reference for it.

    The key depends on the payment alone: a retry after a timeout, from a restarted worker or
    another machine sends the same key, and the bank's own idempotency answers it with the first
    transfer instead of moving the money twice.
    """
    key = mint_key("transfer", payment.pk, namespace="bank")
    if not settings.BANK_API_URL:  # The demo has no bank: answer as one would.
        return f"offline-{key[:16]}"
    request = urllib.request.Request(
        f"{settings.BANK_API_URL}/transfers",
        data=json.dumps({"amount": payment.amount, "currency": payment.currency}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.load(response)["id"])
