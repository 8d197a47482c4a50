"""The database store's SQL in each backend's dialect: PostgreSQL, SQLite and MariaDB."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.core.outcomes import Scope
from django_idempotency.exceptions import StoreNotSupported
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores.base import ClaimRequest
from django_idempotency.stores.statements import RECORD_COLUMNS

# The columns a claim writes, in the order of the store's claim parameters.
INSERTED = (
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
    "operation_id",
)
_COMPLETED = ("status", "response_status", "response_reason", "response_headers", "response_body")
_SCOPE = ("namespace", "owner", "key")

# MariaDB's error numbers for a row lock the statement did not get: held by another transaction
# (with the claim's no-wait rule), or a deadlock InnoDB broke by rolling this transaction back.
MARIADB_LOCK_NOT_GRANTED = (1205, 1213)
MARIADB_DUPLICATE_KEY = 1062
# A statement larger than max_allowed_packet: the server refuses it and closes the connection.
MARIADB_PACKET_TOO_LARGE = 1153
# PostgreSQL's SQLSTATEs for the same: lock_not_available (lock_timeout), deadlock_detected.
_POSTGRESQL_LOCK_NOT_GRANTED = ("55P03", "40P01")


def lock_not_granted(exc: BaseException) -> bool:
    """Whether a database error is a row lock the statement did not get (a lock wait timeout or
    a deadlock), which is not a lost database."""
    code = exc.args[0] if exc.args else None
    if code in MARIADB_LOCK_NOT_GRANTED:
        return True
    cause = exc.__cause__  # Django's error wraps the driver's; psycopg 3, psycopg2.
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return state in _POSTGRESQL_LOCK_NOT_GRANTED


class Dialect:
    """The statements every backend shares, quoted by the backend's own rules."""

    vendor = ""
    # Put before a statement that must not queue behind another transaction's row lock.
    no_wait = ""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.quote = connection.ops.quote_name
        self.table = self.quote(IdempotencyRecord._meta.db_table)
        self.columns = ", ".join(self.quote(c) for c in RECORD_COLUMNS)
        self.inserted = ", ".join(self.quote(c) for c in INSERTED)
        self.scope = " AND ".join(f"{self.quote(c)} = %s" for c in _SCOPE)
        self.lookup = f"SELECT {self.columns} FROM {self.table} WHERE {self.scope}"
        completed = ", ".join(f"{self.quote(c)} = %s" for c in _COMPLETED)
        self.complete = (
            f"UPDATE {self.table} SET {completed}, {self.quote('completed_at')} = %s, "
            f"{self.quote('lease_expires_at')} = NULL "
            f"WHERE {self.quote('id')} = %s AND {self.quote('lease_token')} = %s"
        )
        self.claim = self.claim_sql()

    def claim_sql(self) -> str:
        raise NotImplementedError

    @property
    def locking_lookup(self) -> str:
        """The lookup, inside a claim: each statement sees the latest commit here."""
        return self.lookup

    def on_conflict_do_nothing(self) -> str:
        return f"ON CONFLICT ({', '.join(self.quote(c) for c in _SCOPE)}) DO NOTHING"


class PostgreSQL(Dialect):
    vendor = "postgresql"

    # Two transaction-scoped advisory locks, the request's identity first, then the key. A
    # duplicate of the same request fails the first: in progress (409). Another request with
    # the key takes the first and fails the second: a mismatch (422), told apart even while the
    # holder's claim is uncommitted and invisible (atomic mode). Parameters: the two lock ids.
    _LOCKS = (
        "WITH identity AS (SELECT pg_try_advisory_xact_lock(%s) AS free), "
        "lock AS (SELECT CASE WHEN free THEN pg_try_advisory_xact_lock(%s) ELSE FALSE END "
        "AS acquired, free FROM identity) "
    )

    def claim_sql(self) -> str:
        """The locks, then the insert if both were free: the new record's id, or no row.
        Parameters: the two lock ids, then the inserted values."""
        casts = {"response_headers": "::jsonb", "lease_expires_at": "::timestamptz"}
        casts |= {"created_at": "::timestamptz", "expires_at": "::timestamptz"}
        values = ", ".join(f"%s{casts.get(c, '')}" for c in INSERTED)
        return (
            f"{self._LOCKS}INSERT INTO {self.table} ({self.inserted}) "
            f"SELECT {values} FROM lock WHERE lock.acquired {self.on_conflict_do_nothing()} "
            f"RETURNING {self.quote('id')}"
        )

    @property
    def opening_claim(self) -> str:
        """The claim with the BEGIN of the transaction it opens, in one round trip."""
        return f"BEGIN; {self.claim}"

    @property
    def closing_complete(self) -> str:
        """The completion with the COMMIT of the transaction it ends, in one round trip."""
        return f"{self.complete}; COMMIT"

    @property
    def probe(self) -> str:
        """After a claim inserted nothing, in the same transaction: the record holding the key
        (or none) and whether the locks are free now, seen by a statement of its own, so past
        any commit that came between the claim's snapshot and its locks. The locks are taken
        again if they were ours (they are reentrant). Parameters: the lock ids, the scope."""
        q = self.quote
        found = ", ".join(f"found.{q(c)}" for c in RECORD_COLUMNS)
        scope = " AND ".join(f"found.{q(c)} = %s" for c in _SCOPE)
        return (
            f"{self._LOCKS}SELECT {found}, lock.acquired, lock.free "
            f"FROM lock LEFT JOIN {self.table} AS found ON {scope}"
        )


