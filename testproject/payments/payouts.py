"""Payouts: money sent through the downstream bank, then settled here, once per payout.

The flow has named crash points (testproject.payments.crashes) that the reliability suite's
end-to-end scenario turns on; in a demo without them they cost nothing.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings

from django_idempotency import mint_key
from testproject.payments.crashes import crash_during, crash_point
from testproject.payments.models import Payout

# How long a payout keeps asking the bank before it gives up (the client retries it later).
BANK_DEADLINE = 20.0
# Statuses worth asking again with the same key: the bank is busy or still running it.
RETRIED = {409, 429, 502, 503, 504}


class BankUnavailable(RuntimeError):
    """The bank gave no final answer before the deadline; the payout may be retried."""


def pay_out(reference: str, amount: int, currency: str, key: str) -> dict[str, Any]:
    """Send the payout's transfer to the bank, record its settlement, return both.

    `key` is the payout's own idempotency key: the crash points are drawn from it.
    """
    crash_point("before-call", key)
    with crash_during("during-call", key, within=0.2):
        transfer = send_transfer(reference, amount, currency)
    crash_point("after-bank", key)
    crash_point("after-step", key)
    # The settlement is keyed by the reference: a retry that gets here again finds it.
    payout, _ = Payout.objects.get_or_create(
        reference=reference,
        defaults={"amount": amount, "currency": currency, "bank_transfer": transfer["id"]},
    )
    return {
        "reference": reference,
        "amount": amount,
        "currency": currency,
        "bank_transfer": payout.bank_transfer,
        "payout": payout.pk,
    }


def send_transfer(reference: str, amount: int, currency: str) -> dict[str, Any]:
    """POST the transfer to the bank until it answers, always with the key minted from the
    payout's reference: a retry after a lost answer gets the bank's first answer replayed."""
    key = mint_key("transfer", reference, namespace="payouts")
    body = json.dumps({"reference": reference, "amount": amount, "currency": currency}).encode()
    deadline = time.monotonic() + BANK_DEADLINE
    delay = 0.05
    while True:
        request = urllib.request.Request(
            f"{settings.BANK_API_URL}/transfers/",
            data=body,
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return dict(json.load(response))
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRIED:
                raise
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            pass  # No answer: the bank may have moved the money; the same key asks again.
        if time.monotonic() + delay > deadline:
            raise BankUnavailable(f"The bank gave no answer for {reference} in {BANK_DEADLINE} s.")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
