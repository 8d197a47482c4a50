"""Work that arrives without an HTTP request, made exactly-once with `@idempotent_function`."""

from __future__ import annotations

from dataclasses import dataclass

from django_idempotency import idempotent_function
from testproject.payments import bank
from testproject.payments.models import Payment


@dataclass
class Settlement:
    payment: int
    bank_reference: str


@idempotent_function(key="payment_id", namespace="settlements")
def settle_payment(payment_id: int) -> Settlement:
    """Move a payment's money once; settling it again returns the first `Settlement`."""
    payment = Payment.objects.get(pk=payment_id)
    return Settlement(payment=payment.pk, bank_reference=bank.transfer(payment))
