"""Settings as the checks read them: the raw value as written, a dotted path loaded or an error."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured

from django_idempotency.checks.ids import (
    UNKNOWN_METHOD,
    UNRESOLVABLE_PATH,
)

if TYPE_CHECKING:
    pass


_UNSET = object()


def _setting(name: str) -> Any:
    """The raw value, or `_UNSET`: defaults are valid, so only explicit values need checking."""
    return getattr(settings, name, _UNSET)


def _load(name: str, load: Callable[[], Any], hint: str) -> Any:
    """What `load` returns, or the Error that says why it cannot be imported."""
    try:
        return load()
    except Exception as exc:  # Also a module that fails while importing: an Error, no traceback.
        ours = isinstance(exc, ImproperlyConfigured) and str(exc).startswith(name)
        message = str(exc) if ours else f"{name} = {_setting(name)!r} cannot be imported: {exc!r}"
    return Error(message, hint=hint, id=UNRESOLVABLE_PATH)


# The methods a Django view can handle (View.http_method_names): any other name is a typo that
# leaves the method it meant unguarded.
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE")


def unknown_methods(where: str, methods: Any) -> list[Error]:
    """An error per name in `methods` (a name or a sequence of names) that is no HTTP method."""
    names = [methods] if isinstance(methods, str) else methods
    return [
        Error(
            f"{where} lists {name!r}, which is not an HTTP method: the method meant is not"
            " guarded.",
            hint=f"Spell it as one of {', '.join(HTTP_METHODS)} (PATCH, not PATHC).",
            id=UNKNOWN_METHOD,
        )
        for name in names
        if isinstance(name, str) and name.upper() not in HTTP_METHODS
    ]


def _seconds(value: timedelta) -> str:
    seconds = value.total_seconds()
    return f"{seconds:g} second" + ("" if seconds == 1 else "s")
