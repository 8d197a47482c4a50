"""Writing a message into the outbox, in the caller's transaction, under a key that is stable."""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, router, transaction
from ulid import ULID

from django_idempotency.attempts import current_attempt
from django_idempotency.conf import conf
from django_idempotency.core.keys import MAX_KEY_LENGTH, mint_key
from django_idempotency.models import OutboxMessage
from django_idempotency.outbound.keys import operation_parts
from django_idempotency.steps import current_step_name
from django_idempotency.stores.database import clock_for, records_alias

# RFC 9110's token (a method, a header's name) and a field value this outbox sends as given:
# printable ASCII and tabs, no line breaks or NUL (which httpx or the database would refuse).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")
_URL_CHARACTERS = re.compile(r"[\x21-\x7e]+")
# Sending options the relay sets itself: the task's id is the message's key.
_RESERVED_OPTIONS = frozenset({"task_id", "args", "kwargs"})


def outbox_alias() -> str:
    """The outbox's database: the router's for writing it, the application's database, where
    the writes it must commit with are (not IDEMPOTENCY_DATABASE: records kept apart from the
    application's data would not commit with its writes)."""
    return router.db_for_write(OutboxMessage)


def enqueue_task(
    task: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    aggregate: str = "",
    key: str | None = None,
    options: Mapping[str, Any] | None = None,
    using: str | None = None,
) -> OutboxMessage:
    """Write a call of the Celery task `task` (a task, or its registered name) into the outbox,
    in the transaction open on `using` (the outbox's database): the relay sends it once that
    transaction commits, with the message's key as the task's id, and never if it rolls back.

    `args` and `kwargs` are stored as JSON, as Celery's JSON serializer sends them. `options`
    are `apply_async`'s (queue, priority, countdown…), except `task_id`. See `enqueue_request`
    for `aggregate` and `key`.
    """
    name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(name, str) or not name or not name.isprintable():
        raise TypeError(f"enqueue_task() takes a Celery task or its name, not {task!r}.")
    reserved = _RESERVED_OPTIONS.intersection(options or {})
    if reserved:
        raise ValueError(
            f"enqueue_task() sets {', '.join(sorted(reserved))} itself: the task's id is the "
            "message's key (pass key= to choose it), its arguments args= and kwargs=."
        )
    payload = {"args": list(args), "kwargs": dict(kwargs or {}), "options": dict(options or {})}
    _require_json(payload, name)
    return _write(
        OutboxMessage.Kind.TASK,
        destination=name,
        method="",
        payload=payload,
        body=None,
        aggregate=aggregate,
        key=key,
        using=using,
    )


