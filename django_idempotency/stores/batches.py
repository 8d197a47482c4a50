"""The database store's purge, one batch a statement where the backend allows it."""

from __future__ import annotations

from django.db import connections, transaction
from django.db.models import QuerySet

from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores.dialects import MariaDB, PostgreSQL, dialect_for


def delete_batch(
    alias: str, records: QuerySet[IdempotencyRecord], batch_size: int
) -> list[tuple[str, str, str, str]]:
    """Delete one batch of `records` in its own short transaction; (status, *scope) per row."""
    fields = ("status", "namespace", "owner", "key")
    connection = connections[alias]
    dialect = dialect_for(connection)
    if isinstance(dialect, PostgreSQL):
        # One statement a batch; SKIP LOCKED leaves rows a live claim is taking over alone.
        batch = records.values("pk")[:batch_size].select_for_update(skip_locked=True)
        q = dialect.quote
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            # Compiled for the records' database: sql_with_params() would compile it for the
            # default one, which refuses FOR UPDATE outside a transaction of its own.
            inner_sql, params = batch.query.get_compiler(alias).as_sql()
            # MATERIALIZED: as a plain IN (subquery) the planner may rescan the LIMIT
            # subquery once per row and delete far more than one batch.
            cursor.execute(
                f"WITH batch (batch_id) AS MATERIALIZED ({inner_sql}) "
                f"DELETE FROM {dialect.table} WHERE {q('id')} IN (SELECT batch_id FROM batch) "
                f"RETURNING {', '.join(q(f) for f in fields)}",
                params,
            )
            return [tuple(row) for row in cursor.fetchall()]
    chosen = records.values_list("pk", *fields)[:batch_size]
    if isinstance(dialect, MariaDB):
        # The batch's rows read and locked, skipping those another transaction holds (a claim
        # taking one over), then deleted by id. A plain DELETE … LIMIT would wait for such a
        # row holding the locks of the rows it has deleted, and claims of those keys would be
        # answered 409 until it gave up. SKIP LOCKED is MariaDB 10.6's; 10.5 waits.
        skip_locked = connection.features.has_select_for_update_skip_locked
        outer_transaction = connection.in_atomic_block
        with transaction.atomic(using=alias):
            if not outer_transaction:
                with connection.cursor() as cursor:
                    cursor.execute(dialect.read_committed)
            rows = list(chosen.select_for_update(skip_locked=skip_locked))
            if rows:
                with connection.cursor() as cursor:
                    cursor.execute(dialect.delete_locked(len(rows)), [row[0] for row in rows])
        return [row[1:] for row in rows]
    with transaction.atomic(using=alias):
        rows = list(chosen)
        IdempotencyRecord.objects.using(alias).filter(pk__in=[r[0] for r in rows]).delete()
    return [row[1:] for row in rows]
