"""django-idempotency: a retried request runs once; every retry gets the same response back."""

from __future__ import annotations

from django_idempotency.core.keys import mint_key, new_key
from django_idempotency.decorators import idempotency_exempt, idempotent
from django_idempotency.functions import idempotent_function

__all__ = ["idempotency_exempt", "idempotent", "idempotent_function", "mint_key", "new_key"]
__version__ = "0.1.0"
