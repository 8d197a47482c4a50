"""Capture a view's response for storage, and rebuild it byte for byte on replay."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from http.client import responses

from django.http import HttpResponse
from django.http.response import HttpResponseBase

from django_idempotency.core.outcomes import StoredResponse, is_not_stored
from django_idempotency.http import problems

REPLAYED_HEADER = "Idempotent-Replayed"
# Stored with the headers of a response whose body was too large to keep. Not a field name
# (RFC 9110 tokens have no colon), so no view can set it.
BODY_NOT_STORED = ":body-not-stored"

# Per-connection or per-moment headers: replaying them would be wrong, and cookies could leak a
# session. Content-Length is recomputed from the stored body.
_NOT_REPLAYED = frozenset(
    {
        "set-cookie",
        "date",
        "content-length",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        REPLAYED_HEADER.lower(),
    }
)


def capture(response: HttpResponseBase) -> StoredResponse | None:
    """What to store of a response, or None when it streams and cannot be kept."""
    if response.streaming or not isinstance(response, HttpResponse):
        return None
    headers = [
        (name, value) for name, value in response.items() if name.lower() not in _NOT_REPLAYED
    ]
    reason = response.reason_phrase
    return StoredResponse(
        status=int(response.status_code),  # A view may set an `HTTPStatus`: stored as its number.
        headers=headers,
        body=response.content,
        reason="" if reason == responses.get(response.status_code) else reason,
    )


def without_body(stored: StoredResponse) -> StoredResponse:
    """The status and headers of a response too large to keep, marked so no replay sends them
    as if they were the whole response."""
    marker = (BODY_NOT_STORED, str(len(stored.body)))
    return replace(stored, headers=[*stored.headers, marker], body=b"")


def replay(stored: StoredResponse) -> HttpResponse:
    if is_not_stored(stored):
        return problems.problem_response(
            problems.RESPONSE_NOT_STORED,
            f"The first request with this key completed with status {stored.status}, but its "
            "response could not be stored (the store refused a value in it), so it cannot be "
            "replayed. It was not run again: read its result from the API instead.",
        )
    omitted = next((value for name, value in stored.headers if name == BODY_NOT_STORED), None)
    if omitted is not None:
        return _not_stored(stored, omitted)
    headers = dict(stored.headers)
    if _may_carry_length(stored):
        headers["Content-Length"] = str(len(stored.body))
    headers[REPLAYED_HEADER] = "true"
    response = HttpResponse(
        stored.body, status=stored.status, reason=stored.reason or None, headers=headers
    )
    if not any(name.lower() == "content-type" for name in headers):
        del response["Content-Type"]  # The view sent none: do not add Django's default.
    return response


def sent_then(response: HttpResponseBase, actions: list[Callable[[], None]]) -> HttpResponseBase:
    """`response`, running `actions` once it is sent: the server closes a response after
    sending it, and closing runs its closers. A response that a middleware replaces is never
    closed, and its actions never run: they are ones that no answer depends on."""
    if actions:
        # Django's own list of what closing a response runs (a FileResponse's file, say).
        response._resource_closers.extend(actions)  # type: ignore[attr-defined]
    return response


def _may_carry_length(stored: StoredResponse) -> bool:
    """RFC 9110 §8.6: no Content-Length on a 1xx or 204 (nor on a 304, which has no body)."""
    return stored.status >= 200 and stored.status not in (204, 304)


def _not_stored(stored: StoredResponse, size: str) -> HttpResponse:
    problem = problems.problem_response(
        problems.RESPONSE_NOT_STORED,
        f"The first request with this key completed with status {stored.status}, but its "
        f"response ({size} bytes) was too large to keep, so it cannot be replayed. It was not "
        "run again: read its result from the API instead.",
    )
    location = next((value for name, value in stored.headers if name.lower() == "location"), None)
    if location is not None:  # Where a created resource can be read.
        problem["Location"] = location
    return problem