def enqueue_request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    json_body: Any = None,
    content: bytes | str | None = None,
    aggregate: str = "",
    key: str | None = None,
    using: str | None = None,
) -> OutboxMessage:
    """Write an HTTP request into the outbox, in the transaction open on `using`: the relay
    sends it once that transaction commits (through the outbound client, with its retries),
    carrying the message's key as its `Idempotency-Key`.

    The body is `json_body` (sent as JSON) or `content`, stored byte for byte; the headers are
    stored as given, in the database: keep credentials out of them where the receiver can be
    reached another way (the relay's own settings).

    Messages with the same `aggregate` are delivered one at a time, in the order they were
    written; the others in any order. The key is `key` if given; inside a guarded view, an
    `@idempotent_function` or an `idempotent_task`, one derived from the operation, the step
    and how many messages to this destination the step wrote before, so that a resumed run of
    the operation writing its messages again finds them written; elsewhere a new ULID.
    """
    if not isinstance(method, str) or not _TOKEN.fullmatch(method):
        raise ValueError(f"enqueue_request() needs an HTTP method, not {method!r}.")
    _check_url(url)
    if json_body is not None and content is not None:
        raise ValueError("enqueue_request() takes json_body= or content=, not both.")
    given = headers.items() if isinstance(headers, Mapping) else headers or ()
    pairs = [[str(name), str(value)] for name, value in given]
    for name, value in pairs:
        if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
            raise ValueError(
                f"The header {name!r}: {value!r} cannot be sent: a name is a token (letters, "
                "digits, !#$%&'*+-.^_`|~), a value printable ASCII without line breaks."
            )
    body: bytes | None = None
    if json_body is not None:
        try:
            body = json.dumps(json_body, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise TypeError(f"json_body cannot be sent as JSON: {exc}") from exc
        if not any(n.lower() == "content-type" for n, _ in pairs):
            pairs.append(["Content-Type", "application/json"])
    elif content is not None:
        body = content.encode() if isinstance(content, str) else bytes(content)
    limit = conf.MAX_STORED_BYTES
    if body is not None and limit is not None and len(body) > limit:
        raise ValueError(
            f"A request body of {len(body)} bytes is over IDEMPOTENCY_MAX_STORED_BYTES ({limit}), "
            "the most the outbox keeps: send a reference to it instead."
        )
    return _write(
        OutboxMessage.Kind.REQUEST,
        destination=url,
        method=method.upper(),
        payload={"headers": pairs},
        body=body,
        aggregate=aggregate,
        key=key,
        using=using,
    )


def _write(
    kind: str,
    *,
    destination: str,
    method: str,
    payload: dict[str, Any],
    body: bytes | None,
    aggregate: str,
    key: str | None,
    using: str | None,
) -> OutboxMessage:
    alias = using or outbox_alias()
    if not isinstance(aggregate, str) or len(aggregate) > MAX_KEY_LENGTH or "\x00" in aggregate:
        raise ValueError(
            f"An aggregate is a string of at most {MAX_KEY_LENGTH} characters, not {aggregate!r}."
        )
    operation_id = ""
    if key is None:
        key, operation_id = _derived_key(kind, destination, alias)
    elif not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise ValueError(f"A message key is 1 to {MAX_KEY_LENGTH} characters, not {key!r}.")
    # The relay decides on the database's clock: a server whose own runs ahead or behind would
    # hold its messages back (or let them through early) by as much.
    now = clock_for(alias).now()
    messages = OutboxMessage.objects.using(alias)
    try:
        # A savepoint in the caller's transaction: a key already written must not abort it.
        with transaction.atomic(using=alias):
            return messages.create(
                key=key,
                kind=kind,
                destination=destination,
                method=method,
                payload=payload,
                body=body,
                aggregate=aggregate,
                operation_id=operation_id,
                available_at=now,
                created_at=now,
            )
    except IntegrityError:
        # This message was written before: by the run of the operation this one resumes, or
        # under the caller's own key. The first one stands.
        existing = messages.filter(key=key).first()
        if existing is None:
            raise
        return existing


def _derived_key(kind: str, destination: str, alias: str) -> tuple[str, str]:
    """The key of a message written without one, and the identity of its operation."""
    attempt = current_attempt()
    if attempt is None or attempt.scope is None:
        return str(ULID()), ""
    if attempt.atomic and alias != records_alias():
        # Its record rolls back on the records' database; the message would commit on this one:
        # the retry, a new operation, would write it again under another key.
        raise ImproperlyConfigured(
            f"An outbox message is written on database {alias!r} inside an atomic-mode "
            f"operation whose record is on {records_alias()!r}: they do not commit together. "
            "Use mode='lease' on this operation, or pass key= of your own."
        )
    if not attempt.atomic:
        # A message may now be committed by the caller's own transaction whatever this
        # attempt's fate: its record must stay, for the retry to derive the same key.
        attempt.identity_shared = True
    step = current_step_name() or ""
    name = (step, f"{kind}:{destination}")
    written = attempt.outbox_written
    if written is None:
        written = attempt.outbox_written = collections.Counter()
    written[name] += 1
    parts = operation_parts(attempt.scope, attempt.operation_id)
    key = mint_key(*parts, "outbox", f"step:{step}", *name[1:], written[name])
    return key, attempt.operation_id or ""


def _check_url(url: Any) -> None:
    """Refuse, when it is written, a URL the relay could never send to."""
    problem = ""
    if not isinstance(url, str) or not _URL_CHARACTERS.fullmatch(url):
        problem = "it is not printable ASCII without spaces (quote what needs quoting)"
    else:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises for a port out of range or not a number.
        except ValueError as exc:
            problem = str(exc)
        else:
            if parts.scheme not in ("http", "https") or not parts.hostname:
                problem = "it is not an http or https URL with a host"
    if problem:
        raise ValueError(f"enqueue_request() cannot send to {url!r}: {problem}.")


def _require_json(payload: dict[str, Any], name: str) -> None:
    try:
        json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"The arguments of {name} are stored as JSON, and these are not: {exc}. Pass ids "
            "and plain values, as Celery's JSON serializer sends them."
        ) from exc
