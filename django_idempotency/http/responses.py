"""Capture a view's response for storage, and rebuild it byte for byte on replay."""

from __future__ import annotations

from http.client import responses

from django.http import HttpResponse
from django.http.response import HttpResponseBase

from django_idempotency.core.outcomes import StoredResponse

REPLAYED_HEADER = "Idempotent-Replayed"

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
        status=response.status_code,
        headers=headers,
        body=response.content,
        reason="" if reason == responses.get(response.status_code) else reason,
    )


def replay(stored: StoredResponse) -> HttpResponse:
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


def _may_carry_length(stored: StoredResponse) -> bool:
    """RFC 9110 §8.6: no Content-Length on a 1xx or 204 (nor on a 304, which has no body)."""
    return stored.status >= 200 and stored.status not in (204, 304)
