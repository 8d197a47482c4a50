"""A transactional test's flush: content types and permissions back in two statements; on
PostgreSQL, DELETE rather than TRUNCATE."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management.commands import flush
from django.db import connections

# The rows post_migrate's handlers make, per database alias, as they made them the first time.
_Rows = tuple[list[dict[str, Any]], list[dict[str, Any]]]


@contextmanager
def snapshots_restored_after_flush() -> Iterator[None]:
    """Every transactional test ends with `flush`, which then sends post_migrate for every app:
    Django's handlers make the content types and permissions again, app by app, in about 90
    queries, more than most of these tests run themselves. The rows are the same each time, so
    the first flush of each database runs the handlers and keeps what they made, and each later
    one inserts those rows again, with their ids. (`migrate`, in the tests that run it, still
    sends the signal to the handlers.)"""
    emit = flush.emit_post_migrate_signal
    kept: dict[str, _Rows] = {}

    def restore_or_emit(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
        ContentType.objects.clear_cache()
        if db not in kept:
            emit(verbosity, interactive, db, **kwargs)
            kept[db] = (
                list(ContentType.objects.using(db).values()),
                list(Permission.objects.using(db).values()),
            )
            return
        content_types, permissions = kept[db]
        ContentType.objects.using(db).bulk_create(ContentType(**row) for row in content_types)
        Permission.objects.using(db).bulk_create(Permission(**row) for row in permissions)

    with mock.patch.object(flush, "emit_post_migrate_signal", restore_or_emit):
        yield


@contextmanager
def postgresql_flushes_by_delete() -> Iterator[None]:
    """PostgreSQL's flush is one TRUNCATE of every table, which gives each table, index and TOAST
    table a new file: about 90 ms a flush, four times what the rest of a typical transactional
    test costs there. DELETE empties the few rows a test wrote in a few milliseconds. Django's
    foreign keys on PostgreSQL are DEFERRABLE INITIALLY DEFERRED and the flush runs in one
    transaction, so the order of the tables does not matter. A flush that resets sequences
    (`reset_sequences=True`) still truncates: DELETE would leave them."""
    if connections["default"].vendor != "postgresql":
        yield
        return
    # Imported only here: it needs psycopg, which a run on another database may not have.
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: Any,
        style: Any,
        tables: list[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if reset_sequences:
            return truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
        return [f"DELETE FROM {self.quote_name(table)};" for table in tables]

    with mock.patch.object(DatabaseOperations, "sql_flush", sql_flush):
        yield
