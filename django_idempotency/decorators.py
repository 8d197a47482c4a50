"""`@idempotent`: the same guard on function views, view methods, DRF handlers, sync or async."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, overload

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from django_idempotency.conf import Mode, OnConflict, require_installed
from django_idempotency.http import frameworks, guard, misplaced
from django_idempotency.http.options import Options
from django_idempotency.http.requests import is_request
from django_idempotency.options import Credentials

View = TypeVar("View", bound=Callable[..., Any])


@overload
def idempotent(view: View, /) -> View: ...


@overload
def idempotent(
    *,
    required: bool | None = None,
    ttl: timedelta | float | None = None,
    lease: timedelta | float | None = None,
    mode: Mode | None = None,
    on_conflict: OnConflict | None = None,
    namespace: str | None = None,
    header: str | None = None,
    verify: Callable[[Any], None] | None = None,
    credentials: Credentials | None = None,
) -> Callable[[View], View]: ...


def idempotent(
    view: Any = None,
    /,
    *,
    required: bool | None = None,
    ttl: timedelta | float | None = None,
    lease: timedelta | float | None = None,
    mode: Mode | None = None,
    on_conflict: OnConflict | None = None,
    namespace: str | None = None,
    header: str | None = None,
    verify: Callable[[Any], None] | None = None,
    credentials: Credentials | None = None,
) -> Any:
    """Run the view once per idempotency key; replay its stored response to every retry.

    Guards every unsafe method that reaches the view. Options left out come from the view's
    ``idempotency_*`` attributes (see `IdempotencyMixin`), then from the ``IDEMPOTENCY_*``
    settings. ``header`` reads the key from another header, e.g. ``webhook-id``; ``verify``
    is called with the request before anything is claimed and rejects it by raising
    `DeliveryRejected` (see `django_idempotency.webhooks.StandardWebhooks`).
    ``credentials="release"`` marks a view whose responses are credentials (a token): its key
    is given back once it answers, and its response never stored; ``"store"`` stores the
    response of a credential view all the same. ``lease`` is the length of a lease-mode claim
    (renewed while the view runs, so it may be far shorter than the view).
    """
    options = Options(
        required=required,
        ttl=ttl,
        lease=lease,
        mode=mode,
        on_conflict=on_conflict,
        namespace=namespace,
        header=header,
        verify=verify,
        credentials=credentials,
    )

    def decorate(func: View) -> View:
        require_installed()  # Views are usually imported once the apps are ready.
        # Misplaced, it cannot guard: reported by the system check (E024) as the URLconf is
        # imported, rather than raised there under a traceback, and never run unguarded.
        if isinstance(func, type):
            # Wrapping a class would hand the router or as_view() a function in its place.
            return misplaced.refusing_class(func, _on_class(func))  # type: ignore[return-value]
        view_class = getattr(func, "cls", None) or getattr(func, "view_class", None)
        if view_class is not None:
            refused = misplaced.refusing_view(func, _above_as_view(view_class))
            return refused  # type: ignore[return-value]
        wrapper = guarded(func, options)
        functools.update_wrapper(wrapper, func)
        wrapper.idempotency_options = options  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate(view) if view is not None else decorate


def _on_class(view_class: type) -> misplaced.Misplaced:
    return misplaced.Misplaced(
        place=f"the class {view_class.__module__}.{view_class.__qualname__}",
        why="it cannot guard a class, so each request to it is answered 500 and not run.",
        hint="Put it on the handler methods or actions instead (def create(self, request), def"
        " post(self, request)), or give a DRF view IdempotencyMixin.",
    )


def _above_as_view(view_class: type) -> misplaced.Misplaced:
    # The function as_view() returns is named "view": name what the user wrote.
    return misplaced.Misplaced(
        place=f"{view_class.__module__}.{view_class.__name__}, a view built by as_view() or"
        " @api_view",
        why="it would run before authentication, permission and throttle checks, so each request"
        " to it is answered 500 and not run.",
        hint="Place it below @api_view, or on the handler method.",
    )


def idempotency_exempt(view: View) -> View:
    """Leave this view out of the project-wide guard: a view function (also one built by
    ``@api_view`` or ``as_view()``, in the URLconf), a view class, a DRF handler or an action.

    Sets ``idempotency_exempt = True`` on what it decorates, the attribute view classes may also
    set themselves.
    """
    view.idempotency_exempt = True  # type: ignore[attr-defined]
    return view


def guarded(func: Callable[..., Any], options: Options) -> Callable[..., Any]:
    """`func` run through the guard with these options: the decorator's work, minus checks.

    A handler given a framework's request rather than Django's (a DRF handler) is guarded by
    that framework, through `http.frameworks`, which knows how it renders and reports errors.
    """
    if inspect.iscoroutinefunction(func):

        async def run_async(*args: Any, **kwargs: Any) -> HttpResponseBase:
            view, request = _view_and_request(args)
            if isinstance(request, HttpRequest):
                return await guard.run_async(lambda: func(*args, **kwargs), request, options, view)
            return await frameworks.framework().run_async(
                lambda: func(*args, **kwargs), request, options, view
            )

        return run_async

    def run(*args: Any, **kwargs: Any) -> HttpResponseBase:
        view, request = _view_and_request(args)
        if isinstance(request, HttpRequest):
            return guard.run(lambda: func(*args, **kwargs), request, options, view)
        return frameworks.framework().run(
            lambda: func(*args, **kwargs), request, options, view, args, kwargs
        )

    return run


def _view_and_request(args: tuple[Any, ...]) -> tuple[Any, Any]:
    """Function views get (request, ...), and no view; methods get (self, request, ...)."""
    if args and is_request(args[0]):
        return None, args[0]
    if len(args) >= 2 and is_request(args[1]):
        return args[0], args[1]
    raise ImproperlyConfigured(
        "@idempotent must decorate a view: a callable taking the request first, or a view "
        "method taking (self, request)."
    )
