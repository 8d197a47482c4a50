"""RFC 9457 problem+json responses, one stable type per kind of error, and the guard's own."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from django.core.exceptions import BadRequest, RequestDataTooBig, TooManyFieldsSent
from django.http import HttpResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError

from django_idempotency.conf import conf
from django_idempotency.core.fingerprint import UnreadableBody
from django_idempotency.exceptions import StoreNotSupported

logger = logging.getLogger("django_idempotency")

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
# A deployment error (no records table, a per-process store in another process): no retry can
# succeed until an operator fixes it, so it is a 500 without Retry-After.
STORE_MISCONFIGURED = ProblemKind("store-misconfigured", 500, "Idempotency store misconfigured")
# A decorator the system check reports (E024), in a project started without the checks: the
# view cannot run guarded, so it does not run at all.
VIEW_MISCONFIGURED = ProblemKind("view-misconfigured", 500, "Idempotent view misconfigured")
# An authentication that names no client (Ninja's `auth=` returning True): the key cannot be
# scoped, and scoped by nobody it would be every such client's. The server's code must change.
OWNER_UNKNOWN = ProblemKind("owner-unknown", 500, "Request owner unknown")
DELIVERY_REJECTED = ProblemKind("delivery-rejected", 400, "Webhook delivery not verified")
RESPONSE_NOT_STORED = ProblemKind("response-not-stored", 410, "Response not stored")
# The key-status view (django_idempotency.views): nothing stored for the key and its owner.
KEY_NOT_FOUND = ProblemKind("key-not-found", 404, "No outcome stored for this key")
RESPONSE_NOT_DECRYPTABLE = ProblemKind(
    "response-not-decryptable", 410, "Stored response cannot be decrypted"
)
# A step run at most once that an earlier attempt started and never finished: no retry can go
# on until an operator says whether it happened, so a 500 without Retry-After, as a deployment
# error is.
STEP_AMBIGUOUS = ProblemKind("step-ambiguous", 500, "Step outcome unknown")

ALL_KINDS = (
    MISSING_KEY,
    INVALID_KEY,
    INVALID_OWNER,
    MALFORMED_REQUEST,
    REQUEST_TOO_LARGE,
    IN_PROGRESS,
    KEY_REUSED,
    STORE_UNAVAILABLE,
    STORE_MISCONFIGURED,
    VIEW_MISCONFIGURED,
    OWNER_UNKNOWN,
    DELIVERY_REJECTED,
    RESPONSE_NOT_STORED,
    RESPONSE_NOT_DECRYPTABLE,
    KEY_NOT_FOUND,
    STEP_AMBIGUOUS,
)


def problem_type(kind: ProblemKind) -> str:
    """The kind's `type`: a tag URI by default, or a page under IDEMPOTENCY_PROBLEM_BASE_URL."""
    return conf.PROBLEM_BASE_URL + kind.slug


def documentation_url(kind: ProblemKind) -> str | None:
    """The page documenting the kind (IDEMPOTENCY_DOCS_URL, its section); None: no link."""
    docs = conf.DOCS_URL
    return None if docs is None else f"{docs}#{kind.slug}"


def documentation_link(kind: ProblemKind) -> str | None:
    """The `Link` header value the IETF draft asks of an error: where its documentation is."""
    url = documentation_url(kind)
    return None if url is None else f'<{url}>; rel="describedby"; type="text/html"'


class ProblemResponse(HttpResponse):
    """A problem+json response that remembers its kind, to be reshaped for DRF on request.

    It links to the kind's documentation (`Link: <…>; rel="describedby"`), as the IETF draft
    asks of the key's errors, whatever its `type`: a tag URI by default, which is no address.
    """

    def __init__(self, kind: ProblemKind, detail: str, retry_after: int | None = None) -> None:
        body = {"type": problem_type(kind), "title": kind.title, "status": kind.status}
        body["detail"] = detail
        super().__init__(json.dumps(body), status=kind.status, content_type=PROBLEM_CONTENT_TYPE)
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after
        if retry_after is not None:
            self["Retry-After"] = str(retry_after)
        link = documentation_link(kind)
        if link is not None:
            self["Link"] = link


def problem_response(
    kind: ProblemKind, detail: str, *, retry_after: int | None = None
) -> ProblemResponse:
    """A problem+json response; the body never carries stored requests or responses."""
    return ProblemResponse(kind, detail, retry_after)


# What reading a body for its fingerprint may raise, all of them the client's to correct.
BODY_ERRORS = (
    RequestDataTooBig,
    TooManyFieldsSent,
    MultiPartParserError,
    UnreadablePostError,
    UnreadableBody,
)
# What computing a fingerprint may raise, the client's to correct: the above, and Django refusing
# to parse a body at all (a urlencoded form not in UTF-8). Not in BODY_ERRORS, which a DRF view
# matches against any exception, its own BadRequest included.
FINGERPRINT_ERRORS = (*BODY_ERRORS, BadRequest)


