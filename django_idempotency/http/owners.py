"""Owner resolvers: who a key belongs to, so one client never receives another's response."""

from __future__ import annotations

from typing import Any


def authenticated_user(request: Any) -> str:
    """The authenticated user's primary key; anonymous requests share the empty owner."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return ""
    return str(user.pk)
