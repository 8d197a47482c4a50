"""Django Ninja integration: `@idempotent` on Ninja operations, their errors and their schema."""

from __future__ import annotations

from django_idempotency.contrib import missing

try:
    from django_idempotency.contrib.ninja.operations import idempotent
except ModuleNotFoundError as exc:
    raise missing(exc, "ninja") from exc

__all__ = ["idempotent"]
