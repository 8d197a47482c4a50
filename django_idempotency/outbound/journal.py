"""The journal of outbound calls: a row written before the first attempt, updated after each."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import Error, IntegrityError, connections, transaction
from django.db.models import Case, F, QuerySet, Value, When
from django.utils import timezone

from django_idempotency.core.keys import key_hash
from django_idempotency.core.outcomes import Scope
from django_idempotency.models import OutboundCall
from django_idempotency.stores.database import records_alias

logger = logging.getLogger("django_idempotency")

Outcome = OutboundCall.Outcome

# Said once per process: journal rows written inside the caller's transaction go with it.
_warned_in_transaction = False


def journal_alias() -> str:
    """The database of the journal: IDEMPOTENCY_DATABASE, as for the records, or the router's."""
    return records_alias(OutboundCall)


def open_call(
    key: str,
    *,
    method: str,
    target: str,
    host: str,
    step: str,
    scope: Scope | None,
    operation_id: str = "",
) -> None:
    """Before the first attempt: the call's row, new (`sending`), or a retried run's.

    A row an earlier run left is a fact about that run, which this one adds to and never
    erases: `confirmed` stays so; `sending` or `ambiguous` (that run may have sent it, and its
    answer is lost) becomes `ambiguous`, which this run's own failure cannot turn into `failed`;
    `failed` (definitely not done) becomes `sending` again.
    """
    fields = {
        "method": method,
        "target": target,
        "host": host[:255],
        "step": step,
        "namespace": scope.namespace if scope else "",
        "owner": scope.owner if scope else "",
        "operation_key": scope.key if scope else "",
        "operation_id": operation_id,
    }
    reopened = Case(
        When(outcome=Outcome.CONFIRMED, then=Value(Outcome.CONFIRMED)),
        When(outcome__in=(Outcome.SENDING, Outcome.AMBIGUOUS), then=Value(Outcome.AMBIGUOUS)),
        default=Value(Outcome.SENDING),
    )

    def write(alias: str) -> None:
        now = timezone.now()
        calls = OutboundCall.objects.using(alias)
        if calls.filter(key=key).update(**fields, outcome=reopened, updated_at=now):
            return
        try:
            with transaction.atomic(using=alias):
                calls.create(
                    key=key, **fields, outcome=Outcome.SENDING, created_at=now, updated_at=now
                )
        except IntegrityError:  # Another run of the same step wrote it in between.
            calls.filter(key=key).update(**fields, outcome=reopened, updated_at=now)

    _write(write, key)


def note_attempt(key: str, *, status: int | None, error: str, outcome: str, replayed: bool) -> None:
    """After an attempt: what came back, and the call's outcome so far, with what earlier runs
    recorded: a `confirmed` call stays confirmed, an `ambiguous` one is not made `failed`."""
    kept = Case(
        When(outcome=Outcome.CONFIRMED, then=Value(Outcome.CONFIRMED)),
        When(outcome=Outcome.AMBIGUOUS, then=Value(_over_ambiguous(outcome))),
        default=Value(outcome),
    )

    def write(alias: str) -> None:
        OutboundCall.objects.using(alias).filter(key=key).update(
            attempts=F("attempts") + 1,
            last_status=status,
            last_error=error[:255],
            outcome=kept,
            replayed=replayed,
            updated_at=timezone.now(),
        )

    _write(write, key)


def _over_ambiguous(outcome: str) -> str:
    """What a call an earlier run left `ambiguous` becomes: confirmed by an answer, else still
    ambiguous (this run failing, or still trying, says nothing of the earlier one)."""
    return outcome if outcome == Outcome.CONFIRMED else Outcome.AMBIGUOUS


def _write(write: Callable[[str], None], key: str) -> None:
    """Run a journal write; a failure is logged, never raised: the call goes on without it."""
    global _warned_in_transaction
    alias = journal_alias()
    connection = connections[alias]
    if connection.in_atomic_block and not _warned_in_transaction:
        _warned_in_transaction = True
        logger.warning(
            "An outbound call is journaled inside a transaction on database %r (atomic mode?): "
            "its journal row commits or rolls back with that transaction, so a rollback forgets "
            "that the call was sent, and in atomic mode the operation's record with it: a retry "
            "is then a new operation, whose calls send new keys. Make outbound calls from "
            'lease-mode views, functions and tasks (mode="lease").',
            alias,
        )
    try:
        # A savepoint inside the caller's transaction: a failed write must not abort it.
        with transaction.atomic(using=alias):
            write(alias)
    except Error as exc:
        logger.error(
            "The outbound journal could not record the call with key_hash=%s; the call goes "
            "on without it: %s",
            key_hash(key),
            exc,
        )
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()  # A lost server: reconnect next time.


def stale_calls(now: datetime, ttl: timedelta) -> QuerySet[OutboundCall]:
    """The journal's rows not updated for `ttl`, which the purge deletes."""
    return OutboundCall.objects.using(journal_alias()).filter(updated_at__lte=now - ttl)
