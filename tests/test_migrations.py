"""The shipped migrations match the models, with named constraints and indexes."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from django_idempotency.models import IdempotencyRecord


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
