"""Calls this project makes to other APIs: a derived key, retries, and a journal of attempts.

The httpx transports (extra ``httpx``) and the requests adapter (extra ``requests``) are imported
when first named, so the rest works with neither installed; see docs/outbound.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from django_idempotency.outbound.keys import (
    KEY_HEADER,
    STEP_EXTENSION,
    STEP_HEADER,
    OutsideOperation,
    key_for,
)
from django_idempotency.outbound.outcomes import was_replayed
from django_idempotency.outbound.policy import RetryPolicy

if TYPE_CHECKING:
    from django_idempotency.outbound.adapter import IdempotentAdapter, idempotent_session
    from django_idempotency.outbound.transport import (
        AsyncIdempotentTransport,
        IdempotentTransport,
    )

# The names whose module needs an extra, and that module.
_LAZY = {
    "IdempotentTransport": "django_idempotency.outbound.transport",
    "AsyncIdempotentTransport": "django_idempotency.outbound.transport",
    "IdempotentAdapter": "django_idempotency.outbound.adapter",
    "idempotent_session": "django_idempotency.outbound.adapter",
}

__all__ = [
    "KEY_HEADER",
    "STEP_EXTENSION",
    "STEP_HEADER",
    "AsyncIdempotentTransport",
    "IdempotentAdapter",
    "IdempotentTransport",
    "OutsideOperation",
    "RetryPolicy",
    "idempotent_session",
    "key_for",
    "was_replayed",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
