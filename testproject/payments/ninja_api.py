"""The payments API again, in Django Ninja: the same guard on Ninja operations (docs/ninja.md)."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from ninja import NinjaAPI, Schema, Status

from django_idempotency.contrib.ninja import idempotent
from testproject.payments.models import Payment

api = NinjaAPI(title="Payments (Ninja)", urls_namespace="ninja-payments")


class PaymentIn(Schema):
    amount: int
    currency: str = "EUR"
    description: str = ""


class PaymentOut(Schema):
    id: int
    amount: int
    currency: str


@api.post("/payments", response={201: PaymentOut})
@idempotent(required=True)
def create_payment(request: HttpRequest, payload: PaymentIn) -> Status:
    """Charge once per Idempotency-Key; a retry gets the stored 201 back."""
    return Status(201, Payment.objects.create(**payload.dict()))


@api.post("/async/payments", response={201: PaymentOut})
@idempotent(required=True, namespace="ninja-async")
async def create_payment_async(request: HttpRequest, payload: PaymentIn) -> Status:
    """The same, as an async operation: its claim is leased, as for any async view."""
    return Status(201, await sync_to_async(Payment.objects.create)(**payload.dict()))


@api.get("/payments/{payment_id}", response=PaymentOut)
def read_payment(request: HttpRequest, payment_id: int) -> Payment:
    """A safe method: never guarded."""
    return Payment.objects.get(pk=payment_id)
