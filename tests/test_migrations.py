"""The shipped migrations match the models, with named constraints and indexes."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_idempotency.models import IdempotencyRecord, OutboundCall


@pytest.mark.django_db
def test_makemigrations_finds_nothing_to_do() -> None:
    output = StringIO()
    call_command("makemigrations", "django_idempotency", "--check", "--dry-run", stdout=output)
    assert "No changes detected" in output.getvalue()


def test_constraints_and_indexes_are_named() -> None:
    meta = IdempotencyRecord._meta
    assert [c.name for c in meta.constraints] == ["idempotency_record_scope_key_uniq"]
    assert sorted(i.name for i in meta.indexes) == [
        "idempotency_expires_idx",
        "idempotency_in_progress_idx",
    ]


def test_every_field_explains_itself() -> None:
    for field in IdempotencyRecord._meta.get_fields():
        if field.name != "id":
            assert field.help_text, f"{field.name} has no help_text"


def _scope_collations() -> dict[str, str | None]:
    """The collation of each scope column (None where the database has no such notion)."""
    if connection.vendor != "mysql":
        return dict.fromkeys(("namespace", "owner", "key"))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
            " AND COLUMN_NAME IN ('namespace', 'owner', 'key')",
            [IdempotencyRecord._meta.db_table],
        )
        return dict(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_the_binary_scope_migration_can_be_reversed_and_applied_again() -> None:
    # On MariaDB, back to the database's own collation, which ignores case; elsewhere a no-op.
    applied = _scope_collations()
    call_command("migrate", "django_idempotency", "0002", verbosity=0)
    try:
        reversed_ = _scope_collations()
    finally:
        call_command("migrate", "django_idempotency", verbosity=0)

    assert _scope_collations() == applied
    if connection.vendor == "mysql":
        assert set(applied.values()) == {"utf8mb4_nopad_bin"}
        assert set(reversed_.values()) == {"utf8mb4_unicode_ci"}
    else:
        assert reversed_ == applied


def test_the_outbound_journals_constraint_index_and_fields_are_named_and_explained() -> None:
    meta = OutboundCall._meta
    assert [c.name for c in meta.constraints] == ["idempotency_outbound_key_uniq"]
    assert [i.name for i in meta.indexes] == ["idempotency_outbound_upd_idx"]
    for field in meta.get_fields():
        if field.name != "id":
            assert field.help_text, f"{field.name} has no help_text"


@pytest.mark.django_db
def test_outbound_keys_that_differ_in_case_or_trailing_spaces_are_two_rows() -> None:
    # MariaDB's default collation would make them one key (see 0006_outbound_calls).
    now = timezone.now()
    for key in ("abc", "ABC", "abc "):
        OutboundCall.objects.create(
            key=key,
            method="POST",
            target="https://bank.example/",
            host="bank.example",
            outcome="sending",
            created_at=now,
            updated_at=now,
        )

    assert sorted(OutboundCall.objects.values_list("key", flat=True)) == ["ABC", "abc", "abc "]
