"""DRF as `http.frameworks` sees it: its `Request`, its parsers, its handlers and its errors.

Nothing here imports DRF: a project without it still imports this package.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from django.http import HttpRequest
from django.http.response import HttpResponseBase

from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import canonical_body, canonical_json, is_json_media_type
from django_idempotency.http import guard
from django_idempotency.http.options import Options
from django_idempotency.http.problems import ProblemResponse


class RestFramework:
    """DRF views get a `Request` wrapping Django's, and render their response after the handler."""

    def http_request(self, request: Any) -> HttpRequest | None:
        inner = getattr(request, "_request", None)
        return inner if isinstance(inner, HttpRequest) else None

    def parsed_body(self, request: Any, media_type: str) -> bytes:
        """What DRF's parser made of a body whose bytes are gone, in canonical form."""
        data = request.data
        ignore = conf.FINGERPRINT_IGNORE_FIELDS
        if isinstance(data, bytes):  # A raw parser's output is the body itself.
            return canonical_body(media_type, data, ignore)
        if is_json_media_type(media_type) and isinstance(data, dict) and ignore:
            data = {name: item for name, item in data.items() if name not in ignore}
        try:
            return canonical_json(data)
        except (TypeError, ValueError):  # Not JSON data: its text is the best there is.
            return repr(data).encode()

    def run(
        self,
        call: Callable[[], HttpResponseBase],
        request: Any,
        options: Options,
        view: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponseBase:
        view = _view(request) if view is None else view
        finalize = _finalizer(view, request, args, kwargs)
        return shaped(guard.run(call, request, options, view, finalize))

    async def run_async(
        self,
        call: Callable[[], Awaitable[HttpResponseBase]],
        request: Any,
        options: Options,
        view: Any,
    ) -> HttpResponseBase:
        view = _view(request) if view is None else view
        return shaped(await guard.run_async(call, request, options, view))


def _view(request: Any) -> Any:
    """The view of a handler given only the request, e.g. an @api_view function."""
    context = getattr(request, "parser_context", None) or {}
    return context.get("view")


def _finalizer(
    view: Any, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> guard.Finalize | None:
    """DRF renders in finalize_response, after the handler: do it early to store the bytes."""
    finalize_response = getattr(view, "finalize_response", None)
    if finalize_response is None or not hasattr(request, "accepted_renderer"):
        return None
    url_args = args[1:] if args and args[0] is view else args
    url_args = url_args[1:]  # Drop the request itself.

    def finalize(response: HttpResponseBase) -> HttpResponseBase:
        return finalize_response(request, response, *url_args, **kwargs)  # type: ignore[no-any-return]

    return finalize


def shaped(response: HttpResponseBase) -> HttpResponseBase:
    """The guard's own answer as it leaves a DRF view: problem+json, or, with
    IDEMPOTENCY_ERROR_FORMAT = "drf", a DRF exception for its exception handler.

    Raised once the guard is done, so no transaction is open and no claim is held.
    """
    # With IDEMPOTENCY_ENABLED off the guard answered nothing: a view's own response passes.
    if isinstance(response, ProblemResponse) and conf.ERROR_FORMAT == "drf" and conf.ENABLED:
        # Imported here: it imports DRF, which this module must not need.
        from django_idempotency.contrib.rest_framework.errors import IdempotencyProblem

        raise IdempotencyProblem(response)
    return response
