"""The key-status view: a client asks with its key what became of an earlier request."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.http.request import HttpHeaders
from django.http.response import HttpResponseBase
from django.utils.cache import patch_cache_control
from django.views import View

from django_idempotency.conf import conf
from django_idempotency.core.keys import InvalidKey, parse_key
from django_idempotency.core.outcomes import Scope
from django_idempotency.http import problems
from django_idempotency.http.guard import STORE_FAILURES, answer_store_failure, request_owner
from django_idempotency.http.requests import django_request
from django_idempotency.http.responses import replay
from django_idempotency.lookups import KeyState, read_key


def uncached(answer: HttpResponseBase) -> HttpResponseBase:
    """Mark an answer of a key-status view never to be kept by a shared cache: it is one
    caller's, chosen by a header a cache keys nothing on. Every answer of the views, their
    405s and 401s too."""
    patch_cache_control(answer, private=True, no_store=True)
    return answer


def key_status(request: Any, namespace: str | None = None) -> HttpResponseBase:
    """The answer to ``GET`` with an idempotency key (the guard's header): the stored response
    of the owner's completed request with that key, replayed as a retry would get it; 409 while
    it runs; 404 (`key-not-found`) when nothing is stored for the key and its owner. The owner
    is resolved as the guard resolves it (IDEMPOTENCY_OWNER_RESOLVER): another owner's record
    is never read. ``request``: Django's, or DRF's once it authenticated."""
    http_request = django_request(request)
    raw_key = http_request.META.get(HttpHeaders.to_wsgi_name(conf.HEADER))
    if raw_key is None:
        return problems.problem_response(
            problems.MISSING_KEY,
            f"Send the key of the request to look up in the {conf.HEADER} header.",
        )
    try:
        key = parse_key(raw_key, conf.KEY_FORMAT)
    except InvalidKey as exc:
        return problems.problem_response(problems.INVALID_KEY, str(exc))
    owner = request_owner(request)
    if not isinstance(owner, str):
        return owner
    try:
        found, response = read_key(Scope(namespace or conf.NAMESPACE, owner, key))
    except STORE_FAILURES as exc:
        return answer_store_failure(exc)
    if found.state is KeyState.COMPLETED:
        assert response is not None
        return replay(response)
    if found.state is KeyState.IN_PROGRESS:
        return problems.problem_response(
            problems.IN_PROGRESS,
            "The request with this key is still being processed: ask again after a moment.",
            retry_after=1,
        )
    if found.state is KeyState.ABANDONED:
        detail = (
            "The request with this key stopped before it completed (its worker was lost): send"
            " the same request again, with the same key, to resume it."
        )
    else:
        detail = (
            "Nothing is stored for this key: no request with it arrived, its record expired, or"
            " it failed and was given back. Send the request again, with the same key."
        )
    return problems.problem_response(problems.KEY_NOT_FOUND, detail)


class KeyStatusView(View):
    """``GET`` with an ``Idempotency-Key`` header: what became of the caller's request with that
    key (`key_status`). Route it where clients can reach it, behind the project's own login
    requirement; ``KeyStatusView.as_view(namespace=...)`` for a view with a namespace of its
    own."""

    namespace: str | None = None
    http_method_names = ["get", "head", "options"]

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        return uncached(super().dispatch(request, *args, **kwargs))

    def get(self, request: HttpRequest) -> HttpResponseBase:
        return key_status(request, self.namespace)
