"""`@idempotent` for Ninja operations: the guard runs after Ninja's auth and throttle checks."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from ninja.errors import HttpError
from ninja.operation import Operation, PathView
from ninja.utils import contribute_operation_callback

from django_idempotency.conf import Mode, OnConflict, conf
from django_idempotency.contrib.ninja.schema import SchemaExtra
from django_idempotency.http import guard
from django_idempotency.http.exempt import exempt_by_default
from django_idempotency.http.options import Options, is_exempt
from django_idempotency.http.problems import ProblemResponse

Func = TypeVar("Func", bound=Callable[..., Any])

# Set on the request once Ninja's checks (auth, throttles) passed before the guard: the
# operation's own run then skips them rather than count a throttle twice.
_CHECKED = "_idempotency_ninja_checked"


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
) -> Callable[[Func], Func]:
    """Run the Ninja operation once per idempotency key; replay its response to every retry.

    Place it above or below ``@api.post(...)`` (or a router's). The options are those of
    `django_idempotency.idempotent`, falling back on the ``IDEMPOTENCY_*`` settings. The key is
    checked after Ninja's authentication and throttles, so a replay never skips them; the
    response stored and replayed is the one Ninja rendered.
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
    )

    def decorate(func: Func) -> Func:
        operation = getattr(func, "_ninja_operation", None)
        if isinstance(operation, Operation):  # Placed above @api.post: the operation exists.
            _install(options, operation)
        else:
            contribute_operation_callback(func, lambda made: _install(options, made))
        func.idempotency_options = options  # type: ignore[attr-defined]
        return func

    return decorate


def _install(options: Options, operation: Operation) -> None:
    """Guard the operation's run; kept through Ninja's copies of it (a router mounted twice),
    which apply each of ``_run_decorators`` again, as for ``@decorate_view``."""
    guarding = _guarding(options, operation.openapi_extra)
    operation.run = guarding(operation.run)  # type: ignore[method-assign]
    if not hasattr(operation, "_run_decorators"):
        operation._run_decorators = []  # type: ignore[attr-defined]
    operation._run_decorators.append(guarding)  # type: ignore[attr-defined]


