"""django-idempotency: a retried request runs once; every retry gets the same response back."""

from __future__ import annotations

from django_idempotency.core.keys import mint_key, new_key
from django_idempotency.decorators import idempotency_exempt, idempotent
from django_idempotency.functions import idempotent_function
from django_idempotency.lookups import KeyState, KeyStatus, lookup, wait_for

__all__ = [
    "KeyState",
    "KeyStatus",
    "idempotency_exempt",
    "idempotent",
    "idempotent_function",
    "lookup",
    "mint_key",
    "new_key",
    "wait_for",
]
__version__ = "0.1.0"
