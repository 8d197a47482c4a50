"""Capture a view's response for storage, and rebuild it byte for byte on replay."""

from __future__ import annotations

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
    return StoredResponse(status=response.status_code, headers=headers, body=response.content)


def replay(stored: StoredResponse) -> HttpResponse:
    headers = dict(stored.headers)
    headers["Content-Length"] = str(len(stored.body))
    headers[REPLAYED_HEADER] = "true"
    response = HttpResponse(stored.body, status=stored.status, headers=headers)
    if not any(name.lower() == "content-type" for name in headers):
        del response["Content-Type"]  # The view sent none: do not add Django's default.
    return response
