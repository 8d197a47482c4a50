"""`IdempotencyMiddleware`: guard every plain Django view as `@idempotent` would, in one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from django_idempotency.conf import conf
from django_idempotency.http import guard
from django_idempotency.http.options import Options, is_exempt
from django_idempotency.http.requests import SAFE_METHODS

# Every option from the view class's attributes, then the settings.
_INHERITED = Options()


class IdempotencyMiddleware:
    """List it last in MIDDLEWARE: a view it guards is called from its ``process_view``, so the
    ``process_view`` of middleware listed after it (CSRF's among them) would not run.

    DRF views are left to `IdempotencyMixin` and IDEMPOTENCY_GUARD_ALL_VIEWS, which guard them
    after DRF's authentication; views decorated with `@idempotent` guard themselves.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)
            self.process_view = self._process_view_async  # type: ignore[method-assign,assignment]

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)  # A coroutine when served asynchronously.

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        guarded = _guarded(request, view_func, view_args, view_kwargs)
        if guarded is None:
            return None
        if iscoroutinefunction(view_func):
            return async_to_sync(guard.run_async)(*guarded)
        return guard.run(*guarded)

    async def _process_view_async(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        guarded = _guarded(request, view_func, view_args, view_kwargs)
        if guarded is None:
            return None
        if iscoroutinefunction(view_func):
            return await guard.run_async(*guarded)
        return await sync_to_async(guard.run)(*guarded)


def _guarded(
    request: HttpRequest, view_func: Callable[..., Any], args: tuple[Any, ...], kwargs: Any
) -> tuple[Callable[[], Any], HttpRequest, Options, Any] | None:
    """The arguments of `guard.run` for this view call, or None to leave the request alone."""
    view_class = _guarded_class(request, view_func)
    if view_class is False:
        return None
    # As Django calls a view: in a transaction per database with ATOMIC_REQUESTS.
    view = BaseHandler.make_view_atomic(None, view_func)  # type: ignore[arg-type]
    return (lambda: view(request, *args, **kwargs)), request, _INHERITED, view_class


def _guarded_class(request: HttpRequest, view_func: Callable[..., Any]) -> Any:
    """False to leave the request alone; else the view's class (None for a function view),
    whose ``idempotency_*`` attributes give the options."""
    if request.method in SAFE_METHODS or not conf.ENABLED or hasattr(view_func, "cls"):
        return False  # A safe method, or a DRF view (guarded after DRF's authentication).
    view_class = getattr(view_func, "view_class", None)
    handler = getattr(view_class, (request.method or "").lower(), None)
    if hasattr(view_func, "idempotency_options") or hasattr(handler, "idempotency_options"):
        return False  # @idempotent guards it already.
    if is_exempt(view_func, view_class, handler):
        return False
    return view_class
