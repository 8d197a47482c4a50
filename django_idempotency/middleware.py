"""`IdempotencyMiddleware`: guard every plain Django view as `@idempotent` would, in one line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.handlers.base import BaseHandler
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from django_idempotency.conf import conf, require_installed
from django_idempotency.http import guard
from django_idempotency.http.exempt import exempt_by_default
from django_idempotency.http.options import Options, is_exempt
from django_idempotency.http.requests import SAFE_METHODS

logger = logging.getLogger("django_idempotency")

# Every option from the view class's attributes, then the settings.
_INHERITED = Options()


class IdempotencyMiddleware:
    """List it last in MIDDLEWARE: a view it guards is called from its ``process_view``, so the
    ``process_view`` of middleware listed after it (CSRF's among them) would not run.

    Django decides which view to call before any ``process_view`` runs and offers no way to wrap
    it, so the guard calls the view itself, as Django would: under ATOMIC_REQUESTS inside the
    request's transaction (which the claim joins), and with the view's exceptions handed to every
    middleware's ``process_exception``, in Django's order.

    DRF views are left to `IdempotencyMixin` and IDEMPOTENCY_GUARD_ALL_VIEWS, which guard them
    after DRF's authentication, and a Django Ninja API's views to their operation, which guards
    them after Ninja's; views decorated with `@idempotent` guard themselves.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        require_installed()  # Django builds the middleware as the server starts: say it there.
        self.get_response = get_response
        self.handler = _handler_behind(get_response)
        if self.handler is None:
            logger.warning(
                "IdempotencyMiddleware could not find Django's request handler: exceptions of "
                "the views it guards will not reach other middleware's process_exception(). "
                "List it last in MIDDLEWARE."
            )
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
        view_class = _guarded_class(request, view_func)
        if view_class is False:
            return None
        call = _ViewCall(view_func, request, view_args, view_kwargs)
        try:
            if iscoroutinefunction(view_func):
                return async_to_sync(guard.run_async)(
                    call.run_async, request, _INHERITED, view_class
                )
            run = self._in_requests_transaction(view_func, guard.run)
            return run(call.run, request, _INHERITED, view_class)
        except Exception as exc:
            response = self._exception_response(exc, call, request)
            if response is None:
                raise
            return response

    async def _process_view_async(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        view_class = _guarded_class(request, view_func)
        if view_class is False:
            return None
        call = _ViewCall(view_func, request, view_args, view_kwargs)
        try:
            if iscoroutinefunction(view_func):
                return await guard.run_async(call.run_async, request, _INHERITED, view_class)
            run = self._in_requests_transaction(view_func, guard.run)
            return await sync_to_async(run)(call.run, request, _INHERITED, view_class)
        except Exception as exc:
            response = await sync_to_async(self._exception_response)(exc, call, request)
            if response is None:
                raise
            return response

    def _in_requests_transaction(
        self, view_func: Callable[..., Any], run: Callable[..., HttpResponseBase]
    ) -> Callable[..., HttpResponseBase]:
        """`run` inside the transactions Django would open around `view_func` under
        ATOMIC_REQUESTS (one per database, but those `non_atomic_requests` leaves out): the
        claim joins the request's transaction, and that transaction decides about the view's
        writes as it would without the guard."""

        def in_transaction(*args: Any) -> HttpResponseBase:
            return run(*args)

        in_transaction._non_atomic_requests = getattr(  # type: ignore[attr-defined]
            view_func, "_non_atomic_requests", set()
        )
        make_view_atomic = BaseHandler.make_view_atomic
        return make_view_atomic(self.handler, in_transaction)  # type: ignore[arg-type]

    def _exception_response(
        self, exc: Exception, call: _ViewCall, request: HttpRequest
    ) -> HttpResponseBase | None:
        """What the exception middleware answers to an exception of the view, asked as Django
        asks them when it calls the view itself; None if none does. An exception of the guard's
        own is not the view's: Django would not show it to them either."""
        if self.handler is None or exc is not call.raised:
            return None
        return self.handler.process_exception_by_middleware(exc, request)


class _ViewCall:
    """The view called as Django would call it, keeping the exception it raised, if any."""

    def __init__(
        self,
        view_func: Callable[..., Any],
        request: HttpRequest,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        if iscoroutinefunction(view_func):
            # Refused under ATOMIC_REQUESTS with Django's own error, as Django would refuse it.
            BaseHandler.make_view_atomic(None, view_func)  # type: ignore[arg-type]
        self.view_func = view_func
        self.request = request
        self.args = args
        self.kwargs = kwargs
        self.raised: Exception | None = None

    def run(self) -> HttpResponseBase:
        try:
            return self.view_func(self.request, *self.args, **self.kwargs)  # type: ignore[no-any-return]
        except Exception as exc:
            self.raised = exc
            raise

    async def run_async(self) -> HttpResponseBase:
        try:
            return await self.view_func(self.request, *self.args, **self.kwargs)  # type: ignore[no-any-return]
        except Exception as exc:
            self.raised = exc
            raise


def _guarded_class(request: HttpRequest, view_func: Callable[..., Any]) -> Any:
    """False to leave the request alone; else the view's class (None for a function view),
    whose ``idempotency_*`` attributes give the options."""
    if request.method in SAFE_METHODS or not conf.ENABLED or hasattr(view_func, "cls"):
        return False  # A safe method, or a DRF view (guarded after DRF's authentication).
    if _ninja_guards(request, view_func):
        return False  # Its operation guards it, after Ninja's authentication.
    view_class = getattr(view_func, "view_class", None)
    handler = getattr(view_class, (request.method or "").lower(), None)
    if hasattr(view_func, "idempotency_options") or hasattr(handler, "idempotency_options"):
        return False  # @idempotent guards it already: its options are the more specific.
    if is_exempt(view_func, view_class, handler) or exempt_by_default(view_func):
        return False  # Opted out, or a view a login form reaches (see `http.exempt`).
    return view_class


def _ninja_guards(request: HttpRequest, view_func: Callable[..., Any]) -> bool:
    """Whether `view_func` is a Django Ninja API's, which its operation guards instead."""
    if "ninja" not in sys.modules:  # No Ninja API in the project: none of its views.
        return False
    from django_idempotency.contrib.ninja.operations import guarded_behind_middleware

    return guarded_behind_middleware(request, view_func)


# Closures may hold more than the chain: a bound on what is looked at before giving up.
_MOST_STEPS = 200


def _handler_behind(get_response: Callable[..., Any]) -> BaseHandler | None:
    """The Django handler at the end of the middleware chain that `get_response` starts.

    A middleware is given only the next step of the chain: Django's wrappers name what they wrap
    (``__wrapped__``, asgiref's ``func`` and ``awaitable``), a middleware its next step
    (``get_response``, or a function middleware's closure), down to the handler's own
    ``_get_response``, a method of the handler.
    """
    seen: set[int] = set()
    steps: list[Any] = [get_response]
    while steps and len(seen) < _MOST_STEPS:
        step = steps.pop(0)
        if id(step) in seen:
            continue
        seen.add(id(step))
        owner = getattr(step, "__self__", None)
        if isinstance(owner, BaseHandler):
            return owner
        for name in ("__wrapped__", "func", "awaitable", "get_response", "__self__"):
            inner = getattr(step, name, None)
            if callable(inner):
                steps.append(inner)
        for cell in getattr(step, "__closure__", None) or ():
            try:
                content = cell.cell_contents
            # An empty cell: a name of the enclosing function never bound (bound in a branch
            # not taken, or deleted), which no middleware Django or its ecosystem ships leaves.
            except ValueError:  # pragma: no cover
                continue
            if callable(content):
                steps.append(content)
    return None
