"""Celery integration: `idempotent_task`, a task whose body runs once per key."""

from __future__ import annotations

from django_idempotency.contrib import missing

try:
    from django_idempotency.contrib.celery.decorators import idempotent_task
except ModuleNotFoundError as exc:
    raise missing(exc, "celery") from exc

__all__ = ["idempotent_task"]
