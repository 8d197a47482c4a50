"""The key as a handle: what became of a key, read without claiming it (lookup, wait_for)."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_idempotency.attempts import FIRST_DELAY, next_delay
from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Scope, Status, StoredResponse, is_not_stored
from django_idempotency.encryption import unseal
from django_idempotency.exceptions import KeyInProgress, ResultNotStored
from django_idempotency.http.responses import BODY_NOT_STORED
from django_idempotency.recoverable import check_store, is_failed
from django_idempotency.results import JSONSerializer, ResultSerializer
from django_idempotency.stores import get_store


class KeyState(enum.StrEnum):
    """Where a key stands in its store."""

    # No record holds it: never used, expired, or given back (the work failed before it could
    # have had an effect, or the view answered a 4xx/5xx): the next call runs the work.
    ABSENT = "absent"
    # A call holds it and its lease is live: the work is running.
    IN_PROGRESS = "in_progress"
    # Claimed, and its lease ended without a result (the process died or stalled): the same
    # request's next call resumes it, after its stored steps.
    ABANDONED = "abandoned"
    # The work finished: its response (or the result of a function) is stored.
    COMPLETED = "completed"
    # Abandoned, and a `recover=True` function's or task's call the recovery sweep gave up on
    # after its attempts (the admin lists it): a call with the same arguments still resumes it.
    FAILED = "failed"


@dataclass(frozen=True)
class KeyStatus:
    """What `lookup` found for one key.

    ``method`` and ``path`` say which request (or function: ``CALL`` and its dotted name) took
    the key. Of a completed key, ``status`` is the status its work answered with (200 for a
    function) and ``response`` the stored response (a function's result is its body:
    `result()` decodes it); ``stored`` is False when the work ran but its response was not
    kept whole (a body over IDEMPOTENCY_MAX_STORED_BYTES, a value the store refused): it is
    never run again, and ``response`` is None.
    """

    state: KeyState
    scope: Scope
    method: str = ""
    path: str = ""
    lease_expires_at: datetime | None = None
    expires_at: datetime | None = None
    status: int | None = None
    response: StoredResponse | None = None
    stored: bool = True
    operation_id: str = ""

    def result(self, serializer: ResultSerializer | None = None) -> Any:
        """The stored result of a completed `@idempotent_function` or task, decoded by its
        ``serializer`` (the default: JSON as it is). Raises `KeyInProgress` while the work has
        not completed, `LookupError` for an absent key, `ResultNotStored` for a result the store
        refused."""
        if self.state is KeyState.ABSENT:
            raise LookupError(
                f"No record holds the key {self.scope.key!r}: nothing ran, or ran to no result."
            )
        if self.state is not KeyState.COMPLETED:
            raise KeyInProgress(
                f"The work of the key {self.scope.key!r} has not completed ({self.state})."
            )
        if not self.stored:
            raise ResultNotStored(
                f"The work of the key {self.scope.key!r} ran, but its result could not be stored."
            )
        assert self.response is not None
        return (serializer or JSONSerializer()).loads(self.response.body)


def lookup(key: str, *, namespace: str, owner: str = "") -> KeyStatus:
    """Where ``key`` stands in ``namespace`` for ``owner``, read from the store of record
    without claiming it or waiting on a lock.

    The namespace and owner are those the key was used with: a function's or task's namespace
    (its ``namespace=``, else its dotted name) and its ``owner=`` value; a view's
    ``IDEMPOTENCY_NAMESPACE`` (or its ``namespace=``) and the owner the guard resolved (the
    authenticated user's primary key, as text; "" for nobody). Raises `StoreUnavailable` when
    the store cannot be reached, and `UnreadableResponse` when an encrypted response was sealed
    with a key no longer in IDEMPOTENCY_ENCRYPTION_KEYS.
    """
    return read_key(Scope(namespace, owner, key))[0]


def read_key(scope: Scope) -> tuple[KeyStatus, StoredResponse | None]:
    """`lookup` of a scope, and the completed key's response as it is kept (opened, but with
    the marks of a response not kept whole, which `http.responses.replay` answers)."""
    if any("\x00" in part for part in (scope.namespace, scope.owner, scope.key)):
        # No entry point stores a NUL in a key or an owner, and PostgreSQL cannot even be asked.
        return KeyStatus(KeyState.ABSENT, scope), None
    store = get_store()
    record = store.read(scope)
    if record is None:
        return KeyStatus(KeyState.ABSENT, scope), None
    now = store.now()
    if record.abandoned(now):
        if record.status != Status.IN_PROGRESS:
            return KeyStatus(KeyState.ABSENT, scope), None  # Expired: the key is free.
        state = KeyState.FAILED if _given_up(scope, record.method) else KeyState.ABANDONED
    else:
        state = KeyState(record.status)
    response = None
    if state is KeyState.COMPLETED:
        # Stores hold the sealed form: opened here, as a claim opens it.
        response = unseal(record.stored_response(), conf.ENCRYPTION_KEYS)
    stored = response is None or _whole(response)
    found = KeyStatus(
        state,
        scope,
        method=record.method,
        path=record.path,
        lease_expires_at=record.lease_expires_at,
        expires_at=record.expires_at,
        status=None if response is None else response.status,
        response=response if stored else None,
        stored=stored,
        operation_id=record.operation_id,
    )
    return found, response


def _given_up(scope: Scope, method: str) -> bool:
    """Whether the sweep gave this abandoned function's or task's call up (views are never
    recovered, and calls are kept on the database store only)."""
    if method not in ("CALL", "TASK"):
        return False
    try:
        check_store()
    except ImproperlyConfigured:
        return False
    return is_failed(scope)


def _whole(response: StoredResponse) -> bool:
    """Kept as the work answered it: not the record of a refused result, nor without its body."""
    return not is_not_stored(response) and BODY_NOT_STORED not in dict(response.headers)


def wait_for(
    key: str, *, namespace: str, owner: str = "", timeout: timedelta | float | None = None
) -> KeyStatus:
    """`lookup`, again and again until the key is no longer in progress: completed, absent
    (given back, or never used) or abandoned. Another process's work is waited for as well as
    this one's. Raises `KeyInProgress` once ``timeout`` (seconds; default
    IDEMPOTENCY_WAIT_TIMEOUT) has passed with the work still running."""
    if timeout is None:
        timeout = conf.WAIT_TIMEOUT
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if math.isnan(seconds):
        raise ValueError("wait_for(timeout=nan): give a number of seconds or a timedelta.")
    deadline = time.monotonic() + seconds
    delay = FIRST_DELAY
    while True:
        status = lookup(key, namespace=namespace, owner=owner)
        remaining = deadline - time.monotonic()
        if status.state is not KeyState.IN_PROGRESS:
            return status
        if remaining <= 0:
            raise KeyInProgress(
                f"The work of the key {key!r} was still running after {seconds:g} s"
                f" (its lease ends at {status.lease_expires_at})."
            )
        time.sleep(min(delay, remaining))
        delay = next_delay(delay)
