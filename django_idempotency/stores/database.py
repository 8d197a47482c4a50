"""The default store: records in the project's database, claims enforced by its unique index."""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from functools import cached_property
from typing import Any

from django.db import (
    DatabaseError,
    InterfaceError,
    NotSupportedError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import (
    Claim,
    Outcome,
    Scope,
    Status,
    StoredResponse,
    classify,
    is_abandoned,
)
from django_idempotency.models import IdempotencyRecord, reclaimable
from django_idempotency.stores import statements
from django_idempotency.stores.base import (
    BaseStore,
    ClaimRequest,
    PurgeResult,
    StoreBusy,
    StoreUnavailable,
)
from django_idempotency.stores.connections import on_a_live_connection
from django_idempotency.stores.statements import RECORD_COLUMNS, RecordRow

# The columns a claim writes, in the order of `_claim_params`.
_INSERTED = (
    "namespace",
    "owner",
    "key",
    "fingerprint",
    "status",
    "method",
    "path",
    "response_headers",
    "lease_token",
    "lease_expires_at",
    "created_at",
    "expires_at",
)
_UNREACHABLE = (OperationalError, InterfaceError)


class DatabaseStore(BaseStore):
    """A replay is one indexed read outside any transaction; a claim is one INSERT … ON CONFLICT.

    On PostgreSQL the statement first tries a transaction-scoped advisory lock on the key: a
    duplicate that arrives while the first request's transaction is still open learns at once
    that the key is busy, instead of queueing behind the uncommitted row.
    """

    supports_atomic = True

    @property
    def alias(self) -> str:
        return conf.DATABASE or router.db_for_write(IdempotencyRecord)

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    def lookup(self, request: ClaimRequest) -> Claim | None:
        """Answer a replay, a mismatch or a live claim with one indexed read, before any
        transaction is opened; a new, expired or abandoned key goes on to `begin`."""
        connection = self.connection
        try:
            row = on_a_live_connection(lambda: self._find(connection, request.scope))
        except _UNREACHABLE as exc:
            if _is_sqlite_busy(connection, exc):
                return None  # `begin` decides, answering 409 if SQLite stays busy.
            raise StoreUnavailable(str(exc)) from exc
        if row is None or _abandoned(row, request):
            return None
        return self._answer(row, request)

    def _find(self, connection: BaseDatabaseWrapper, scope: Scope) -> RecordRow | None:
        return _fetch_one(
            connection, self._sql["lookup"], [scope.namespace, scope.owner, scope.key]
        )

    def begin(self, request: ClaimRequest) -> Claim:
        connection = self.connection
        token = uuid.uuid4().hex
        try:
            row, held_by_another_request = self._insert_or_find(connection, request, token)
            if row is None:
                # Held by a claim not yet committed (atomic mode), or one just released.
                outcome = Outcome.MISMATCH if held_by_another_request else Outcome.IN_PROGRESS
                return Claim(outcome)
            claimed = row.claimed
            # Only take over a record nobody else is claiming right now.
            if not claimed and row.acquired and _abandoned(row, request):
                taken = self._take_over(row, request, token)
                if taken is None:
                    # Purged or taken by another retry since the read: answer from what the
                    # database holds now, never from the stale row.
                    row = self._find(connection, request.scope)
                    if row is None or _abandoned(row, request):
                        return Claim(Outcome.IN_PROGRESS)
                else:
                    row, claimed = taken, True
        except _UNREACHABLE as exc:
            if _is_sqlite_busy(connection, exc):
                return Claim(Outcome.IN_PROGRESS)  # SQLite's single writer is busy elsewhere.
            raise StoreUnavailable(str(exc)) from exc
        if claimed:
            return Claim(
                Outcome.FRESH,
                record_id=row.pk,
                lease_token=token,
                lease_expires_at=row.lease_expires_at,
                scope=request.scope,
                fingerprint=row.fingerprint,
                expires_at=row.expires_at,
                method=request.method,
                path=request.path,
            )
        return self._answer(row, request)

    @staticmethod
    def _answer(row: RecordRow, request: ClaimRequest) -> Claim:
        """What an existing record, not ours, means for this request."""
        outcome = classify(
            status=row.status,
            expires_at=row.expires_at,
            now=request.now,
            same_request=(row.fingerprint, row.method, row.path)
            == (request.fingerprint, request.method, request.path),
        )
        if outcome is Outcome.REPLAY:
            return Claim(
                outcome,
                record_id=row.pk,
                response=_stored_response(row),
                scope=request.scope,
                fingerprint=row.fingerprint,
                expires_at=row.expires_at,
                method=row.method,
                path=row.path,
            )
        return Claim(outcome, record_id=row.pk, lease_expires_at=row.lease_expires_at)

    def _insert_or_find(
        self, connection: BaseDatabaseWrapper, request: ClaimRequest, token: str
    ) -> tuple[RecordRow | None, bool]:
        """One statement: insert the claim, or return the record already holding the key; and
        whether the key was held by a claim for another request (only PostgreSQL can tell)."""
        sql, params = self._claim_statement(connection, request, token)
        with statements.cursor(connection) as cursor:
            cursor.execute(sql, params)
            values = cursor.fetchone()
        row = None if values is None or values[0] is None else statements.to_row(values)
        flags: Sequence[Any] = () if values is None else values[len(RECORD_COLUMNS) :]
        # The identity lock was free (not this same request) and the key's lock was not.
        held_by_another_request = len(flags) == 3 and bool(flags[2]) and not flags[1]
        if row is None:
            # Committed between our snapshot and our insert (or, on SQLite, not inserted):
            # a fresh statement sees it.
            row = self._find(connection, request.scope)
        return row, held_by_another_request

    def _take_over(self, row: RecordRow, request: ClaimRequest, token: str) -> RecordRow | None:
        """Claim an abandoned record; None if a concurrent request or the purge got there first."""
        now = request.now
        row = replace(
            row,
            fingerprint=request.fingerprint,
            method=request.method,
            path=request.path,
            status=Status.IN_PROGRESS.value,
            lease_expires_at=now + request.lease if request.lease is not None else None,
            expires_at=now + request.ttl,
        )
        updated = (
            IdempotencyRecord.objects.using(self.alias)
            .filter(reclaimable(now), pk=row.pk)
            .update(
                fingerprint=row.fingerprint,
                status=row.status,
                method=request.method,
                path=request.path,
                response_status=None,
                response_reason="",
                response_headers=[],
                response_body=None,
                lease_token=token,
                lease_expires_at=row.lease_expires_at,
                created_at=now,
                completed_at=None,
                expires_at=row.expires_at,
            )
        )
        return row if updated == 1 else None

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        assert claim.record_id is not None and claim.lease_token is not None
        connection = self.connection
        ops = connection.ops
        params = [
            Status.COMPLETED.value,
            response.status,
            response.reason,
            ops.adapt_json_value([list(pair) for pair in response.headers], None),
            response.body,
            ops.adapt_datetimefield_value(now),
            claim.record_id,
            claim.lease_token,  # Fencing: only while the claim still holds its lease token.
        ]
        with _reachable(connection), statements.cursor(connection) as cursor:
            cursor.execute(self._sql["complete"], params)
            return bool(cursor.rowcount == 1)

    def release(self, claim: Claim) -> bool:
        with _reachable(self.connection):
            deleted, _ = self._own(claim).delete()
        return deleted == 1

    def purge(
        self,
        now: datetime,
        *,
        batch_size: int = 1000,
        namespace: str | None = None,
        dry_run: bool = False,
        progress: Callable[[PurgeResult], None] | None = None,
        forget: Callable[[Iterable[Scope]], None] | None = None,
    ) -> PurgeResult:
        records = IdempotencyRecord.objects.using(self.alias).filter(reclaimable(now))
        if namespace is not None:
            records = records.filter(namespace=namespace)
        if dry_run:
            return PurgeResult(
                expired=records.filter(status=Status.COMPLETED).count(),
                abandoned=records.filter(status=Status.IN_PROGRESS).count(),
            )
        result = PurgeResult()
        while deleted := self._purge_batch(records, batch_size):
            result.batches += 1
            for status, *_ in deleted:
                if status == Status.COMPLETED:
                    result.expired += 1
                else:
                    result.abandoned += 1
            (forget or self.forget)(Scope(*scope) for _, *scope in deleted)
            if progress is not None:
                progress(result)
        return result

    def _purge_batch(
        self, records: QuerySet[IdempotencyRecord], batch_size: int
    ) -> list[tuple[str, str, str, str]]:
        """Delete one batch in its own short transaction; return (status, *scope) per row."""
        fields = ("status", "namespace", "owner", "key")
        if self.connection.vendor == "postgresql":
            # One statement a batch; SKIP LOCKED leaves rows a live claim is taking over alone.
            batch = records.values("pk")[:batch_size].select_for_update(skip_locked=True)
            table = _q(IdempotencyRecord._meta.db_table)
            with transaction.atomic(using=self.alias), self.connection.cursor() as cursor:
                inner_sql, params = batch.query.sql_with_params()
                # MATERIALIZED: as a plain IN (subquery) the planner may rescan the LIMIT
                # subquery once per row and delete far more than one batch.
                cursor.execute(
                    f"WITH batch (batch_id) AS MATERIALIZED ({inner_sql}) "
                    f"DELETE FROM {table} WHERE {_q('id')} IN (SELECT batch_id FROM batch) "
                    f"RETURNING {', '.join(_q(f) for f in fields)}",
                    params,
                )
                return [tuple(row) for row in cursor.fetchall()]
        with transaction.atomic(using=self.alias):
            rows = list(records.values_list("pk", *fields)[:batch_size])
            IdempotencyRecord.objects.using(self.alias).filter(pk__in=[r[0] for r in rows]).delete()
        return [row[1:] for row in rows]

    @contextlib.contextmanager
    def atomic(self) -> Iterator[bool]:
        connection = self.connection
        with _reachable():
            connection.ensure_connection()
            if connection.in_atomic_block:
                # ATOMIC_REQUESTS or a TestCase: the caller's transaction decides about the
                # view's writes, and the claim joins it without a savepoint (two statements
                # fewer, and no savepoint whose rollback would doom the caller's transaction).
                yield False
                return
            entered = False
            try:
                with transaction.atomic(using=self.alias):
                    entered = True
                    yield True
            except OperationalError as exc:
                # SQLite with "transaction_mode": "IMMEDIATE" takes its single writer's lock at
                # BEGIN: another request holds it, which is not a lost database.
                if not entered and _is_sqlite_busy(connection, exc):
                    raise StoreBusy(str(exc)) from exc
                raise

    def discard(self) -> None:
        transaction.set_rollback(True, using=self.alias)

    def after_commit(self, action: Callable[[], None]) -> None:
        transaction.on_commit(action, using=self.alias)

    def _own(self, claim: Claim) -> QuerySet[IdempotencyRecord]:
        """The claim's record, only while the claim still holds its lease token (fencing)."""
        assert claim.record_id is not None and claim.lease_token is not None
        return IdempotencyRecord.objects.using(self.alias).filter(
            pk=claim.record_id, lease_token=claim.lease_token
        )

    def _claim_statement(
        self, connection: BaseDatabaseWrapper, request: ClaimRequest, token: str
    ) -> tuple[str, list[Any]]:
        params = self._claim_params(connection, request, token)
        scope = request.scope
        if connection.vendor == "postgresql":
            return self._sql["postgresql"], [
                _identity_lock_id(request),
                _lock_id(scope.namespace, scope.owner, scope.key),
                *params,
                scope.namespace,
                scope.owner,
                scope.key,
            ]
        if connection.vendor == "sqlite":
            return self._sql["sqlite"], params
        raise NotSupportedError(
            f"DatabaseStore supports PostgreSQL and SQLite, not {connection.vendor}; "
            "set IDEMPOTENCY_DATABASE to one of those."
        )

    @staticmethod
    def _claim_params(
        connection: BaseDatabaseWrapper, request: ClaimRequest, token: str
    ) -> list[Any]:
        ops = connection.ops
        lease_expires_at = request.now + request.lease if request.lease is not None else None
        return [
            request.scope.namespace,
            request.scope.owner,
            request.scope.key,
            request.fingerprint,
            Status.IN_PROGRESS.value,
            request.method,
            request.path,
            ops.adapt_json_value([], None),
            token,
            ops.adapt_datetimefield_value(lease_expires_at),
            ops.adapt_datetimefield_value(request.now),
            ops.adapt_datetimefield_value(request.now + request.ttl),
        ]

    @cached_property
    def _sql(self) -> dict[str, str]:
        table = _q(IdempotencyRecord._meta.db_table)
        columns = ", ".join(_q(c) for c in RECORD_COLUMNS)
        scope = f"{_q('namespace')} = %s AND {_q('owner')} = %s AND {_q('key')} = %s"
        completed = ", ".join(
            f"{_q(c)} = %s"
            for c in (
                "status",
                "response_status",
                "response_reason",
                "response_headers",
                "response_body",
            )
        )
        return {
            "postgresql": _postgresql_claim_sql(),
            "sqlite": _sqlite_claim_sql(),
            "lookup": f"SELECT {columns} FROM {table} WHERE {scope}",
            "complete": (
                f"UPDATE {table} SET {completed}, {_q('completed_at')} = %s, "
                f"{_q('lease_expires_at')} = NULL "
                f"WHERE {_q('id')} = %s AND {_q('lease_token')} = %s"
            ),
        }


@contextlib.contextmanager
def _reachable(connection: BaseDatabaseWrapper | None = None) -> Iterator[None]:
    """Turn a lost database into `StoreUnavailable`, which the views answer with a 503.

    Given the connection, and outside a transaction, drop it: it is most likely dead, and
    Django would otherwise send the next statement (a retry) down it again.
    """
    try:
        yield
    except _UNREACHABLE as exc:
        if connection is not None and not connection.in_atomic_block:
            with contextlib.suppress(DatabaseError):
                connection.close()
        raise StoreUnavailable(str(exc)) from exc


def _fetch_one(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> RecordRow | None:
    with statements.cursor(connection) as cursor:
        cursor.execute(sql, params)
        values = cursor.fetchone()
    return None if values is None else statements.to_row(values)


def _is_sqlite_busy(connection: BaseDatabaseWrapper, exc: Exception) -> bool:
    return connection.vendor == "sqlite" and "locked" in str(exc)


def _lock_id(*parts: str) -> int:
    """A signed 64-bit advisory lock id; collisions only cost a spurious 409."""
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _identity_lock_id(request: ClaimRequest) -> int:
    """The lock a claim holds on its request's identity: scope, fingerprint, method, path."""
    scope = request.scope
    return _lock_id(
        scope.namespace, scope.owner, scope.key, request.fingerprint, request.method, request.path
    )


def _abandoned(row: RecordRow, request: ClaimRequest) -> bool:
    return is_abandoned(
        status=row.status,
        expires_at=row.expires_at,
        lease_expires_at=row.lease_expires_at,
        now=request.now,
    )


def _stored_response(row: RecordRow) -> StoredResponse:
    return StoredResponse(
        status=row.response_status or 200,
        headers=[(str(name), str(value)) for name, value in row.response_headers],
        body=row.response_body or b"",
        reason=row.response_reason,
    )


def _q(name: str) -> str:
    return f'"{name}"'


_ON_CONFLICT = f"ON CONFLICT ({_q('namespace')}, {_q('owner')}, {_q('key')}) DO NOTHING"


def _postgresql_claim_sql() -> str:
    table = _q(IdempotencyRecord._meta.db_table)
    columns = ", ".join(_q(c) for c in RECORD_COLUMNS)
    found = ", ".join(f"found.{_q(c)}" for c in RECORD_COLUMNS)
    casts = {"response_headers": "::jsonb", "lease_expires_at": "::timestamptz"}
    casts |= {"created_at": "::timestamptz", "expires_at": "::timestamptz"}
    values = ", ".join(f"%s{casts.get(c, '')}" for c in _INSERTED)
    scope = " AND ".join(f"found.{_q(c)} = %s" for c in ("namespace", "owner", "key"))
    # Two transaction-scoped advisory locks, the request's identity first, then the key. A
    # duplicate of the same request fails the first: in progress (409). Another request with
    # the key takes the first and fails the second: a mismatch (422), told apart even while the
    # holder's claim is uncommitted and invisible (atomic mode).
    return (
        f"WITH identity AS (SELECT pg_try_advisory_xact_lock(%s) AS free), "
        f"lock AS (SELECT CASE WHEN free THEN pg_try_advisory_xact_lock(%s) ELSE FALSE END "
        f"AS acquired, free FROM identity), "
        f"claimed AS (INSERT INTO {table} ({', '.join(_q(c) for c in _INSERTED)}) "
        f"SELECT {values} FROM lock WHERE lock.acquired {_ON_CONFLICT} "
        f"RETURNING {columns}) "
        f"SELECT {columns}, TRUE AS claimed, TRUE AS acquired, TRUE AS free FROM claimed "
        f"UNION ALL SELECT {found}, FALSE, lock.acquired, lock.free "
        f"FROM lock LEFT JOIN {table} AS found ON {scope} "
        f"WHERE NOT EXISTS (SELECT 1 FROM claimed)"
    )


def _sqlite_claim_sql() -> str:
    table = _q(IdempotencyRecord._meta.db_table)
    columns = ", ".join(_q(c) for c in RECORD_COLUMNS)
    values = ", ".join("%s" for _ in _INSERTED)
    return (
        f"INSERT INTO {table} ({', '.join(_q(c) for c in _INSERTED)}) VALUES ({values}) "
        f"{_ON_CONFLICT} RETURNING {columns}, 1 AS claimed"
    )
