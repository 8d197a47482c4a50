"""The database store's hot statements: run through Django's cursor, prepared where allowed."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_idempotency.core.outcomes import Status, StoredResponse
from django_idempotency.stores.base import ClaimRequest, HeldKey

# What the store reads of a record, in this order, by every statement that returns one.
RECORD_COLUMNS = (
    "id",
    "fingerprint",
    "method",
    "path",
    "status",
    "response_status",
    "response_reason",
    "response_headers",
    "response_body",
    "lease_expires_at",
    "expires_at",
    "operation_id",
)


@dataclass(frozen=True)
class RecordRow(HeldKey):
    """A record as the store's statements return it: no model instance, no ORM on the hot path."""

    pk: int
    fingerprint: str
    method: str
    path: str
    status: str
    response_status: int | None
    response_reason: str
    response_headers: list[list[str]]
    response_body: bytes | None
    lease_expires_at: datetime | None
    expires_at: datetime
    operation_id: str
    claimed: bool = False  # This claim inserted it.
    acquired: bool = True  # Nobody else was claiming the key when the claim read it.

    @classmethod
    def inserted(cls, request: ClaimRequest, pk: Any, operation_id: str) -> RecordRow:
        """The record a claim has just inserted, as the claim wrote it."""
        return cls(
            pk=int(pk),
            fingerprint=request.fingerprint,
            method=request.method,
            path=request.path,
            status=Status.IN_PROGRESS.value,
            response_status=None,
            response_reason="",
            response_headers=[],
            response_body=None,
            lease_expires_at=request.lease_expires_at,
            expires_at=request.expires_at,
            operation_id=operation_id,
            claimed=True,
        )

    def stored_response(self) -> StoredResponse:
        return StoredResponse(
            status=self.response_status or 200,
            headers=[(str(name), str(value)) for name, value in self.response_headers],
            body=self.response_body or b"",
            reason=self.response_reason,
        )


def to_row(values: Sequence[Any], connection: BaseDatabaseWrapper) -> RecordRow:
    """Decode the RECORD_COLUMNS of one result row; SQLite hands back text where PostgreSQL
    has types."""
    (
        pk,
        fingerprint,
        method,
        path,
        status,
        response_status,
        response_reason,
        headers,
        body,
        lease_expires_at,
        expires_at,
        operation_id,
    ) = values
    return RecordRow(
        pk=int(pk),
        fingerprint=str(fingerprint),
        method=str(method),
        path=str(path),
        status=str(status),
        response_status=response_status,
        response_reason=str(response_reason or ""),
        response_headers=json.loads(headers) if isinstance(headers, (str, bytes)) else headers,
        response_body=None if body is None else bytes(body),
        lease_expires_at=_datetime(lease_expires_at, connection),
        expires_at=_datetime(expires_at, connection),  # type: ignore[arg-type]
        operation_id=str(operation_id or ""),
    )


def _datetime(value: datetime | None, connection: BaseDatabaseWrapper) -> datetime | None:
    """A column's datetime as `django.utils.timezone.now()` gives them: aware with USE_TZ,
    naive local time without, so the two always compare.

    Django has every driver hand back datetimes (it registers SQLite's converter for the column
    type): PostgreSQL's aware with USE_TZ, the others' naive in the connection's time zone
    (UTC unless DATABASES sets its TIME_ZONE), as the ORM reads them.
    """
    if value is None or value.tzinfo is not None or not settings.USE_TZ:
        return value
    return timezone.make_aware(value, connection.timezone)


@contextmanager
def cursor(connection: BaseDatabaseWrapper, *, several: bool = False) -> Iterator[Any]:
    """Django's cursor, so query logging and execute wrappers see every statement.

    On PostgreSQL with psycopg 3 the statement is sent with server-side parameters, and
    prepared once per connection where `prepares` allows it: its plan is then reused instead of
    being made again on every request. With `several`, psycopg binds the parameters itself
    instead, so one round trip can carry several statements (see `opens_transaction` and
    `closes_transaction`).
    """
    cursors = _server_binding_cursors() if connection.vendor == "postgresql" else None
    if cursors is None:
        with connection.cursor() as django_cursor:
            yield django_cursor
        return
    connection.ensure_connection()
    if several:
        from psycopg import ClientCursor

        cursor_class: type = ClientCursor
    else:
        cursor_class = cursors[prepares(connection)]
    with connection.wrap_database_errors:
        # The wrapping `connection.cursor()` applies (logging, execute wrappers), around ours.
        django_cursor = connection._prepare_cursor(  # type: ignore[attr-defined]
            cursor_class(connection.connection)
        )
    with django_cursor:
        yield django_cursor


def prepares(connection: BaseDatabaseWrapper) -> bool:
    """Whether the store prepares its statements on this open psycopg 3 connection: only where
    the project lets psycopg prepare statements (`OPTIONS["prepare_threshold"]` a number; Django
    sets None, which turns them off) and does not say that the connection goes through a pooler
    in transaction mode (`DISABLE_SERVER_SIDE_CURSORS`, Django's setting for one).

    Behind such a pooler (PgBouncer before 1.21, or without `max_prepared_statements`) a
    statement prepared on one server connection is missing from the next, and its name
    (`_pg3_0`, `_pg3_1`, ... on every client) may be taken there by another client's statement,
    which would run in its place.
    """
    if connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return False
    return getattr(connection.connection, "prepare_threshold", None) is not None


def opens_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the next statement opens the transaction of an atomic block: psycopg 3 would
    then send BEGIN on a round trip of its own first. If so, psycopg is told not to, and the
    caller sends BEGIN with that statement. Django's transaction state does not change: the
    block's commit or rollback ends the server's transaction as it would have."""
    raw = _psycopg3(connection)
    if raw is None or not connection.in_atomic_block or raw.autocommit:
        return False
    from psycopg.pq import TransactionStatus

    if raw.pgconn.transaction_status != TransactionStatus.IDLE:
        return False
    if raw.isolation_level is not None or raw.read_only is not None:
        return False  # psycopg's BEGIN would carry them: leave it to psycopg.
    raw.autocommit = True
    return True


def closes_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether the caller may send COMMIT with its statement, the last of a transaction its own
    atomic block opened: that block's commit then has nothing left to send."""
    raw = _psycopg3(connection)
    if raw is None or len(connection.atomic_blocks) != 1 or connection.needs_rollback:
        return False
    from psycopg.pq import TransactionStatus

    return bool(raw.pgconn.transaction_status == TransactionStatus.INTRANS)


def _psycopg3(connection: BaseDatabaseWrapper) -> Any:
    """The connection's psycopg 3 connection, or None (another backend or driver)."""
    if connection.vendor != "postgresql" or _server_binding_cursors() is None:
        return None
    return connection.connection


@functools.cache
def _server_binding_cursors() -> dict[bool, type] | None:
    """psycopg 3's server-binding cursor, by whether it prepares its statements; None with
    psycopg 2 (client-side binding only, nothing to prepare) or no driver at all."""
    try:
        from django.db.backends.postgresql import base
    except ImportError:  # No PostgreSQL driver at all.
        return None
    server_binding: Any = getattr(base, "ServerBindingCursor", None)
    if server_binding is None:
        return None

    class PreparedCursor(server_binding):  # type: ignore[misc]
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs["prepare"] = True
            return super().execute(query, params, **kwargs)

    class UnpreparedCursor(server_binding):  # type: ignore[misc]
        # Explicitly: psycopg would otherwise prepare a statement run prepare_threshold times.
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs["prepare"] = False
            return super().execute(query, params, **kwargs)

    return {True: PreparedCursor, False: UnpreparedCursor}
