"""The one purge of expired records and abandoned claims, behind the command and the task."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import InterfaceError, OperationalError
from django.db.models import Model, QuerySet

from django_idempotency import signals
from django_idempotency.conf import conf
from django_idempotency.exceptions import PurgeConflict
from django_idempotency.models import OutboxMessage
from django_idempotency.outbound.journal import stale_calls
from django_idempotency.outbox.messages import outbox_alias
from django_idempotency.stores import PurgeOptions, PurgeResult, StoreUnavailable, get_store
from django_idempotency.stores.dialects import lock_not_granted

logger = logging.getLogger("django_idempotency")


@dataclass(frozen=True)
class PurgeReport:
    """What one purge deleted (or, in a dry run, would delete), and how long it took."""

    expired: int  # Completed records past their expiry.
    abandoned: int  # In-progress claims past their expiry whose worker is gone (lease run out).
    total: int
    batches: int  # Zero in a dry run, which only counts.
    seconds: float
    dry_run: bool
    # Rows of the outbound calls' journal not updated for IDEMPOTENCY_TTL (only when no
    # namespace is given: journal rows belong to no namespace of records).
    outbound_calls: int = 0
    # Outbox messages sent more than IDEMPOTENCY_TTL ago (only when no namespace is given).
    outbox_messages: int = 0


def is_batch_size(value: object) -> bool:
    """A whole number of records, one or more (True is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def purge_expired_records(
    *,
    batch_size: int = 1000,
    namespace: str | None = None,
    dry_run: bool = False,
    progress: Callable[[PurgeResult], None] | None = None,
) -> PurgeReport:
    """Delete expired records and abandoned claims in batches of `batch_size`, one transaction
    each, so live claims never wait long; `progress` gets the running counts after each batch.
    """
    if not is_batch_size(batch_size):
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}.")
    started = time.perf_counter()
    done = PurgeResult()

    def note_progress(result: PurgeResult) -> None:
        nonlocal done
        done = result
        if progress is not None:
            progress(result)

    store = get_store()
    try:
        options = PurgeOptions(
            batch_size=batch_size, namespace=namespace, dry_run=dry_run, progress=note_progress
        )
        now = store.now()  # The store's clock, as every claim's: not this server's.
        result = store.purge(now, options)
        # The journal lives in the database whatever the store: purged with the records.
        journal = outbox = 0
        if namespace is None:
            journal = delete_in_batches(stale_calls(now, conf.TTL), batch_size, dry_run)
            outbox = delete_in_batches(sent_messages(now), batch_size, dry_run)
    except OperationalError as exc:
        if lock_not_granted(exc):
            raise conflict(exc, done) from exc
        raise unreachable(exc, done) from exc
    except (StoreUnavailable, InterfaceError) as exc:
        raise unreachable(exc, done) from exc
    report = PurgeReport(
        expired=result.expired,
        abandoned=result.abandoned,
        total=result.total,
        batches=result.batches,
        seconds=time.perf_counter() - started,
        dry_run=dry_run,
        outbound_calls=journal,
        outbox_messages=outbox,
    )
    logger.info(
        "%s %s (%d expired, %d abandoned)%s in %.2f s, %s of up to %d",
        "Would purge" if dry_run else "Purged",
        _count(report.total, "idempotency record"),
        report.expired,
        report.abandoned,
        "" if namespace is None else f" in namespace {namespace!r}",
        report.seconds,
        _count(report.batches, "batch", "batches"),
        batch_size,
    )
    for count, what in ((journal, "row of the outbound journal"), (outbox, "sent outbox message")):
        if count:
            logger.info("%s %s", "Would purge" if dry_run else "Purged", _count(count, what))
    # send_robust: a receiver that raises is logged by Django; the purge has happened anyway.
    signals.purged.send_robust(sender=PurgeReport, report=report, namespace=namespace)
    return report


def sent_messages(now: datetime) -> QuerySet[OutboxMessage]:
    """Outbox messages sent more than IDEMPOTENCY_TTL ago: a resumed operation writing its
    message again within its record's TTL still finds it sent."""
    return OutboxMessage.objects.using(outbox_alias()).filter(
        state=OutboxMessage.State.SENT, sent_at__lte=now - conf.TTL
    )


def delete_in_batches(rows: QuerySet[Model], batch_size: int, dry_run: bool) -> int:
    """Delete `rows` in batches, each its own statement; return how many went (or would)."""
    if dry_run:
        return rows.count()
    deleted = 0
    while True:
        batch = list(rows.order_by().values_list("pk", flat=True)[:batch_size])
        if not batch:
            return deleted
        count, _ = rows.model._default_manager.using(rows.db).filter(pk__in=batch).delete()
        deleted += count
        if len(batch) < batch_size:
            return deleted


def unreachable(exc: Exception, done: PurgeResult) -> StoreUnavailable:
    """The error for a purge cut short by a lost database: what happened, what went, what to do."""
    # Each batch commits on its own, so the batches before the loss stay purged.
    reason = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    so_far = f"{_count(done.total, 'record')} purged before it was lost. " if done.batches else ""
    return StoreUnavailable(
        f"The database holding idempotency records cannot be reached: {reason}. "
        f"{so_far}Retry the purge when the database is back."
    )


def conflict(exc: Exception, done: PurgeResult) -> PurgeConflict:
    """The error for a batch refused a row lock: not an outage, and the next run goes on."""
    # MariaDB's errors are (number, message): its message says it.
    said = exc.args[1] if len(exc.args) == 2 and isinstance(exc.args[0], int) else exc
    reason = " ".join(str(said).split()).rstrip(".") or type(exc).__name__
    so_far = f"{_count(done.total, 'record')} purged before it. " if done.batches else ""
    return PurgeConflict(
        f"A purge batch of idempotency records was refused a row lock and rolled back: "
        f"{reason}. {so_far}Run the purge again; if this repeats, look for a long transaction "
        "holding idempotency records."
    )


def _count(number: int, singular: str, plural: str | None = None) -> str:
    return f"{number:,} {singular if number == 1 else plural or singular + 's'}"
