"""`manage.py idempotency_recover`: call again the recover=True calls whose worker was lost."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_idempotency.exceptions import StoreUnavailable
from django_idempotency.management.commands.idempotency_purge import positive_int
from django_idempotency.recovery import BATCH_SIZE, recover_operations


class Command(BaseCommand):
    # Run from cron: the system checks would query the database before the command could say
    # it is down (`manage.py check` runs them).
    requires_system_checks: list[str] = []

    help = (
        "Call again, with their kept arguments, the calls of recover=True functions and tasks "
        "whose lease ended without their completing; each resumes after its stored steps."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=BATCH_SIZE,
            metavar="N",
            help=f"Calls looked at in this run (default {BATCH_SIZE}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = recover_operations(batch_size=options.get("batch_size", BATCH_SIZE))
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except (DatabaseError, StoreUnavailable) as exc:
            raise CommandError(f"The records' database could not be reached: {exc}") from exc
        self.stdout.write(
            f"Recovered {report.recovered} call(s); {report.retried} failed again (retried "
            f"later), {report.failed} given up, {report.waiting} still running, "
            f"{report.cleared} finished meanwhile."
        )
