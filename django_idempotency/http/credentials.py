"""Which guarded views answer with credentials, whose responses are never stored by default."""

from __future__ import annotations

from typing import Any

from django_idempotency.http.exempt import is_credential_view
from django_idempotency.options import Credentials


def answers_credentials(chosen: Credentials | None, *views: Any) -> bool:
    """Whether a view's response must not be stored: it said so (``credentials="release"``), or,
    saying nothing, it is one of `exempt.CREDENTIAL_VIEWS` (the view, its class or the URL's
    callback)."""
    if chosen is not None:
        return chosen == "release"
    return is_credential_view(*views)
