"""Transfers: one row each time the bank moves money, however often it was asked to."""

from __future__ import annotations

from django.db import models


class Transfer(models.Model):
    key = models.CharField(
        max_length=255, help_text="The Idempotency-Key the transfer was executed under."
    )
    reference = models.CharField(max_length=200, help_text="The caller's payment reference.")
    amount = models.PositiveIntegerField(help_text="Amount in the currency's minor unit.")
    currency = models.CharField(max_length=3, default="EUR")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"transfer of {self.amount} {self.currency} for {self.reference}"
