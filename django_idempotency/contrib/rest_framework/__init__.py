"""Django REST framework integration: `IdempotencyMixin` for views and viewsets."""

from __future__ import annotations

from django_idempotency.contrib.rest_framework.adapter import RestFramework
from django_idempotency.contrib.rest_framework.mixins import IdempotencyMixin
from django_idempotency.http import frameworks

# How http/ and @idempotent know DRF's Request, handlers and errors. Plugged in on import: the
# app's ready() imports this package whenever DRF is installed, before any request is served.
frameworks.plug_in(RestFramework())

__all__ = ["IdempotencyMixin"]
