"""What an OpenAPI schema says of a guarded operation, whichever framework generates it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django_idempotency.conf import conf
from django_idempotency.core.keys import MAX_KEY_LENGTH
from django_idempotency.http import problems
from django_idempotency.http.options import Resolved
from django_idempotency.http.owners import authenticated_user
from django_idempotency.http.responses import REPLAYED_HEADER

PROBLEM_COMPONENT = "IdempotencyProblem"
# What the guard answers instead of running the view; its 413 and 503 are left out, as any
# endpoint can be sent too large a body or find its database down.
PROBLEM_STATUSES = (400, 409, 410, 422)
# The operation's idempotency as data, for clients and tools that read the schema rather than
# its prose: the header, whether it is required, and (as the IETF draft asks the server to
# publish) how long a key lasts.
EXTENSION = "x-idempotency"

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "An RFC 9457 problem document: the idempotency guard answered the request "
        "itself, without running the operation."
    ),
    "properties": {
        "type": {
            "type": "string",
            "format": "uri",
            "description": "Identifies the kind of error, stably: match on it.",
        },
        "title": {"type": "string", "description": "A short summary of the kind."},
        "status": {"type": "integer", "description": "The HTTP status code."},
        "detail": {
            "type": "string",
            "description": "What went wrong with this request and what to do.",
        },
    },
    "required": ["type", "title", "status", "detail"],
}


def key_schema() -> dict[str, Any]:
    """The key header's value: 1 to 255 characters, a UUID or ULID when the format says so."""
    schema: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH}
    key_format = {"uuid": "uuid", "ulid": "ulid"}.get(conf.KEY_FORMAT or "")
    if key_format:
        schema["format"] = key_format
    return schema


def key_description(resolved: Resolved) -> str:
    if resolved.required:
        presence = "Required: a request without it is answered 400."
    else:
        presence = "Optional: a request without it runs unprotected."
    return (
        "A unique value for this operation, such as a UUID or a ULID; send the same value "
        "when retrying it. The first request with a key runs; a retry with the same key and "
        f"the same request gets the stored response back, with `{REPLAYED_HEADER}: true`, "
        "and does not run again. The same key with a different request is answered 422; a "
        f"retry while the first request is still running, 409. {presence} "
        f"A key expires {duration(resolved.ttl)} after its first request: a request with it "
        "after that runs as a new one."
    )


def extension(resolved: Resolved) -> dict[str, Any]:
    """The operation's `x-idempotency` object: header, required, expiry in seconds, docs."""
    described: dict[str, Any] = {
        "header": resolved.header,
        "required": resolved.required,
        "expiry": int(resolved.ttl.total_seconds()),
    }
    if conf.DOCS_URL is not None:
        described["documentation"] = conf.DOCS_URL
    return described


def duration(ttl: timedelta) -> str:
    """A TTL in words, in its largest whole unit: "7 days", "24 hours", "90 seconds"."""
    seconds = int(ttl.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        # Days from two on: a day is said as "24 hours", as the settings' docs say it.
        if seconds % size == 0 and seconds >= (2 * size if unit == "day" else size):
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def can_answer(kind: problems.ProblemKind, resolved: Resolved) -> bool:
    """Whether the guard can answer this operation's requests with this kind of problem."""
    if kind in (problems.KEY_NOT_FOUND, problems.STEP_AMBIGUOUS):
        # The key-status view's alone; a view's own at-most-once steps, which no schema knows.
        return False
    if kind is problems.MISSING_KEY:
        return resolved.required
    if kind is problems.DELIVERY_REJECTED:
        return resolved.verify is not None
    if kind is problems.RESPONSE_NOT_STORED:
        return conf.MAX_STORED_BYTES is not None
    if kind is problems.RESPONSE_NOT_DECRYPTABLE:  # Once a key is retired too soon.
        return conf.ENCRYPTION_KEYS is not None
    if kind is problems.INVALID_OWNER:  # The default owner, a user's primary key, is always valid.
        return conf.OWNER_RESOLVER is not authenticated_user
    return True


def document_responses(
    responses: dict[str, Any], resolved: Resolved, problem: dict[str, Any]
) -> None:
    """Add the replay header to the success responses and the guard's problems to the others.

    ``problem`` is the schema (or its ``$ref``) of a problem document.
    """
    for code, response in responses.items():
        if code.startswith("2"):
            response.setdefault("headers", {}).setdefault(
                REPLAYED_HEADER,
                {
                    "description": (
                        "`true` when this is the stored response to an earlier request with "
                        "the same key, replayed without running the operation again."
                    ),
                    "schema": {"type": "string", "enum": ["true"]},
                },
            )
    for status in PROBLEM_STATUSES:
        kinds = [kind for kind in problems.ALL_KINDS if kind.status == status]
        kinds = [kind for kind in kinds if can_answer(kind, resolved)]
        if not kinds:
            continue
        # A status the operation documents already, e.g. a 400 for validation errors, gains
        # the problem document as a second content type.
        response = responses.setdefault(
            str(status), {"description": "; ".join(kind.title for kind in kinds) + "."}
        )
        response.setdefault("content", {}).setdefault(
            problems.PROBLEM_CONTENT_TYPE,
            {
                "schema": problem,
                "examples": {
                    kind.slug: {
                        "summary": kind.title,
                        "value": {
                            "type": problems.problem_type(kind),
                            "title": kind.title,
                            "status": kind.status,
                            "detail": "What went wrong with this request and what to do.",
                        },
                    }
                    for kind in kinds
                },
            },
        )
        headers = response.setdefault("headers", {})
        if status == problems.IN_PROGRESS.status:
            headers.setdefault(
                "Retry-After",
                {
                    "description": "Seconds to wait before sending the request again, same key.",
                    "schema": {"type": "integer"},
                },
            )
        if conf.DOCS_URL is not None:
            headers.setdefault(
                "Link",
                {
                    "description": (
                        'The documentation of the error (`rel="describedby"`): '
                        f"{conf.DOCS_URL} followed by `#` and the error's slug."
                    ),
                    "schema": {"type": "string"},
                },
            )
