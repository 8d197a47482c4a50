"""Celery tasks of the demo: a receipt is mailed once per message, however often it arrives; a
payout is sent through the bank once per reference."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.mail import send_mail

from django_idempotency.contrib.celery import idempotent_task
from testproject.payments.models import Payment
from testproject.payments.payouts import BankUnavailable, pay_out
from testproject.payments.services import settle_payment


@idempotent_task(acks_late=True)
def send_receipt(payment_id: int) -> str:
    """Keyed by the message id: a redelivered message returns the stored answer, mails nothing."""
    payment = Payment.objects.get(pk=payment_id)
    recipient = f"customer-{payment.pk}@example.com"
    send_mail(
        subject=f"Receipt for payment {payment.pk}",
        message=f"We received {payment.amount} {payment.currency}.",
        from_email="payments@example.com",
        recipient_list=[recipient],
    )
    return recipient


@idempotent_task(key="payment_id", namespace="settle-tasks", acks_late=True)
def settle(payment_id: int) -> dict[str, Any]:
    """Keyed by the payment: any message asking to settle it again is a duplicate."""
    return asdict(settle_payment(payment_id))


@idempotent_task(
    key="reference",
    namespace="payout-tasks",
    mode="lease",
    acks_late=True,
    autoretry_for=(BankUnavailable,),
    retry_backoff=True,
)
def pay_out_later(reference: str, amount: int, currency: str = "EUR") -> dict[str, Any]:
    """The payout of POST /api/payouts/ as a task, keyed by its reference.

    A worker killed mid-payout leaves the message unacknowledged: the broker delivers it again,
    and the new delivery takes the claim over once its lease has ended, calling the bank with
    the same key.
    """
    return pay_out(reference, amount, currency, key=reference)