def body_problem(exc: Exception) -> ProblemResponse:
    """The problem answering a body that cannot be read or compared (one of BODY_ERRORS)."""
    if isinstance(exc, RequestDataTooBig):
        return problem_response(
            REQUEST_TOO_LARGE, "The request body exceeds the server's upload limit."
        )
    if isinstance(exc, TooManyFieldsSent):
        return problem_response(
            MALFORMED_REQUEST,
            "The request has more form fields than the server accepts: send fewer.",
        )
    return problem_response(MALFORMED_REQUEST, str(exc))


def store_unavailable() -> ProblemResponse:
    """The answer when the store cannot be reached, and so the view was not run."""
    return problem_response(
        STORE_UNAVAILABLE,
        "The idempotency store cannot be reached, so the request was not run: retry later.",
        retry_after=5,
    )


def lease_lost() -> ProblemResponse:
    """The answer of a request whose claim was taken over mid-work (it stalled past its lease):
    another request with its key owns the work now, and a retry gets that one's answer."""
    return problem_response(
        IN_PROGRESS,
        "This request stalled past its hold on the key, and another request with the key took "
        "the work over: retry after a moment to get that request's answer.",
        retry_after=1,
    )


def store_misconfigured() -> ProblemResponse:
    """The answer when the store cannot work until the deployment is fixed (the log says how),
    and so the view was not run. No Retry-After: retrying changes nothing."""
    return problem_response(
        STORE_MISCONFIGURED,
        "The idempotency store is not set up on this server, so the request was not run. The"
        " server's error log says what its operator must do.",
    )


def view_misconfigured() -> ProblemResponse:
    """The answer of a view `@idempotent` was misplaced on (the log says where it goes): it was
    not run, since it cannot run guarded. No Retry-After: retrying changes nothing."""
    return problem_response(
        VIEW_MISCONFIGURED,
        "This view's idempotency guard is misplaced, so the request was not run. The server's"
        " error log says what its developer must change.",
    )


def owner_unknown() -> ProblemResponse:
    """The answer of a request authenticated by nothing that names its client (the log says
    what was returned and what to change): it was not run, as its key could not be scoped. No
    Retry-After: retrying changes nothing."""
    return problem_response(
        OWNER_UNKNOWN,
        "This request was authenticated, but by nothing that tells its client from another, so"
        " it was not run: its idempotency key would be shared with every other client. The"
        " server's developer must return the user, a model instance or a string naming the"
        " client from the authentication, or set IDEMPOTENCY_OWNER_RESOLVER.",
    )


def unusable_store(exc: Exception | None) -> ProblemResponse | None:
    """Log why the store failed and answer it: 500 for a deployment error (see
    `log_unreachable`), else 503 (None when `exc` is None and the table is there: the caller
    re-raises)."""
    if log_unreachable(exc):
        return store_misconfigured()
    return None if exc is None else store_unavailable()


def not_decryptable(status: int) -> ProblemResponse:
    """The answer to a retry whose stored response no configured key can decrypt."""
    return problem_response(
        RESPONSE_NOT_DECRYPTABLE,
        f"The first request with this key completed with status {status}, but its stored "
        "response was encrypted with a key the server no longer has, so it cannot be replayed. "
        "It was not run again: read its result from the API instead.",
    )


def step_not_decryptable() -> ProblemResponse:
    """The answer to a retry that resumes an operation whose stored step no configured key can
    decrypt (a key rotation not yet rolled out to this server, or a key removed too soon)."""
    return problem_response(
        RESPONSE_NOT_DECRYPTABLE,
        "The first request with this key completed some of its steps, but their stored results "
        "were encrypted with a key this server does not have, so it cannot resume them. They "
        "were not run again; the request can resume once every server has that key.",
    )


def step_ambiguous(step: str) -> ProblemResponse:
    """The answer to a retry that resumes an operation whose at-most-once step was interrupted."""
    return problem_response(
        STEP_AMBIGUOUS,
        f"The first request with this key started its step {step!r}, which must not run twice, "
        "and was interrupted before it finished: whether it happened is unknown. It was not run "
        "again; the request can go on once an operator has said whether it happened.",
    )


def log_unreachable(exc: Exception | None) -> bool:
    """Log why the store failed; True when it is a deployment error (`migrate` has not created
    its table, a store that cannot run here) rather than an outage."""
    # Imported here: the models cannot be imported with the package, before apps are ready.
    from django_idempotency.schema import missing_table, missing_table_message, records_database

    if isinstance(exc, StoreNotSupported):  # Its message says what is wrong and what to do.
        logger.error("Idempotency store unusable: %s", exc)
        return True
    alias = records_database()
    if alias is not None and missing_table(alias):
        logger.error("Idempotency store unusable: %s", missing_table_message(alias))
        return True
    if exc is not None:
        logger.error("Idempotency store unreachable: %s", exc)
    return False
