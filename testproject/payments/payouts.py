"""Payouts: money sent through the downstream bank, then settled here, once per payout.

The flow has named crash points (testproject.payments.crashes) that the reliability suite's
end-to-end scenario turns on; in a demo without them they cost nothing.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from django.conf import settings

from django_idempotency.outbound import IdempotentTransport, RetryPolicy
from django_idempotency.steps import step
from testproject.payments.crashes import crash_during, crash_point
from testproject.payments.models import Payout

# How long a payout keeps asking the bank before it gives up (its client retries it later):
# shorter waits than the defaults, since the bank is on the same network.
BANK_POLICY = RetryPolicy(max_attempts=8, deadline=20, base_delay=0.05, max_delay=1)


class BankUnavailable(RuntimeError):
    """The bank gave no final answer before the deadline; the payout may be retried."""


def pay_out(
    reference: str, amount: int, currency: str, key: str, delay: float = 0
) -> dict[str, Any]:
    """Send the payout's transfer to the bank, record its settlement, return both: two steps,
    so that a retry after a crash skips the ones done (django_idempotency.steps).

    `key` is the payout's own idempotency key: the crash points are drawn from it. `delay`:
    seconds the payout waits between its steps (a slow payout, for watching the lease renewed).
    """
    crash_point("before-call", key)
    transfer = step("transfer", send_transfer, reference, amount, currency, key)
    crash_point("after-step", key)
    time.sleep(delay)
    return step("settlement", settle, reference, amount, currency, transfer["id"])


def send_transfer(reference: str, amount: int, currency: str, key: str) -> dict[str, Any]:
    """POST the transfer to the bank through the outbound client: the key is derived from the
    payout's claim and the running step, the same on every run of this payout, retried when
    the answer is lost, and journaled; a retry after a crash sends it again and gets the bank's
    first answer."""
    transport = IdempotentTransport(policy=BANK_POLICY, namespace="bank")
    with (
        httpx.Client(transport=transport, timeout=5) as bank,
        crash_during("during-call", key, within=0.2),
    ):
        try:
            response = bank.post(
                f"{settings.BANK_API_URL}/transfers/",
                json={"reference": reference, "amount": amount, "currency": currency},
            )
        except httpx.HTTPError as exc:  # No answer within the policy: ambiguous, journaled.
            raise BankUnavailable(f"The bank gave no answer for {reference}: {exc!r}.") from exc
    crash_point("after-bank", key)  # The bank answered; the step is not stored yet.
    if response.status_code in BANK_POLICY.retried_statuses:
        raise BankUnavailable(f"The bank answered {response.status_code} for {reference}.")
    response.raise_for_status()
    return dict(response.json())


def settle(reference: str, amount: int, currency: str, bank_transfer: int) -> dict[str, Any]:
    """Record the settlement. Keyed by the reference: a run that crashed between this write and
    the step's result being stored finds it on the retry."""
    payout, _ = Payout.objects.get_or_create(
        reference=reference,
        defaults={"amount": amount, "currency": currency, "bank_transfer": bank_transfer},
    )
    return {
        "reference": reference,
        "amount": amount,
        "currency": currency,
        "bank_transfer": payout.bank_transfer,
        "payout": payout.pk,
    }
