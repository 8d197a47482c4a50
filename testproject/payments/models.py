"""Payments, refunds, payouts and shipments: the side effects a retry must not repeat."""

from __future__ import annotations

from django.db import models


class Payment(models.Model):
    amount = models.PositiveIntegerField(help_text="Amount in the currency's minor unit.")
    currency = models.CharField(max_length=3, default="EUR")
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.amount} {self.currency}"


class Refund(models.Model):
    payment = models.ForeignKey(Payment, on_delete=models.CASCADE, related_name="refunds")
    amount = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"refund of {self.amount} on payment {self.payment_id}"


class Payout(models.Model):
    """Money sent out through the bank, recorded once the bank has moved it (the settlement)."""

    reference = models.CharField(
        max_length=200, unique=True, help_text="The payout's reference, sent to the bank."
    )
    amount = models.PositiveIntegerField(help_text="Amount in the currency's minor unit.")
    currency = models.CharField(max_length=3, default="EUR")
    bank_transfer = models.BigIntegerField(help_text="The bank's id of the transfer.")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"payout {self.reference} of {self.amount} {self.currency}"


class Shipment(models.Model):
    """A parcel the warehouse sent: one row each time it ships, however often it was asked to."""

    key = models.CharField(
        max_length=255, help_text="The Idempotency-Key the shipment was made under."
    )
    order = models.PositiveBigIntegerField(help_text="The shop's order shipped (its payment).")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"shipment of order {self.order}"
