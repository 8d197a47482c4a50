"""The default store: records in the project's database, claims enforced by its unique index."""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from functools import cached_property
from typing import Any

from django.db import (
    InterfaceError,
    NotSupportedError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q, QuerySet

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
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores.base import BaseStore, ClaimRequest, PurgeResult, StoreUnavailable

_COLUMNS = (
    "id",
    "namespace",
    "owner",
    "key",
    "fingerprint",
    "status",
    "method",
    "path",
    "response_status",
    "response_headers",
    "response_body",
    "lease_token",
    "lease_expires_at",
    "created_at",
    "completed_at",
    "expires_at",
)
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
    """Claims are one INSERT … ON CONFLICT statement; a replay is that same single statement.

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

    def begin(self, request: ClaimRequest) -> Claim:
        connection = self.connection
        token = uuid.uuid4().hex
        try:
            record = self._insert_or_find(connection, request, token)
            if record is None:
                return Claim(Outcome.IN_PROGRESS)
            claimed = getattr(record, "claimed", False)
            if (
                not claimed
                and getattr(record, "acquired", True)  # Nobody else is claiming it right now.
                and is_abandoned(
                    status=record.status,
                    expires_at=record.expires_at,
                    lease_expires_at=record.lease_expires_at,
                    now=request.now,
                )
            ):
                claimed = self._take_over(record, request, token)
        except _UNREACHABLE as exc:
            if _is_sqlite_busy(connection, exc):
                return Claim(Outcome.IN_PROGRESS)  # SQLite's single writer is busy elsewhere.
            raise StoreUnavailable(str(exc)) from exc
        if claimed:
            return Claim(
                Outcome.FRESH,
                record_id=record.pk,
                lease_token=token,
                lease_expires_at=record.lease_expires_at,
                scope=request.scope,
                fingerprint=record.fingerprint,
                expires_at=record.expires_at,
            )
        outcome = classify(
            status=record.status,
            stored_fingerprint=record.fingerprint,
            fingerprint=request.fingerprint,
            expires_at=record.expires_at,
            now=request.now,
        )
        if outcome is Outcome.REPLAY:
            return Claim(
                outcome,
                record_id=record.pk,
                response=_stored_response(record),
                scope=request.scope,
                fingerprint=record.fingerprint,
                expires_at=record.expires_at,
            )
        return Claim(outcome, record_id=record.pk, lease_expires_at=record.lease_expires_at)

    def _insert_or_find(
        self, connection: BaseDatabaseWrapper, request: ClaimRequest, token: str
    ) -> IdempotencyRecord | None:
        """One statement: insert the claim, or return the record already holding the key."""
        sql, params = self._claim_statement(connection, request, token)
        rows = list(IdempotencyRecord.objects.using(self.alias).raw(sql, params))
        if not rows:
            # Committed between our snapshot and our insert (or, on SQLite, not inserted):
            # a fresh statement sees it.
            rows = list(
                IdempotencyRecord.objects.using(self.alias).filter(
                    namespace=request.scope.namespace,
                    owner=request.scope.owner,
                    key=request.scope.key,
                )
            )
        return rows[0] if rows else None

    def _take_over(self, record: IdempotencyRecord, request: ClaimRequest, token: str) -> bool:
        """Claim an abandoned record, unless a concurrent request got there first."""
        now = request.now
        record.fingerprint = request.fingerprint
        record.lease_expires_at = now + request.lease if request.lease is not None else None
        record.expires_at = now + request.ttl
        updated = (
            IdempotencyRecord.objects.using(self.alias)
            .filter(
                Q(expires_at__lte=now) | Q(status=Status.IN_PROGRESS, lease_expires_at__lte=now),
                pk=record.pk,
            )
            .update(
                fingerprint=record.fingerprint,
                status=Status.IN_PROGRESS.value,
                method=request.method,
                path=request.path,
                response_status=None,
                response_headers=[],
                response_body=None,
                lease_token=token,
                lease_expires_at=record.lease_expires_at,
                created_at=now,
                completed_at=None,
                expires_at=record.expires_at,
            )
        )
        return updated == 1

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        with _reachable():
            updated = self._own(claim).update(
                status=Status.COMPLETED.value,
                response_status=response.status,
                response_headers=[list(pair) for pair in response.headers],
                response_body=response.body,
                completed_at=now,
                lease_expires_at=None,
            )
        return updated == 1

    def release(self, claim: Claim) -> bool:
        with _reachable():
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
        records = IdempotencyRecord.objects.using(self.alias).filter(
            Q(expires_at__lte=now) | Q(status=Status.IN_PROGRESS, lease_expires_at__lte=now)
        )
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
            with transaction.atomic(using=self.alias):
                yield True

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
        return {"postgresql": _postgresql_claim_sql(), "sqlite": _sqlite_claim_sql()}


@contextlib.contextmanager
def _reachable() -> Iterator[None]:
    """Turn a lost database into `StoreUnavailable`, which the views answer with a 503."""
    try:
        yield
    except _UNREACHABLE as exc:
        raise StoreUnavailable(str(exc)) from exc


def _is_sqlite_busy(connection: BaseDatabaseWrapper, exc: Exception) -> bool:
    return connection.vendor == "sqlite" and "locked" in str(exc)


def _lock_id(namespace: str, owner: str, key: str) -> int:
    """A signed 64-bit advisory lock id for the scope; collisions only cost a spurious 409."""
    digest = hashlib.sha256("\x00".join((namespace, owner, key)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _stored_response(record: IdempotencyRecord) -> StoredResponse:
    return StoredResponse(
        status=record.response_status or 200,
        headers=[(str(name), str(value)) for name, value in record.response_headers],
        body=bytes(record.response_body or b""),
    )


def _q(name: str) -> str:
    return f'"{name}"'


_ON_CONFLICT = f"ON CONFLICT ({_q('namespace')}, {_q('owner')}, {_q('key')}) DO NOTHING"


def _postgresql_claim_sql() -> str:
    table = _q(IdempotencyRecord._meta.db_table)
    columns = ", ".join(_q(c) for c in _COLUMNS)
    casts = {"response_headers": "::jsonb", "lease_expires_at": "::timestamptz"}
    casts |= {"created_at": "::timestamptz", "expires_at": "::timestamptz"}
    values = ", ".join(f"%s{casts.get(c, '')}" for c in _INSERTED)
    return (
        f"WITH lock AS (SELECT pg_try_advisory_xact_lock(%s) AS acquired), "
        f"claimed AS (INSERT INTO {table} ({', '.join(_q(c) for c in _INSERTED)}) "
        f"SELECT {values} FROM lock WHERE lock.acquired {_ON_CONFLICT} "
        f"RETURNING {columns}) "
        f"SELECT {columns}, TRUE AS claimed, TRUE AS acquired FROM claimed "
        f"UNION ALL SELECT {columns}, FALSE, (SELECT acquired FROM lock) FROM {table} "
        f"WHERE {_q('namespace')} = %s AND {_q('owner')} = %s AND {_q('key')} = %s "
        f"AND NOT EXISTS (SELECT 1 FROM claimed)"
    )


def _sqlite_claim_sql() -> str:
    table = _q(IdempotencyRecord._meta.db_table)
    columns = ", ".join(_q(c) for c in _COLUMNS)
    values = ", ".join("%s" for _ in _INSERTED)
    return (
        f"INSERT INTO {table} ({', '.join(_q(c) for c in _INSERTED)}) VALUES ({values}) "
        f"{_ON_CONFLICT} RETURNING {columns}, 1 AS claimed"
    )
