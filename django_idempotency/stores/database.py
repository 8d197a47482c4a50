"""The default store: records in the project's database, claims enforced by its unique index."""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from functools import partial
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
from django.db.models.expressions import RawSQL
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Claim, Outcome, Scope, Status, StoredResponse
from django_idempotency.models import IdempotencyRecord, purgeable, reclaimable
from django_idempotency.stores import statements
from django_idempotency.stores.base import (
    ALL_AT_DEFAULTS,
    BaseStore,
    ClaimRequest,
    PurgeOptions,
    PurgeResult,
    RecordLocked,
    ResponseTooLarge,
    StoreBusy,
    StoreUnavailable,
    UnstorableResponse,
    between_steps,
    fresh_claim,
    new_operation_id,
)
from django_idempotency.stores.batches import delete_batch
from django_idempotency.stores.clocks import StoreClock
from django_idempotency.stores.connections import on_a_live_connection
from django_idempotency.stores.dialects import (
    MARIADB_DUPLICATE_KEY,
    MARIADB_LOCK_NOT_GRANTED,
    MARIADB_PACKET_TOO_LARGE,
    MariaDB,
    PostgreSQL,
    advisory_locks,
    dialect_for,
    lock_not_granted,
    request_locks,
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

    def __init__(self) -> None:
        self._clocks: dict[str, StoreClock] = {}  # Each database alias's clock.

    @property
    def alias(self) -> str:
        return records_alias()

    @property
    def connection(self) -> BaseDatabaseWrapper:
        return connections[self.alias]

    def now(self) -> datetime:
        """The database's clock, read once a minute per alias (see `stores.clocks`)."""
        alias = self.alias
        clock = self._clocks.get(alias)
        if clock is None:
            if connections[alias].vendor not in _CLOCK_SQL:
                return timezone.now()  # A backend the system checks refuse.
            clock = self._clocks.setdefault(alias, StoreClock(partial(_read_clock, alias)))
        return clock.now()

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

    def read(self, scope: Scope) -> RecordRow | None:
        """The key's record, one indexed read outside any transaction of the store's own."""
        connection = self.connection
        try:
            return on_a_live_connection(lambda: self._find(connection, scope))
        except _UNREACHABLE as exc:
            raise StoreUnavailable(str(exc)) from exc

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
                taken = self._take_over(row, request, token, resumes=resumes)
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
            return fresh_claim(
                request, token, record_id=row.pk, steps=steps, operation_id=row.operation_id
            )
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
        # Minted here and sent with the insert: a new record is a new operation.
        operation_id = new_operation_id()
        params = self._claim_params(connection, request, token, operation_id)
        if isinstance(dialect, MariaDB):
            found = self._insert_or_find_mariadb(connection, dialect, request, params, operation_id)
            return found, False
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
            return RecordRow.inserted(request, inserted[0], operation_id), False
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
        operation_id: str,
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
        return RecordRow.inserted(request, pk, operation_id)

    def _take_over(
        self, row: RecordRow, request: ClaimRequest, token: str, *, resumes: bool
    ) -> RecordRow | None:
        """Claim an abandoned record, keeping its steps and its operation's identity for the
        same request's retry (`resumes`); None if a concurrent request or the purge got there
        first, or, for a resume, the attempt it read completed meanwhile."""
        now = request.now
        read = row.operation_id
        row = replace(
            row,
            fingerprint=request.fingerprint,
            method=request.method,
            path=request.path,
            status=Status.IN_PROGRESS.value,
            lease_expires_at=request.lease_expires_at,
            expires_at=request.expires_at,
            operation_id=read if resumes else new_operation_id(),
        )
        # Only the generation read (a take-over by another request gives it a new identity)
        # and, to resume it, only while its attempt is still in progress: one that completed
        # since and expired at once is a new operation, which carries nothing over.
        record = IdempotencyRecord.objects.using(self.alias).filter(
            reclaimable(now), pk=row.pk, operation_id=read
        )
        if resumes:
            record = record.filter(status=Status.IN_PROGRESS.value)
        update = cast(UpdateQuery, record.query.chain(UpdateQuery))
        cleared_steps: dict[str, Any] = {} if resumes else {"steps": None}
        update.add_update_values(
            dict(
                **cleared_steps,
                operation_id=row.operation_id,
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
            if isinstance(dialect, PostgreSQL) and _holds_a_nul(response):
                # Refused before it is sent: the server's error would abort atomic mode's
                # transaction, the view's writes with it.
                raise UnstorableResponse(
                    "PostgreSQL cannot store a NUL character, which the response's headers or "
                    "reason phrase hold"
                )
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
        """Outside a transaction (the heartbeat's renewals), without waiting for a lock another
        transaction holds on the record: `RecordLocked`, tried again at the next beat. A wait
        there would hold up the renewals of every other claim of the process, and one for a
        transaction of the work's own (a step saved inside it) would last as long as it."""
        held = self._own(claim).filter(status=Status.IN_PROGRESS.value)
        connection = self.connection
        with _reachable(connection), _not_waited_for(connection):
            if connection.in_atomic_block:
                # The caller's own transaction: it waits as its other statements do, and a
                # refusal would abort it on PostgreSQL.
                updated = held.update(lease_expires_at=until)
            else:
                assert claim.record_id is not None
                updated = self._update_unless_locked(held, claim.record_id, lease_expires_at=until)
        renewed = updated == 1
        if renewed:
            claim.lease_expires_at = until
        return renewed

    def save_steps(
        self, claim: Claim, steps: Mapping[str, bytes], until: datetime | None = None
    ) -> bool:
        held = self._own(claim).filter(status=Status.IN_PROGRESS.value)
        encoded = {name: base64.b64encode(value).decode() for name, value in steps.items()}
        values: dict[str, Any] = {"steps": encoded}
        if until is not None:
            values["lease_expires_at"] = until
        connection = self.connection
        with _reachable(connection):
            if until is not None and connection.in_atomic_block:
                self._answer_claims_at_once(connection, claim)
            saved = bool(held.update(**values) == 1)
        if saved and until is not None:
            claim.lease_expires_at = until
        return saved

    def _update_unless_locked(
        self, records: QuerySet[IdempotencyRecord], record_id: int, **values: Any
    ) -> int:
        """UPDATE `records` (the record `record_id`, or none) without waiting for a lock another
        transaction holds on it: the lock error instead. SQLite has no row locks: its whole
        database is locked by a writer, waited for up to the connection's timeout."""
        connection = self.connection
        dialect = dialect_for(connection)
        if isinstance(dialect, PostgreSQL):
            # PostgreSQL's UPDATE has no NOWAIT of its own; a locking subquery does.
            q, table = connection.ops.quote_name, dialect.table
            locked = f"SELECT {q('id')} FROM {table} WHERE {q('id')} = %s FOR UPDATE NOWAIT"
            records = records.filter(pk__in=RawSQL(locked, [record_id]))
        elif isinstance(dialect, MariaDB):
            update = cast(UpdateQuery, records.query.chain(UpdateQuery))
            update.add_update_values(values)
            sql, params = update.get_compiler(self.alias).as_sql()
            with statements.cursor(connection) as cursor:
                cursor.execute(dialect.no_wait + sql, params)
                return int(cursor.rowcount)
        return records.update(**values)

    @staticmethod
    def _answer_claims_at_once(connection: BaseDatabaseWrapper, claim: Claim) -> None:
        """Inside the caller's transaction, which keeps the record locked until it ends: on
        PostgreSQL, take the key's advisory locks as a claim's own transaction does, so that a
        claim of the key meanwhile answers in progress at once instead of queueing behind the
        row (its insert, or its take-over). Tried, never waited for: a claim holding them this
        instant queues as before, and no deadlock can form."""
        if connection.vendor != "postgresql":
            return
        assert claim.scope is not None and claim.fingerprint is not None
        locks = request_locks(claim.scope, claim.fingerprint, claim.method, claim.path)
        with statements.cursor(connection) as cursor:
            cursor.execute(
                "SELECT pg_try_advisory_xact_lock(%s), pg_try_advisory_xact_lock(%s)", locks
            )

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
        records = IdempotencyRecord.objects.using(self.alias).filter(purgeable(now))
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
        connection: BaseDatabaseWrapper, request: ClaimRequest, token: str, operation_id: str
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
            operation_id,
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


def _holds_a_nul(response: StoredResponse) -> bool:
    """Whether a NUL is in what PostgreSQL keeps as text or JSON, both of which refuse it."""
    texts = [response.reason, *(part for header in response.headers for part in header)]
    return any("\x00" in text for text in texts)


@contextlib.contextmanager
def _not_waited_for(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Turn a lock the statement did not wait for (or SQLite's writer lock it waited for in
    vain) into `RecordLocked`: the database is there, the record is busy."""
    try:
        yield
    except _UNREACHABLE as exc:
        if _is_busy(connection, exc) or lock_not_granted(exc):
            raise RecordLocked(
                f"The record is locked by another transaction, which was not waited for: {exc}"
            ) from exc
        raise


def _too_large(size: int) -> str:
    return (
        f"A response body of {size} bytes is larger than the database takes in one statement "
        "(MariaDB's max_allowed_packet): raise max_allowed_packet, or set "
        "IDEMPOTENCY_MAX_STORED_BYTES below it."
    )


# The database's time as POSIX seconds, whatever the session's time zone: clock_timestamp()
# moves on within a transaction (now() is the transaction's start); SQLite's is the machine's
# (to the millisecond), which every process writing to its file shares.
_CLOCK_SQL = {
    "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())",
    "mysql": "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) / 1000000",
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
}


_clocks: dict[str, StoreClock] = {}


def clock_for(alias: str) -> StoreClock:
    """The clock of the database behind `alias`, shared by the callers of this process that
    decide on it outside the store (the outbox's relay)."""
    clock = _clocks.get(alias)
    if clock is None:
        clock = _clocks.setdefault(alias, StoreClock(partial(_read_clock, alias)))
    return clock


def _read_clock(alias: str) -> float:
    """One reading of the clock of the database behind `alias`, in the calling thread's
    connection; `StoreUnavailable` if it cannot be read (the last reading then serves)."""
    connection = connections[alias]
    try:
        with _reachable(connection), connection.cursor() as cursor:
            cursor.execute(_CLOCK_SQL[connection.vendor])
            (seconds,) = cursor.fetchone()
    except DatabaseError as exc:  # Unreachable, or a transaction already aborted.
        raise StoreUnavailable(f"The database's clock could not be read: {exc}") from exc
    return float(seconds)


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
