"""What runserver says as it starts about the records' database, as Django does of `default`."""

from __future__ import annotations

import functools
from typing import Any

from django.core.checks import CheckMessage
from django.db import DEFAULT_DB_ALIAS

from django_idempotency.checks.stores import check_database
from django_idempotency.schema import records_database

_WRAPPED = "_idempotency_records_database"


def records_database_warnings() -> list[CheckMessage]:
    """W006/W007 for the records' database when it is not `default`, whose unapplied migrations
    Django's own notice already names."""
    alias = records_database()
    if alias is None or alias == DEFAULT_DB_ALIAS:
        return []
    return check_database(databases=[alias])


def install() -> None:
    """Wrap `BaseCommand.check_migrations` once: runserver runs it as it starts (createsuperuser
    and changepassword before they run), and it looks at `default` only, so records kept on
    another database (IDEMPOTENCY_DATABASE, a router) missing a migration went unsaid."""
    from django.core.management.base import BaseCommand

    original = BaseCommand.check_migrations
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def check_migrations(self: BaseCommand, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for message in records_database_warnings():
            self.stdout.write(self.style.NOTICE(f"\n{message}"))

    setattr(check_migrations, _WRAPPED, True)
    BaseCommand.check_migrations = check_migrations  # type: ignore[method-assign]