class SQLite(Dialect):
    vendor = "sqlite"

    def claim_sql(self) -> str:
        """The insert: the new record's id, or no row if the key is taken."""
        values = ", ".join("%s" for _ in INSERTED)
        return (
            f"INSERT INTO {self.table} ({self.inserted}) VALUES ({values}) "
            f"{self.on_conflict_do_nothing()} RETURNING {self.quote('id')}"
        )


class MariaDB(Dialect):
    """InnoDB queues a statement behind another transaction's row lock. A claim never does: an
    uncommitted claim of the same key (atomic mode) then answers 409 at once instead of holding
    the request until the other view ends, and a claim that never waits is never part of a
    deadlock. Its duplicate key is an error (1062), not a silent IGNORE, which would also turn
    a too-long value into a truncated one."""

    vendor = "mysql"
    no_wait = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR "

    def claim_sql(self) -> str:
        values = ", ".join("%s" for _ in INSERTED)
        return f"{self.no_wait}INSERT INTO {self.table} ({self.inserted}) VALUES ({values})"

    @property
    def locking_lookup(self) -> str:
        """The committed record, read past any snapshot the transaction already has (a plain
        read under REPEATABLE READ may predate it)."""
        return f"{self.no_wait}{self.lookup} LOCK IN SHARE MODE"

    # Before a purge batch's transaction: no gap locks, so claims inserting beside the rows it
    # locks never wait for it (REPEATABLE READ would lock the gaps between them too).
    read_committed = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

    def delete_locked(self, count: int) -> str:
        """Delete `count` rows this transaction has locked, by id (the parameters), each by a
        primary-key lookup. `WHERE id IN (…)` may be run as a scan of the table (the batch is
        most of a small one), which waits for every row another transaction holds."""
        ids = " UNION ALL ".join(["SELECT %s AS id", *["SELECT %s"] * (count - 1)])
        t, pk = self.table, self.quote("id")
        return f"DELETE {t} FROM ({ids}) AS batch STRAIGHT_JOIN {t} ON {t}.{pk} = batch.id"


def advisory_locks(request: ClaimRequest) -> list[int]:
    """PostgreSQL's two lock ids for a claim: the request's identity (scope, fingerprint,
    method, path), then its key (scope)."""
    return request_locks(request.scope, request.fingerprint, request.method, request.path)


def request_locks(scope: Scope, fingerprint: str, method: str, path: str) -> list[int]:
    """`advisory_locks` of the request with this scope, fingerprint, method and path."""
    key = (scope.namespace, scope.owner, scope.key)
    return [_lock_id(*key, fingerprint, method, path), _lock_id(*key)]


def _lock_id(*parts: str) -> int:
    """A signed 64-bit advisory lock id; collisions only cost a spurious 409."""
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


_DIALECTS: dict[str, type[Dialect]] = {d.vendor: d for d in (PostgreSQL, SQLite, MariaDB)}


def dialect_for(connection: BaseDatabaseWrapper) -> Dialect:
    """The connection's dialect; `StoreNotSupported` names a backend the store cannot run on."""
    vendor = connection.vendor
    if vendor == "mysql":
        connection.ensure_connection()
        mariadb = getattr(connection, "mysql_is_mariadb", False)
        version = getattr(connection, "mysql_version", (0,))
        if not mariadb:
            raise StoreNotSupported(
                f"The database store runs on MariaDB, not on MySQL {_dotted(version)} (database "
                f"{connection.alias!r}): its claims need MariaDB's per-statement lock timeout."
            )
        return _dialect(MariaDB, connection)
    if vendor not in _DIALECTS:
        raise StoreNotSupported(
            f"The database store supports PostgreSQL, MariaDB and SQLite, not {vendor} "
            f"(database {connection.alias!r}): point IDEMPOTENCY_DATABASE at one of those."
        )
    return _dialect(_DIALECTS[vendor], connection)


_BUILT: dict[type[Dialect], Dialect] = {}


def _dialect(dialect: type[Dialect], connection: BaseDatabaseWrapper) -> Dialect:
    """Built once per backend, at first use: the statements are plain strings."""
    if dialect not in _BUILT:
        _BUILT[dialect] = dialect(connection)
    return _BUILT[dialect]


def _dotted(version: Any) -> str:
    return ".".join(str(part) for part in version)