def _guarding(
    options: Options, own_extra: dict[str, Any] | None, *, behind_middleware: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The guard around an operation's run. `behind_middleware`: only for the requests that
    IdempotencyMiddleware handed over (`guarded_behind_middleware`), documented in no schema."""

    def guarding(run: Callable[..., Any]) -> Callable[..., Any]:
        operation = _operation_of(run)
        checks = operation._run_checks
        if not behind_middleware:
            # Here, not once: a copy of the operation has a snapshot of the original's.
            operation.openapi_extra = SchemaExtra(operation, options, own_extra)

        if operation.is_async:

            async def checked_async(request: HttpRequest) -> HttpResponseBase | None:
                if getattr(request, _CHECKED, False):
                    return None
                # Only for a run that did not pass the guard first, which Ninja's own never
                # does (the guard wraps the run, and every copy's): kept as the sync twin.
                return await checks(request)  # type: ignore[no-any-return,misc]  # pragma: no cover

            async def run_async(request: HttpRequest, **kw: Any) -> HttpResponseBase:
                if behind_middleware and not getattr(request, _HANDED_OVER, False):
                    return await run(request, **kw)  # type: ignore[no-any-return]
                error = await checks(request)  # type: ignore[misc]
                if error:
                    return error  # type: ignore[no-any-return]
                request = as_http_request(request)
                setattr(request, _CHECKED, True)
                response = await guard.run_async(lambda: run(request, **kw), request, options)
                return _shaped(operation, request, response)

            operation._run_checks = checked_async  # type: ignore[assignment,method-assign]
            return run_async

        def checked(request: HttpRequest) -> HttpResponseBase | None:
            return None if getattr(request, _CHECKED, False) else checks(request)

        def run_sync(request: HttpRequest, **kw: Any) -> HttpResponseBase:
            if behind_middleware and not getattr(request, _HANDED_OVER, False):
                return run(request, **kw)  # type: ignore[no-any-return]
            error = checks(request)
            if error:
                return error
            request = as_http_request(request)
            setattr(request, _CHECKED, True)
            response = guard.run(lambda: run(request, **kw), request, options)
            return _shaped(operation, request, response)

        operation._run_checks = checked  # type: ignore[assignment,method-assign]
        return run_sync

    return guarding


# IdempotencyMiddleware guards plain Django views before they run; a Ninja API's view would be
# guarded before Ninja's authentication, its key scoped by no one Ninja authenticated and its
# replays sent to clients `auth=` refuses. It hands such a request over to the operation instead
# (this mark on the request), which guards it after Ninja's checks as `@idempotent` would.
_HANDED_OVER = "_idempotency_ninja_handed_over"
# Set on an operation once it carries the middleware's guard; installed under the lock, once.
_BEHIND_MIDDLEWARE = "_idempotency_behind_middleware"
_installing = threading.Lock()


def guarded_behind_middleware(request: HttpRequest, view: Callable[..., Any]) -> bool:
    """Whether `view` is a Ninja API's: if so its operation guards `request` after Ninja's
    checks (IdempotencyMiddleware then leaves the request alone), unless `@idempotent` guards it
    already or the operation is exempt (``@idempotency_exempt``, IDEMPOTENCY_EXEMPT_VIEWS)."""
    path_view = _path_view_of(view)
    if path_view is None:
        return False
    operation = path_view._find_operation(request)
    if operation is None:  # Ninja answers 405.
        return True
    function = operation.view_func
    if (
        hasattr(function, "idempotency_options")
        or is_exempt(function)
        or exempt_by_default(function)
    ):
        return True
    with _installing:
        if not getattr(operation, _BEHIND_MIDDLEWARE, False):
            guarding = _guarding(Options(), None, behind_middleware=True)
            operation.run = guarding(operation.run)  # type: ignore[method-assign]
            setattr(operation, _BEHIND_MIDDLEWARE, True)
    setattr(request, _HANDED_OVER, True)
    return True


def _path_view_of(view: Callable[..., Any]) -> PathView | None:
    """The Ninja PathView a URL pattern's view calls: the view's closure (Ninja 1.4 and later)
    or the bound method it is (earlier)."""
    owner = getattr(view, "__self__", None)
    if isinstance(owner, PathView):
        return owner
    for cell in getattr(view, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # pragma: no cover  # An empty cell: not Ninja's view, whose is set.
            continue
        if isinstance(content, PathView):
            return content
    return None


def _operation_of(run: Callable[..., Any]) -> Operation:
    """The operation whose ``run`` this is: its bound method, or a ``decorate_view`` decorator
    applied before the guard, wrapping it (Ninja's copies apply them again, in order)."""
    operation = getattr(inspect.unwrap(run), "__self__", None)
    if not isinstance(operation, Operation):
        raise ImproperlyConfigured(
            f"@idempotent cannot find the Ninja operation that {run!r} runs: a decorator given to "
            "decorate_view() below @idempotent must keep what it wraps with functools.wraps, "
            "or go above @idempotent."
        )
    return operation


def as_http_request(request: HttpRequest) -> HttpRequest:
    """The request, its header names in `META` as a server writes them.

    Ninja's TestClient puts ``headers={"Idempotency-Key": ...}`` in `META` as
    ``HTTP_Idempotency_Key``, not upper-cased: the guard, which reads the key from `META`, would
    find none and run the operation unguarded. Requests from a server are left as they are.
    """
    meta = request.META
    for name in [name for name in meta if name.startswith("HTTP_") and not name.isupper()]:
        meta.setdefault(name.upper(), meta[name])
    return request


class IdempotencyHttpError(HttpError):
    """The guard's answer as a Ninja error (IDEMPOTENCY_ERROR_FORMAT = "ninja"), given to the
    API's exception handlers: by default ``{"detail": "..."}`` with the problem's status.

    ``problem`` is the problem response it replaces: its kind (``problem.kind.slug``), its
    ``Retry-After`` (``problem.retry_after``) and its documentation link are there for a
    handler that wants them; the default handler's response gets both headers.
    """

    def __init__(self, problem: ProblemResponse) -> None:
        super().__init__(problem.kind.status, problem.detail)
        self.problem = problem


def _shaped(
    operation: Operation, request: HttpRequest, response: HttpResponseBase
) -> HttpResponseBase:
    """The guard's own answer in Ninja's error style when the project asks for it."""
    if not (isinstance(response, ProblemResponse) and conf.ERROR_FORMAT == "ninja"):
        return response
    shaped: HttpResponseBase = operation.api.on_exception(request, IdempotencyHttpError(response))
    for name in ("Retry-After", "Link"):
        if name in response and name not in shaped:
            shaped[name] = response[name]
    return shaped
