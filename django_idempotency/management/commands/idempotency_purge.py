"""`manage.py idempotency_purge`: a thin wrapper over `purge_expired_records`."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_idempotency.purge import PurgeReport, is_batch_size, purge_expired_records
from django_idempotency.stores import PurgeResult, StoreUnavailable


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive whole number of records per batch (e.g. 1000), not {value!r}"
        )
    return number


class Command(BaseCommand):
    # A maintenance command run from cron: the system checks would query the database first
    # (Django 6 checks JSONField support on it) and answer a lost database with a traceback
    # instead of this command's own message. `manage.py check` runs them.
    requires_system_checks: list[str] = []

    help = (
        "Delete expired idempotency records (in-progress claims too, once their lease ran out), "
        "in short batches so live requests are not held up."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would be purged; delete nothing.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            metavar="N",
            help="Records deleted per batch, each batch its own short transaction (default 1000).",
        )
        parser.add_argument(
            "--namespace",
            metavar="NS",
            help="Purge only this namespace (default: every namespace).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        batch_size = options["batch_size"]
        # call_command(batch_size=...) bypasses argparse, so its `type` check too.
        if not is_batch_size(batch_size):
            raise CommandError(
                f"--batch-size must be a positive whole number (e.g. 1000), not {batch_size!r}."
            )
        verbosity = options["verbosity"]
        try:
            report = purge_expired_records(
                batch_size=batch_size,
                namespace=options["namespace"],
                dry_run=options["dry_run"],
                progress=self._show_progress if verbosity >= 2 else None,
            )
        except StoreUnavailable as exc:  # An outage, not a bug: one line and exit status 1.
            raise CommandError(str(exc)) from exc
        if verbosity >= 1:
            self.stdout.write(summary(report, options["namespace"]))

    def _show_progress(self, result: PurgeResult) -> None:
        self.stdout.write(
            f"Batch {result.batches:,}: {_records(result.total)} purged so far "
            f"({result.expired:,} expired, {result.abandoned:,} abandoned)."
        )


def summary(report: PurgeReport, namespace: str | None = None) -> str:
    """One line: "Purged 1,234 records (1,200 expired, 34 abandoned) in 0.52 s."."""
    where = "" if namespace is None else f" in namespace {namespace!r}"
    counts = (
        f"{_records(report.total)} ({report.expired:,} expired, {report.abandoned:,} abandoned)"
    )
    for count, one, many in (
        (report.outbound_calls, "outbound journal row", "outbound journal rows"),
        (report.outbox_messages, "sent outbox message", "sent outbox messages"),
    ):
        if count:
            counts += f" and {count:,} {one if count == 1 else many}"
    if report.dry_run:
        return f"Would purge {counts}{where}; dry run, nothing deleted ({report.seconds:.2f} s)."
    return f"Purged {counts}{where} in {report.seconds:.2f} s."


def _records(count: int) -> str:
    return f"{count:,} record" if count == 1 else f"{count:,} records"
