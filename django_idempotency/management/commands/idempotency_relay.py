"""`manage.py idempotency_relay`: deliver the outbox's due messages, once or as a worker."""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import timedelta
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from django_idempotency.management.commands.idempotency_purge import positive_int
from django_idempotency.outbox import Relay, RelayReport
from django_idempotency.outbox.relay import BATCH_SIZE, LEASE


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0 < number < 86400:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {value!r}")
    return number


class Command(BaseCommand):
    # Run by a process manager: the system checks would query the database before the command
    # could say it is down (`manage.py check` runs them).
    requires_system_checks: list[str] = []

    help = (
        "Deliver the outbox's due messages (Celery task calls and HTTP requests written with "
        "django_idempotency.outbox), once, or with --loop as a long-running worker."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop",
            action="store_true",
            help="Keep relaying, looking again every --interval seconds, until SIGTERM or SIGINT.",
        )
        parser.add_argument(
            "--interval",
            type=seconds,
            default=1.0,
            metavar="SECONDS",
            help="With --loop: seconds between looks when nothing was due (default 1).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=BATCH_SIZE,
            metavar="N",
            help=f"Messages claimed per batch (default {BATCH_SIZE}).",
        )
        parser.add_argument(
            "--lease",
            type=seconds,
            default=LEASE.total_seconds(),
            metavar="SECONDS",
            help="How long a claimed message is held before another relay may take it over "
            f"(default {LEASE.total_seconds():.0f}); must cover one delivery.",
        )
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="The database whose outbox is relayed (default: the outbox's, the router's).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options.get("database")
        if alias is not None and alias not in connections:
            raise CommandError(f"No database is named {alias!r} in DATABASES.")
        relay = Relay(
            using=alias,
            batch_size=options.get("batch_size", BATCH_SIZE),
            lease=timedelta(seconds=options.get("lease", LEASE.total_seconds())),
        )
        try:
            if options.get("loop"):
                self._loop(relay, options.get("interval", 1.0))
            else:
                self._say(self._run(relay))
        finally:
            relay.close()

    def _run(self, relay: Relay) -> RelayReport:
        try:
            return relay.run()
        except DatabaseError as exc:
            raise CommandError(f"The outbox's database could not be reached: {exc}") from exc

    def _loop(self, relay: Relay, interval: float) -> None:
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # The message being sent is finished and marked, the rest of its batch handed back.
            stop.set()
            relay.stop()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not stop.is_set():
                try:
                    batch = relay.run_batch()
                except DatabaseError as exc:
                    self.stderr.write(f"The outbox's database could not be reached: {exc}")
                    connections[relay.alias].close()
                    stop.wait(interval)
                    continue
                if batch.handled:
                    self._say(batch)
                else:
                    stop.wait(interval)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _say(self, report: RelayReport) -> None:
        self.stdout.write(
            f"Relayed {report.handled} message(s): {report.sent} sent, {report.retried} to "
            f"retry, {report.dead} dead, {report.lost} taken over by another relay."
        )
