"""Which guarded views answer with credentials, whose responses are never stored by default."""

from __future__ import annotations

import functools
from typing import Any

from django_idempotency.http.exempt import CREDENTIAL_VIEWS
from django_idempotency.options import Credentials

_KNOWN = frozenset(CREDENTIAL_VIEWS)


def answers_credentials(chosen: Credentials | None, *views: Any) -> bool:
    """Whether a view's response must not be stored: it said so (``credentials="release"``), or,
    saying nothing, it is one of `CREDENTIAL_VIEWS` (the view, its class or the URL's callback)."""
    if chosen is not None:
        return chosen == "release"
    return any(_is_known(view) for view in views if view is not None)


def _is_known(view: Any) -> bool:
    # A URL's callback made by as_view() names its class (DRF's `cls`, Django's `view_class`).
    view = getattr(view, "cls", None) or getattr(view, "view_class", None) or view
    if not isinstance(view, type):
        if _dotted(view) in _KNOWN:  # A view function, or a bound method (the admin's login).
            return True
        view = type(view)
    return _class_is_known(view)


@functools.cache
def _class_is_known(view_class: type) -> bool:
    """Looked up once per class: every stored response asks."""
    return any(_dotted(cls) in _KNOWN for cls in view_class.__mro__)


def _dotted(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
