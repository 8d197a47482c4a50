"""The default store: records in the project's database, claims enforced by its unique index."""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, cast

from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connections,
    router,
    transaction,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model, QuerySet
from django.db.models.sql import UpdateQuery

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Claim, Outcome, Scope, Status, StoredResponse
from django_idempotency.models import IdempotencyRecord, reclaimable
from django_idempotency.stores import statements
from django_idempotency.stores.base import (
    ALL_AT_DEFAULTS,
    BaseStore,
    ClaimRequest,
    PurgeOptions,
    PurgeResult,
    ResponseTooLarge,
    StoreBusy,
    StoreUnavailable,
    between_steps,
    fresh_claim,
)
from django_idempotency.stores.batches import delete_batch
from django_idempotency.stores.connections import on_a_live_connection
from django_idempotency.stores.dialects import (
    MARIADB_DUPLICATE_KEY,
    MARIADB_LOCK_NOT_GRANTED,
    MARIADB_PACKET_TOO_LARGE,
    MariaDB,
    PostgreSQL,
    advisory_locks,
    dialect_for,
)
from django_idempotency.stores.packets import fits_in_a_packet
from django_idempotency.stores.statements import RecordRow

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
        return records_alias()

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
            if _is_busy(connection, exc):
                return None  # `begin` decides, answering 409 if SQLite stays busy.
            raise StoreUnavailable(str(exc)) from exc
        if row is None or row.abandoned(request.now):
            return None
        return row.answer(request)

    def _find(
        self, connection: BaseDatabaseWrapper, scope: Scope, *, locking: bool = False
    ) -> RecordRow | None:
        """The key's record. `locking`: inside a claim, the latest committed version even
        where the transaction's snapshot is older (MariaDB's REPEATABLE READ)."""
        dialect = dialect_for(connection)
        sql = dialect.locking_lookup if locking else dialect.lookup
        return _fetch_one(connection, sql, [scope.namespace, scope.owner, scope.key])

    def begin(self, request: ClaimRequest) -> Claim:
        connection = self.connection
        token = uuid.uuid4().hex
        try:
            row, held_by_another_request = self._insert_or_find(connection, request, token)
            if row is None:
                # Held by a claim not yet committed (atomic mode), or one just released.
                outcome = Outcome.MISMATCH if held_by_another_request else Outcome.IN_PROGRESS
                return Claim(outcome)
            claimed, steps = row.claimed, None
            # Only take over a record nobody else is claiming right now.
            if not claimed and row.acquired and row.abandoned(request.now):
                resumes = row.resumed_by(request)
                between_steps("take-over")  # Tests run what may happen here (see interleave).
                taken = self._take_over(row, request, token, keep_steps=resumes)
                if taken is None:
                    # Purged or taken by another retry since the read: answer from what the
                    # database holds now, never from the stale row.
                    row = self._find(connection, request.scope, locking=True)
                    if row is None or row.abandoned(request.now):
                        return Claim(Outcome.IN_PROGRESS)
                else:
                    row, claimed = taken, True
                    if resumes:  # Rare (a crashed attempt's retry): one more read.
                        steps = self._stored_steps(row.pk, token)
        except _UNREACHABLE as exc:
            if _is_busy(connection, exc):
                # SQLite's single writer is busy elsewhere, or MariaDB's row is locked by
                # another transaction claiming the key.
                return Claim(Outcome.IN_PROGRESS)
            raise StoreUnavailable(str(exc)) from exc
        if claimed:
            # Inserted or taken over just now, so written as the request asked.
            return fresh_claim(request, token, record_id=row.pk, steps=steps)
        return row.answer(request)

    def _insert_or_find(
        self, connection: BaseDatabaseWrapper, request: ClaimRequest, token: str
    ) -> tuple[RecordRow | None, bool]:
        """Insert the claim, or find the record already holding the key; and whether the key
        was held by a claim for another request (only PostgreSQL can tell).

        The claim statement returns only the new id: the store knows what it inserted. The rare
        claim that inserts nothing (a duplicate, an expired or abandoned record, a race) reads
        the key again with a statement of its own, which sees every commit before it.
        """
        dialect = dialect_for(connection)
        params = self._claim_params(connection, request, token)
        if isinstance(dialect, MariaDB):
            return self._insert_or_find_mariadb(connection, dialect, request, params), False
        scope = request.scope
        locks = []
        if isinstance(dialect, PostgreSQL):
            locks = advisory_locks(request)
        claim, opening = dialect.claim, False
        if isinstance(dialect, PostgreSQL) and statements.opens_transaction(connection):
            claim, opening = dialect.opening_claim, True  # BEGIN and the claim: one round trip.
        with statements.cursor(connection, several=opening) as cursor:
            cursor.execute(claim, [*locks, *params])
            if opening:
                cursor.nextset()  # From BEGIN's result to the claim's.
            inserted = cursor.fetchone()
        if inserted is not None:
            return RecordRow.inserted(request, inserted[0]), False
        if not isinstance(dialect, PostgreSQL):
            return self._find(connection, scope), False
        with statements.cursor(connection) as cursor:
            cursor.execute(dialect.probe, [*locks, scope.namespace, scope.owner, scope.key])
            values = cursor.fetchone()
        *columns, acquired, free = values
        if columns[0] is None:
            # The identity lock was free (not this same request) and the key's lock was not.
            return None, bool(free) and not acquired
        return replace(statements.to_row(columns, connection), acquired=bool(acquired)), False

    def _insert_or_find_mariadb(
        self,
        connection: BaseDatabaseWrapper,
        dialect: MariaDB,
        request: ClaimRequest,
        params: list[Any],
    ) -> RecordRow | None:
        """The insert, or the committed record its duplicate key names. A claim not yet
        committed raises MariaDB's lock error, answered as in progress by `begin`."""
        try:
            with statements.cursor(connection) as cursor:
                cursor.execute(dialect.claim, params)
                pk = cursor.lastrowid
        except IntegrityError as exc:
            if exc.args and exc.args[0] != MARIADB_DUPLICATE_KEY:
                raise
            return self._find(connection, request.scope, locking=True)
        return RecordRow.inserted(request, pk)

    def _take_over(
        self, row: RecordRow, request: ClaimRequest, token: str, *, keep_steps: bool
    ) -> RecordRow | None:
        """Claim an abandoned record, keeping its steps for the same request's retry; None if a
        concurrent request or the purge got there first."""
        now = request.now
        row = replace(
            row,
            fingerprint=request.fingerprint,
            method=request.method,
            path=request.path,
            status=Status.IN_PROGRESS.value,
            lease_expires_at=request.lease_expires_at,
            expires_at=now + request.ttl,
        )
        record = IdempotencyRecord.objects.using(self.alias).filter(reclaimable(now), pk=row.pk)
        update = cast(UpdateQuery, record.query.chain(UpdateQuery))
        cleared_steps: dict[str, Any] = {} if keep_steps else {"steps": None}
        update.add_update_values(
            dict(
                **cleared_steps,
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
        sql, params = update.get_compiler(self.alias).as_sql()
        # Raw, not QuerySet.update: a row another claim holds must not doom the caller's
        # transaction (MariaDB), only answer this request as in progress.
        connection = self.connection
        with statements.cursor(connection) as cursor:
            cursor.execute(dialect_for(connection).no_wait + sql, params)
            return row if cursor.rowcount == 1 else None

    def complete(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        return self._complete(claim, response, now, last=False)

    def complete_last(self, claim: Claim, response: StoredResponse, now: datetime) -> bool:
        return self._complete(claim, response, now, last=True)

    def _complete(
        self, claim: Claim, response: StoredResponse, now: datetime, *, last: bool
    ) -> bool:
        assert claim.record_id is not None and claim.lease_token is not None
        connection = self.connection
        if connection.in_atomic_block and connection.needs_rollback:
            return False  # `transaction.set_rollback(True)`: the claim is rolled back too.
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
        with _reachable(connection):
            dialect = dialect_for(connection)
            if isinstance(dialect, MariaDB) and not fits_in_a_packet(connection, params):
                # Refused before it is sent: the server would close the connection, and
                # with it atomic mode's transaction.
                raise ResponseTooLarge(_too_large(len(response.body)))
            sql = dialect.complete
            closing = last and statements.closes_transaction(connection)
            if closing and isinstance(dialect, PostgreSQL):
                # The block's own commit then finds the transaction ended, and sends nothing.
                sql = dialect.closing_complete
            try:
                with statements.cursor(connection, several=sql != dialect.complete) as cursor:
                    cursor.execute(sql, params)
                    return bool(cursor.rowcount == 1)
            except OperationalError as exc:
                if exc.args[:1] != (MARIADB_PACKET_TOO_LARGE,) or connection.in_atomic_block:
                    raise  # In a transaction, it is lost with the connection: unreachable.
                # MariaDB refused the statement for its size, and closed the connection: the
                # next statement opens another.
                connection.close()
                raise ResponseTooLarge(_too_large(len(response.body))) from exc

    def release(self, claim: Claim) -> bool:
        # Only a claim still in progress: once completed, its token releases nothing (a release
        # after a completion that seemed to fail would let a retry run the work again).
        in_progress = self._own(claim).filter(status=Status.IN_PROGRESS.value)
        with _reachable(self.connection):
            deleted, _ = in_progress.delete()
        return deleted == 1

    def claims_privately(self) -> bool:
        return self.connection.in_atomic_block

    def renew(self, claim: Claim, until: datetime) -> bool:
        held = self._own(claim).filter(status=Status.IN_PROGRESS.value)
        with _reachable(self.connection):
            renewed = held.update(lease_expires_at=until) == 1
        if renewed:
            claim.lease_expires_at = until
        return renewed

    def save_steps(self, claim: Claim, steps: Mapping[str, bytes]) -> bool:
        held = self._own(claim).filter(status=Status.IN_PROGRESS.value)
        encoded = {name: base64.b64encode(value).decode() for name, value in steps.items()}
        with _reachable(self.connection):
            return bool(held.update(steps=encoded) == 1)

    def _stored_steps(self, record_id: int, token: str) -> dict[str, bytes]:
        """The steps of the record this claim has just taken over (under `token`)."""
        stored = (
            IdempotencyRecord.objects.using(self.alias)
            .filter(pk=record_id, lease_token=token)
            .values_list("steps", flat=True)
            .first()
        )
        if not isinstance(stored, dict):
            return {}
        return {str(name): base64.b64decode(value) for name, value in stored.items()}

    def purge(self, now: datetime, options: PurgeOptions = ALL_AT_DEFAULTS) -> PurgeResult:
        records = IdempotencyRecord.objects.using(self.alias).filter(reclaimable(now))
        if options.namespace is not None:
            records = records.filter(namespace=options.namespace)
        if options.dry_run:
            return PurgeResult(
                expired=records.filter(status=Status.COMPLETED.value).count(),
                abandoned=records.filter(status=Status.IN_PROGRESS.value).count(),
            )
        result = PurgeResult()
        while deleted := delete_batch(self.alias, records, options.batch_size):
            result.batches += 1
            for status, *_ in deleted:
                if status == Status.COMPLETED:
                    result.expired += 1
                else:
                    result.abandoned += 1
            (options.forget or self.forget)(Scope(*scope) for _, *scope in deleted)
            if options.progress is not None:
                options.progress(result)
        return result

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
                if not entered and _is_busy(connection, exc):
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

    @staticmethod
    def _claim_params(
        connection: BaseDatabaseWrapper, request: ClaimRequest, token: str
    ) -> list[Any]:
        ops = connection.ops
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
            ops.adapt_datetimefield_value(request.lease_expires_at),
            ops.adapt_datetimefield_value(request.now),
            ops.adapt_datetimefield_value(request.expires_at),
        ]


def records_alias(model: type[Model] | None = None) -> str:
    """The database alias of the records (or of `model`, kept beside them: the outbound
    journal): IDEMPOTENCY_DATABASE, or the router's choice.

    The router's choice for writing, for the store's reads too: each read decides (a replay, a
    conflict, a new key), and a replica the router may send reads to can lag behind the primary,
    answering "no record" for a key whose first request has just committed there.
    """
    return conf.DATABASE or router.db_for_write(model or IdempotencyRecord)


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


def _too_large(size: int) -> str:
    return (
        f"A response body of {size} bytes is larger than the database takes in one statement "
        "(MariaDB's max_allowed_packet): raise max_allowed_packet, or set "
        "IDEMPOTENCY_MAX_STORED_BYTES below it."
    )


def _fetch_one(connection: BaseDatabaseWrapper, sql: str, params: list[Any]) -> RecordRow | None:
    with statements.cursor(connection) as cursor:
        cursor.execute(sql, params)
        values = cursor.fetchone()
    return None if values is None else statements.to_row(values, connection)


def _is_busy(connection: BaseDatabaseWrapper, exc: Exception) -> bool:
    """Not a lost database: SQLite's single writer is busy, or a MariaDB row lock is held by
    another transaction (the claim does not wait for it)."""
    if connection.vendor == "sqlite":
        return "locked" in str(exc)
    code = exc.args[0] if exc.args else None
    return connection.vendor == "mysql" and code in MARIADB_LOCK_NOT_GRANTED
