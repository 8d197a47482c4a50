"""RFC 9457 problem+json responses, one stable type per kind of error."""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.http import HttpResponse

from django_idempotency.conf import conf

PROBLEM_CONTENT_TYPE = "application/problem+json"


@dataclass(frozen=True)
class ProblemKind:
    slug: str
    status: int
    title: str


MISSING_KEY = ProblemKind("missing-key", 400, "Idempotency key missing")
INVALID_KEY = ProblemKind("invalid-key", 400, "Idempotency key invalid")
INVALID_OWNER = ProblemKind("invalid-owner", 400, "Request owner invalid")
MALFORMED_REQUEST = ProblemKind("malformed-request", 400, "Request body unreadable")
REQUEST_TOO_LARGE = ProblemKind("request-too-large", 413, "Request body too large")
IN_PROGRESS = ProblemKind("request-in-progress", 409, "Request in progress")
KEY_REUSED = ProblemKind("key-reused", 422, "Idempotency key reused for a different request")
STORE_UNAVAILABLE = ProblemKind("store-unavailable", 503, "Idempotency store unavailable")
DELIVERY_REJECTED = ProblemKind("delivery-rejected", 400, "Webhook delivery not verified")
RESPONSE_NOT_STORED = ProblemKind("response-not-stored", 410, "Response too large to replay")

ALL_KINDS = (
    MISSING_KEY,
    INVALID_KEY,
    INVALID_OWNER,
    MALFORMED_REQUEST,
    REQUEST_TOO_LARGE,
    IN_PROGRESS,
    KEY_REUSED,
    STORE_UNAVAILABLE,
    DELIVERY_REJECTED,
    RESPONSE_NOT_STORED,
)


def problem_type(kind: ProblemKind) -> str:
    """The kind's `type`: a tag URI by default, or a page under IDEMPOTENCY_PROBLEM_BASE_URL."""
    return conf.PROBLEM_BASE_URL + kind.slug


class ProblemResponse(HttpResponse):
    """A problem+json response that remembers its kind, to be reshaped for DRF on request."""

    def __init__(self, kind: ProblemKind, detail: str, retry_after: int | None = None) -> None:
        body = {"type": problem_type(kind), "title": kind.title, "status": kind.status}
        body["detail"] = detail
        super().__init__(json.dumps(body), status=kind.status, content_type=PROBLEM_CONTENT_TYPE)
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after
        if retry_after is not None:
            self["Retry-After"] = str(retry_after)


def problem_response(
    kind: ProblemKind, detail: str, *, retry_after: int | None = None
) -> ProblemResponse:
    """A problem+json response; the body never carries stored requests or responses."""
    return ProblemResponse(kind, detail, retry_after)
