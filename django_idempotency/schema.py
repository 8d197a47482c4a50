"""Whether the records table exists: a forgotten `migrate` is named, not hidden behind a 503."""

from __future__ import annotations

from django.db import DatabaseError, connections

from django_idempotency.conf import conf, load_callable
from django_idempotency.models import IdempotencyRecord
from django_idempotency.stores.database import DatabaseStore, records_alias

MIGRATE_HINT = "run `python manage.py migrate django_idempotency`"


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


def missing_table_message(alias: str) -> str:
    return (
        f"The table {IdempotencyRecord._meta.db_table} does not exist in the database"
        f" {alias!r}: {MIGRATE_HINT}" + ("" if alias == "default" else f" --database {alias}") + "."
    )
