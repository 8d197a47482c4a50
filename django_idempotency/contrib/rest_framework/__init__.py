"""Django REST framework integration: `IdempotencyMixin` for views and viewsets."""

from __future__ import annotations

from django_idempotency.contrib.rest_framework.mixins import IdempotencyMixin

__all__ = ["IdempotencyMixin"]
