"""django-idempotency: a retried request runs once; every retry gets the same response back."""

from __future__ import annotations

from django_idempotency.core.keys import mint_key, new_key
from django_idempotency.decorators import idempotent

__all__ = ["idempotent", "mint_key", "new_key"]
__version__ = "0.1.0"
