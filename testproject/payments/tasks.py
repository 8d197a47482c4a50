"""Celery tasks of the demo: a receipt is mailed once per message, however often it arrives."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.mail import send_mail

from django_idempotency.contrib.celery import idempotent_task
from testproject.payments.models import Payment
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
