"""A model the test views write to, so tests can count how often a view really ran."""

from __future__ import annotations

from django.db import models


class Charge(models.Model):
    reference = models.CharField(max_length=255, db_index=True)
    amount = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "tests"

    def __str__(self) -> str:
        return self.reference
