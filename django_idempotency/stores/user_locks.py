"""MariaDB's user locks of atomic-mode claims: taken with the claim, released on every path."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from weakref import WeakKeyDictionary

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from django_idempotency.stores.base import ClaimRequest
from django_idempotency.stores.dialects import MariaDB, dialect_for, user_locks


class UserLocks:
    """The user lock names each connection's open claims hold, per nested `released_at_exit`.

    MariaDB's `GET_LOCK` belongs to the session, not the transaction: a lock left behind on a
    persistent connection would answer every later claim of its key as in progress. So a
    claim takes its locks only inside `released_at_exit`, which releases them as the claim's
    transaction ends (before its commit or rollback), whatever ended it. Connections are per
    thread in Django: so is each entry here.
    """

    def __init__(self) -> None:
        self._held: WeakKeyDictionary[BaseDatabaseWrapper, list[list[str]]] = WeakKeyDictionary()

    @contextlib.contextmanager
    def released_at_exit(self, connection: BaseDatabaseWrapper) -> Iterator[None]:
        """Within: atomic-mode claims on `connection` may take user locks. At exit, inside the
        transaction still, whatever locks are left are released."""
        if connection.vendor != "mysql":
            yield
            return
        stack = self._held.setdefault(connection, [])
        stack.append([])
        try:
            yield
        finally:
            names = stack.pop()
            if not stack:
                self._held.pop(connection, None)
            if names:
                _release(connection, names)

    def take(self, connection: BaseDatabaseWrapper, request: ClaimRequest) -> list[str]:
        """The lock names an atomic-mode claim on `connection` takes (identity, key), noted as
        held before the claim runs (it may raise holding them); none outside `released_at_exit`
        or in lease mode, whose claim commits at once."""
        stack = self._held.get(connection)
        if not stack or request.lease is not None:
            return []
        stack[-1][:] = user_locks(request, str(connection.settings_dict["NAME"]))
        return stack[-1]

    def held(self, connection: BaseDatabaseWrapper) -> list[str]:
        stack = self._held.get(connection)
        return list(stack[-1]) if stack else []

    def released(self, connection: BaseDatabaseWrapper) -> None:
        """The completion released them (`MariaDB.releasing_complete`)."""
        stack = self._held.get(connection)
        if stack:
            stack[-1].clear()


def _release(connection: BaseDatabaseWrapper, names: list[str]) -> None:
    if connection.connection is None:
        return  # Closed: the session ended, and its locks with it.
    dialect = dialect_for(connection)
    assert isinstance(dialect, MariaDB)
    try:
        if connection.needs_rollback:
            # Django refuses statements in a transaction marked for rollback, yet the locks
            # must go before that rollback: until then the claim's row answers 409 instead.
            with connection.wrap_database_errors, connection.connection.cursor() as cursor:
                cursor.execute(dialect.release_locks, names)
        else:
            with connection.cursor() as cursor:
                cursor.execute(dialect.release_locks, names)
    except DatabaseError:
        # Never leave a lock on a connection that outlives the request: ending the session
        # releases them all.
        with contextlib.suppress(DatabaseError):
            connection.close()
