"""IDEMPOTENCY_GUARD_ALL_VIEWS: every DRF view guarded exactly as if it had IdempotencyMixin."""

from __future__ import annotations

import functools
import inspect
from typing import Any

from django_idempotency.conf import conf
from django_idempotency.contrib.rest_framework.mixins import IdempotencyMixin
from django_idempotency.http.exempt import exempt_by_default
from django_idempotency.http.options import VIEW_ATTRIBUTES, is_exempt
from django_idempotency.http.requests import SAFE_METHODS

# What @idempotent guards: every method but the safe ones.
UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def install() -> None:
    """Wrap `APIView.initial` once. With the setting off, the wrapper calls straight through.

    Installed whatever the setting, so that `override_settings` turns the guard on and off.
    """
    from rest_framework.views import APIView

    original = APIView.initial
    if getattr(original, "guards_all_views", False):
        return

    @functools.wraps(original)
    def initial(self: Any, request: Any, *args: Any, **kwargs: Any) -> None:
        if (
            isinstance(self, IdempotencyMixin)  # Guarded by the mixin: never twice.
            or request.method in SAFE_METHODS
            or not guarding_all_views()
            or _opted_out(self, request)
        ):
            return original(self, request, *args, **kwargs)
        # From here on the view is an instance of its class with the mixin in front, so the
        # mixin's hooks run: authentication with the body kept readable, the guard around the
        # handler, problem+json for unreadable bodies.
        self.__class__ = with_mixin(type(self))  # type: ignore[arg-type]
        return self.initial(request, *args, **kwargs)  # type: ignore[no-any-return]

    initial.guards_all_views = True  # type: ignore[attr-defined]
    APIView.initial = initial  # type: ignore[method-assign]


def guarding_all_views() -> bool:
    """IDEMPOTENCY_GUARD_ALL_VIEWS is on, and idempotency itself is."""
    return conf.GUARD_ALL_VIEWS and conf.ENABLED


def _opted_out(view: Any, request: Any) -> bool:
    """Exempt (the view, its route or its handler; a credential view or one that
    IDEMPOTENCY_EXEMPT_VIEWS names), or guarded by `@idempotent` already."""
    handler = _function(getattr(type(view), request.method.lower(), None))
    route = getattr(request._request.resolver_match, "func", None)
    return (
        hasattr(handler, "idempotency_options")
        or is_exempt(view, route, handler)
        or exempt_by_default(view, route)
    )


def _function(handler: Any) -> Any:
    """What a handler runs: for an `@api_view` function, the function it was given (DRF calls
    it from a handler of its own), whose attributes the decorators below `@api_view` set."""
    if getattr(handler, "__qualname__", "").startswith("api_view."):
        cells = getattr(handler, "__closure__", None) or ()
        return next((cell.cell_contents for cell in cells if callable(cell.cell_contents)), None)
    return handler


@functools.cache
def with_mixin(view_class: type) -> type:
    """`view_class` with IdempotencyMixin first; its own idempotency_* attributes still win."""
    names = (*VIEW_ATTRIBUTES, "idempotent_methods")
    # As declared, not as read through the class: a staticmethod `idempotency_verify` stays one.
    namespace: dict[str, Any] = {
        name: inspect.getattr_static(view_class, name)
        for name in names
        if getattr(view_class, name, None) is not None
    }
    namespace.setdefault("idempotent_methods", UNSAFE_METHODS)
    namespace["__module__"] = view_class.__module__
    namespace["__qualname__"] = view_class.__qualname__
    return type(view_class.__name__, (IdempotencyMixin, view_class), namespace)
