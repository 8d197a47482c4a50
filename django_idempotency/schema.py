"""Whether the records table exists and is migrated: a forgotten `migrate` is named, not hidden."""

from __future__ import annotations

from django.db import DatabaseError, connections

from django_idempotency.conf import conf, load_callable
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores.database import DatabaseStore, records_alias

MIGRATE_COMMAND = "python manage.py migrate django_idempotency"


def records_database() -> str | None:
    """The alias of the database holding the records; None when another store keeps them."""
    try:
        store_class = load_callable(conf.STORE, "IDEMPOTENCY_STORE")
        if not (isinstance(store_class, type) and issubclass(store_class, DatabaseStore)):
            return None
        return records_alias()
    except Exception:  # A store or router that fails: the checks that own it say why.
        return None


def missing_table(alias: str) -> bool:
    """True only when the database answers and has no records table."""
    try:
        tables = connections[alias].introspection.table_names()
    except DatabaseError:  # Unreachable, or a transaction the failure aborted: not known.
        return False
    return IdempotencyRecord._meta.db_table not in tables


def unapplied_migrations(alias: str) -> list[str]:
    """This app's migrations not yet applied to the database (empty when it cannot be read)."""
    # Imported here: the migration loader reads every app's migrations, which `check` alone
    # never needs.
    from django.db.migrations.executor import MigrationExecutor

    label = IdempotencyRecord._meta.app_label
    try:
        executor = MigrationExecutor(connections[alias])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes(label))
    except DatabaseError:  # Unreachable: the checks that own it say why.
        return []
    return [migration.name for migration, _ in plan if migration.app_label == label]


def missing_table_message(alias: str) -> str:
    return (
        f"The table {IdempotencyRecord._meta.db_table} does not exist in the database"
        f" {alias!r}: {migrate_hint(alias)}."
    )


def migrate_hint(alias: str) -> str:
    """What to run: `migrate` for this app, on the records' database."""
    database = "" if alias == "default" else f" --database {alias}"
    return f"run `{MIGRATE_COMMAND}{database}`"  # The whole command quoted, to copy as it is.
