"""Payouts: money sent through the downstream bank, then settled here, once per payout.

The flow has named crash points (testproject.payments.crashes) that the reliability suite's
end-to-end scenario turns on; in a demo without them they cost nothing.
"""

from __future__ import annotations

from typing import Any

import httpx
from django.conf import settings

from django_idempotency.outbound import STEP_EXTENSION, IdempotentTransport, RetryPolicy
from testproject.payments.crashes import crash_during, crash_point
from testproject.payments.models import Payout

# How long a payout keeps asking the bank before it gives up (its client retries it later):
# shorter waits than the defaults, since the bank is on the same network.
BANK_POLICY = RetryPolicy(max_attempts=8, deadline=20, base_delay=0.05, max_delay=1)


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
    """POST the transfer to the bank through the outbound client: the key is derived from the
    payout's claim and the step's name, the same on every run of this payout, retried on a lost
    answer and journaled; a retry after a crash sends it again and gets the bank's first answer.
    """
    transport = IdempotentTransport(policy=BANK_POLICY, namespace="bank")
    with httpx.Client(transport=transport, timeout=5) as bank:
        try:
            response = bank.post(
                f"{settings.BANK_API_URL}/transfers/",
                json={"reference": reference, "amount": amount, "currency": currency},
                extensions={STEP_EXTENSION: "transfer"},
            )
        except httpx.HTTPError as exc:  # No answer within the policy: ambiguous, journaled.
            raise BankUnavailable(f"The bank gave no answer for {reference}: {exc!r}.") from exc
    if response.status_code in BANK_POLICY.retried_statuses:
        raise BankUnavailable(f"The bank answered {response.status_code} for {reference}.")
    response.raise_for_status()
    return dict(response.json())
